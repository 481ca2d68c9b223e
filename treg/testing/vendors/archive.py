"""A fake people-search vendor, its provider rows and a third-party-style classifier plugin file, for the
archive's tests (tests/test_archive*.py); ``people_app``, a treg serving them."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from treg.testing.providers import ProviderPlugin
from treg.testing.upstreams import RawUpstream, http_response

PLATFORM_KEY = "pk-people-0123456789abcdef"
PRICE = 2000

#: the classifier plugin as a third party would ship it: a file in TREG_PLUGINS_DIR, no core edit
CLASSIFIER_PLUGIN = '''
from treg import hookimpl


@hookimpl
def treg_register_result_classifiers():
    emails = "data.emails"
    return [
        {"endpoint": "people.find", "hit": {"path": emails, "nonempty": True},
         "miss": {"path": emails, "empty": True}},
        {"endpoint": "people.find_repeat", "hit": {"path": emails, "nonempty": True}},
        {"endpoint": "people.find_free", "hit": {"path": emails, "nonempty": True}},
        {"endpoint": "people.admit", "hit": {"path": emails, "nonempty": True},
         "miss": {"path": emails, "empty": True}, "admit_misses": True},
        {"endpoint": "people.classified", "hit": {"path": emails, "nonempty": True},
         "miss": {"path": emails, "empty": True}},
    ]
'''


def write_classifier_plugin(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "people_classifier.py"
    path.write_text(CLASSIFIER_PLUGIN)
    return folder


def _ep(eid: str, path: str, archive: dict[str, Any] | None, **over: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"id": eid, "method": "GET", "path": path,
                           "params": [{"name": "q", "in": "query"}], "price": {"per_call_micro": PRICE}}
    if archive is not None:
        row["archive"] = archive
    row.update(over)
    return row


def people_provider(base_url: str, ttl_s: int = 3600) -> dict[str, Any]:
    """The ``people`` provider: its key goes in the query (``api_key``), so a key made from the sent URL
    would hold it."""
    return {
        "id": "people", "base_url": base_url,
        "auth": [{"location": "query", "name": "api_key"}],
        "endpoints": [
            _ep("people.find", "/find", {"ttl_s": ttl_s}),
            _ep("people.find_repeat", "/find", {"ttl_s": ttl_s, "cache_price": "repeat", "repeat_price_micro": 500}),
            _ep("people.find_free", "/find", {"ttl_s": ttl_s, "cache_price": "free"}),
            _ep("people.public", "/find", {"ttl_s": ttl_s, "scope": "global"}),
            _ep("people.admit", "/find", {"ttl_s": ttl_s}),
            _ep("people.classified", "/find", None),
            _ep("people.plain", "/find", None),
            {"id": "people.lookup", "method": "POST", "path": "/lookup", "params": [],
             "price": {"per_call_micro": PRICE}, "archive": {"ttl_s": ttl_s}},
        ],
    }


def people_app(make_app: Any, up: RawUpstream, plugins_dir: Path, *plugins: Any, **settings: Any) -> Any:
    """A treg app (from the ``make_app`` fixture) serving the ``people`` provider on ``up``, with the
    classifier plugin file written to ``plugins_dir`` and ``plugins`` beside it, relaying to 127.0.0.0/8."""
    return make_app(extra_plugins=(ProviderPlugin([people_provider(up.url + "/v1")]), *plugins),
                    plugins_dir=write_classifier_plugin(plugins_dir), ssrf_allow=("127.0.0.0/8",), **settings)


class PeopleVendor:
    """The vendor's answers by ``q``: emails found (a counter ``n`` in the body, so a refreshed answer
    differs), ``nobody`` an explicit empty list, ``weird`` no emails field (unknown), ``text`` not JSON,
    ``big`` a long answer, ``gzip`` a gzip-encoded one; ``delay_s`` before every answer."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.hits: Counter[str] = Counter()
        self.n = 0

    async def __call__(self, ex: Any) -> bytes:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        url = urlsplit(ex.target)
        query = dict(parse_qsl(url.query))
        q = query.get("q", "")
        self.hits[q] += 1
        self.n += 1
        json_ct = [("Content-Type", "application/json")]
        if q == "nobody":
            return http_response(200, b'{"data": {"emails": []}}', json_ct)
        if q == "weird":
            return http_response(200, b'{"data": {"status": "pending"}}', json_ct)
        if q == "text":
            return http_response(200, b"found: a@b.c", [("Content-Type", "text/plain")])
        if q == "big":
            body = json.dumps({"data": {"emails": ["x@y.z"] * 200}}).encode()
            return http_response(200, body, json_ct)
        if q == "gzip":
            import gzip
            return http_response(200, gzip.compress(b'{"data": {"emails": ["g@z.ip"]}}'),
                                 json_ct + [("Content-Encoding", "gzip")])
        if q == "chunked":
            body = b'{"data": {"emails": ["c@h.unk"]}}'
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            return head + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:10], body[10:])) + b"0\r\n\r\n"
        if q == "fail":
            return http_response(503, b'{"error": "down"}', json_ct)
        body = json.dumps({"data": {"emails": [f"{q}@example.com"]}, "n": self.n, "body": ex.body.decode()}).encode()
        return http_response(200, body, json_ct + [("X-Vendor", "people")])
