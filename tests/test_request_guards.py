"""Request guards on treg's own key (sharing.md "Request guards on treg's own key"): validated with the
other row fields at startup; on the platform tier a value out of range or not an integer is refused 400
``invalid_parameters`` before anything is spent (no hold row, no vendor connection), a missing one with a
default is sent with it (the exact bytes checked on a raw recorder upstream), and own and team calls are
neither guarded nor defaulted. Shown in the catalog listing and MCP's catalog search."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from treg.catalog.errors import InvalidParameters
from treg.catalog.guards import Guard, apply
from treg.infra.schema import holds
from treg.testing import Mcp, catalog_problems, check_books, endpoint_row
from treg.testing.vendors.rules import PRICES, scrape_gateway

LIMIT = Guard("limit", "query", min=1, max=100, default=25)
PAGE = Guard("page_size", "body", min=1, max=50, default=10)


# -- the row, at startup ------------------------------------------------------------------------------

def _guard(**over):
    return {"param": "limit", "in": "query", "type": "integer", "min": 1, "max": 100, **over}


@pytest.mark.parametrize("guards, field", [
    ({"param": "limit"}, "guards"),
    ([], "guards"),
    (["limit"], "guards[0]"),
    ([_guard(type="number")], "guards[0].type"),
    ([{"param": "limit", "in": "query", "min": 1}], "guards[0].type"),
    ([_guard(**{"in": "header"})], "guards[0].in"),
    ([_guard(param="")], "guards[0].param"),
    ([_guard(min=1.5)], "guards[0].min"),
    ([_guard(max=True)], "guards[0].max"),
    ([_guard(min=10, max=5)], "guards[0].min"),
    ([_guard(default=500)], "guards[0].default"),
    ([{"param": "limit", "in": "query", "type": "integer"}], "guards[0]"),
    ([_guard(), _guard()], "guards[1].param"),
    ([_guard(**{"in": "body"})], "guards[0].in"),  # a GET has no body
    ([_guard(param="item_id")], "guards[0].param"),  # a path slot
    ([_guard(param="fields")], "guards[0].param"),  # declared with an enum
    ([_guard(extra=1)], "guards[0].extra"),
])
def test_a_bad_guard_stops_startup_naming_plugin_row_and_field(guards, field):
    problems = catalog_problems(lambda d: endpoint_row(d).update(guards=guards))
    assert [(p.plugin, p.row, p.field) for p in problems] == [("acme-plugin", "endpoint 'acme.items.get'", field)]


def test_guards_must_agree_with_the_strict_modes():
    def strict(d):
        endpoint_row(d).update(strict_query=True, guards=[_guard(param="page")])
    assert [p.field for p in catalog_problems(strict)] == ["guards[0].param"]

    def allowlist(d):
        endpoint_row(d, 1).update(body_allowlist=True, guards=[_guard(param="size", **{"in": "body"})])
    assert [p.field for p in catalog_problems(allowlist)] == ["guards[0].param"]

    def blocked(d):
        endpoint_row(d).update(platform_blocked=True, guards=[_guard()])
    assert [p.field for p in catalog_problems(blocked)] == ["guards"]


# -- the check, pure ------------------------------------------------------------------------------------

def _refused(query=(), body=None, obj=None, guards=(LIMIT,)):
    with pytest.raises(InvalidParameters) as exc:
        apply(guards, list(query), body, obj)
    return exc.value


@pytest.mark.parametrize("value", ["10000", "0", "-1", "-0", "101", "+5", "5.0", "1e3", "%2B5", " 5", "5 ",
                                   "0x10", "", "٥", "1" + "0" * 5000, "%35%30%30"])
def test_a_query_value_out_of_range_or_not_an_integer_is_refused(value):
    exc = _refused([("q", "x"), ("limit", value)])
    body = exc.body()
    assert exc.status == 400 and body["error"] == "invalid_parameters"
    assert body["param"] == "limit" and body["min"] == 1 and body["max"] == 100


@pytest.mark.parametrize("query", [[("limit", "5"), ("limit", "5")], [("limit", "5"), ("lim%69t", "5")],
                                   [("limit", "5"), ("limit", None)], [("limit", None)]])
def test_a_query_parameter_given_twice_or_bare_is_refused(query):
    assert _refused(query).body()["param"] == "limit"


@pytest.mark.parametrize("value, sent", [("5", None), ("0005", None), ("100", None), ("%35", None)])
def test_values_in_range_pass_untouched(value, sent):
    assert apply((LIMIT,), [("limit", value)], None, None).query == ()


def test_a_missing_one_gets_its_default():
    out = apply((LIMIT, Guard("offset", "query", max=9)), [("q", "x")], None, None)
    assert out.query == (("limit", "25"),) and out.body is None
    assert apply((Guard("page[size]", "query", default=3),), [], None, None).query == (("page%5Bsize%5D", "3"),)
    only_bounds = Guard("offset", "query", min=0)
    assert apply((only_bounds,), [], None, None).query == ()


@pytest.mark.parametrize("value", [51, 0, 5.0, "5", True, None, [5], {"n": 5}])
def test_a_body_value_out_of_range_or_not_a_json_integer_is_refused(value):
    exc = _refused(body=json.dumps({"page_size": value}).encode(), obj={"page_size": value}, guards=(PAGE,))
    assert exc.body()["param"] == "page_size" and exc.body()["max"] == 50


@pytest.mark.parametrize("body, sent", [
    (None, b'{"page_size":10}'),
    (b"", b'{"page_size":10}'),
    (b"  \r\n", b'{"page_size":10}'),
    (b"{}", b'{"page_size":10}'),
    (b'{ }\n', b'{ "page_size":10}\n'),
    (b'{"q": "\\u00e9t\\u00e9", "n": 1.0}', b'{"q": "\\u00e9t\\u00e9", "n": 1.0,"page_size":10}'),
    (b'\xef\xbb\xbf{"a": {"b": [1]}}  ', b'\xef\xbb\xbf{"a": {"b": [1]},"page_size":10}  '),
])
def test_a_body_default_is_spliced_in_keeping_the_callers_bytes(body, sent):
    obj = json.loads(body.decode("utf-8-sig")) if body and body.strip() else {}
    out = apply((PAGE,), [], body, obj)
    assert out.body == sent and out.body_fields == {"page_size": 10}
    assert out.body_created == (not body or not body.strip())
    assert json.loads(out.body.decode("utf-8-sig")) == {**obj, "page_size": 10}


def test_a_utf16_body_that_needs_a_default_is_refused_not_broken():
    body = '{"a": 1}'.encode("utf-16")
    assert _refused(body=body, obj={"a": 1}, guards=(PAGE,)).code == "invalid_parameters"


# -- over real sockets ----------------------------------------------------------------------------------

@pytest.fixture
async def scrape(aiohttp_client, make_app):
    async with scrape_gateway(aiohttp_client, make_app) as world:
        yield world


async def _holds(gw) -> list[dict]:
    async with gw.services.db.tx() as tx:
        return await tx.fetch_all(select(holds).where(holds.c.org_id == gw.org["org_id"]))


async def test_ten_thousand_records_on_treg_key_are_refused_before_anything_is_spent(scrape):
    gw, _, up = scrape
    r = await gw.call("GET", "/catalog/call/scrape.search?q=cats&limit=10000")
    body = await r.json()
    assert r.status == 400 and r.headers["X-Treg-Error"] == "1"
    assert body["error"] == "invalid_parameters" and body["blame"] == "caller"
    assert (body["param"], body["min"], body["max"]) == ("limit", 1, 100)
    assert "10000" in body["detail"]
    assert up.connections == 0 and up.exchanges == []  # the vendor never heard of it
    assert await _holds(gw) == []  # no hold was ever placed
    assert (await check_books(gw.services, gw.org["org_id"]))["settled"] == 0
    r = await gw.call("GET", "/catalog/call/scrape.search?q=cats&limit=10&limit=10000")
    assert r.status == 400 and (await r.json())["param"] == "limit"
    r = await gw.call("GET", "/catalog/call/scrape.search?q=cats&offset=1001")
    body = await r.json()
    assert r.status == 400 and (body["param"], body["min"], body["max"]) == ("offset", 0, 1000)
    r = await gw.call("POST", "/catalog/call/scrape.bulk", json={"page_size": 10_000})
    assert r.status == 400 and (await r.json())["param"] == "page_size"
    r = await gw.call("POST", "/catalog/call/scrape.bulk", json={"pages": 4})
    body = await r.json()
    assert r.status == 400 and (body["param"], body["min"], body["max"]) == ("pages", None, 3)
    assert up.connections == 0 and await _holds(gw) == []
    rows = await gw.wait_calls(5)
    assert {c["refused_by"] for c in rows} == {"catalog"} and {c["cost_micro"] for c in rows} == {0}


async def test_the_default_is_sent_in_the_query(scrape):
    gw, _, up = scrape
    r = await gw.call("GET", "/catalog/call/scrape.search?q=cats")
    assert r.status == 200 and r.headers["X-Treg-Cost-Micro"] == str(PRICES["scrape.search"])
    assert up.last.target == "/v1/search?q=cats&limit=25"
    await gw.call("GET", "/catalog/call/scrape.search?q=cats&limit=7")
    assert up.last.target == "/v1/search?q=cats&limit=7"
    await gw.call("GET", "/catalog/call/scrape.search")
    assert up.last.target == "/v1/search?limit=25"


async def test_the_default_is_sent_in_the_body_with_its_length_and_type(scrape):
    gw, _, up = scrape
    reply = await gw.raw("POST", "/catalog/call/scrape.bulk")  # no body at all
    assert reply.status == 200, reply.body
    sent = up.last
    assert sent.body == b'{"page_size":10}'
    assert sent.header("Content-Type") == "application/json" and sent.header("Content-Length") == "16"
    # the caller's body: its bytes kept, the field added, the length recomputed
    caller = b'{"query":  "caf\\u00e9", "deep": {"x": [1, 2.50]}}'
    reply = await gw.raw("POST", "/catalog/call/scrape.bulk", [("Content-Type", "application/json; charset=utf-8")],
                         caller)
    assert reply.status == 200
    assert up.last.body == caller[:-1] + b',"page_size":10}'
    assert up.last.header("Content-Length") == str(len(caller) + len(',"page_size":10'))
    assert up.last.header("Content-Type") == "application/json; charset=utf-8"
    # chunked: read whole, sent with a length
    reply = await gw.raw("POST", "/catalog/call/scrape.bulk",
                         [("Content-Type", "application/json"), ("Transfer-Encoding", "chunked")],
                         chunks=[b'{"pages"', b': 2}'])
    assert reply.status == 200
    assert up.last.body == b'{"pages": 2,"page_size":10}' and up.last.header("Transfer-Encoding") is None
    # a value given is sent as given
    await gw.call("POST", "/catalog/call/scrape.bulk", json={"page_size": 50})
    assert json.loads(up.last.body) == {"page_size": 50}
    books = await check_books(gw.services, gw.org["org_id"])
    assert books["settled"] == 4 * PRICES["scrape.bulk"]


async def test_the_idempotency_digest_reads_the_request_as_sent(scrape):
    gw, _, up = scrape
    first = await gw.call("GET", "/catalog/call/scrape.search?q=a", headers={"Idempotency-Key": "k"})
    assert first.status == 200
    # naming the default is the same request as leaving it out: the stored answer, not charged again
    again = await gw.call("GET", "/catalog/call/scrape.search?q=a&limit=25", headers={"Idempotency-Key": "k"})
    assert again.headers["X-Treg-Idempotent-Replay"] == "true" and len(up.exchanges) == 1
    other = await gw.call("GET", "/catalog/call/scrape.search?q=a&limit=26", headers={"Idempotency-Key": "k"})
    assert other.status == 422 and (await other.json())["error"] == "idempotency_mismatch"


async def test_own_and_team_calls_are_neither_guarded_nor_defaulted(scrape):
    gw, _, up = scrape
    await gw.secret("team-key", provider="scrape")
    r = await gw.call("GET", "/catalog/call/scrape.search?q=cats&limit=10000")
    assert r.status == 200 and r.headers["X-Treg-Credential-Tier"] == "team"
    assert up.last.target == "/v1/search?q=cats&limit=10000" and up.last.header("X-Key") == "team-key"
    await gw.call("GET", "/catalog/call/scrape.search?q=cats")
    assert up.last.target == "/v1/search?q=cats"  # no default on the team's own account
    reply = await gw.raw("POST", "/catalog/call/scrape.bulk")
    assert reply.status == 200 and up.last.body == b"" and up.last.header("Content-Type") is None
    await gw.call("POST", "/catalog/call/scrape.bulk", json={"page_size": 10_000})
    assert json.loads(up.last.body) == {"page_size": 10_000}
    # own tier: a tool bound to a scrape secret
    sid = await gw.secret("own-key", name="mine", provider="scrape")
    await gw.tool("mine", up.url + "/v1", [{"location": "header", "name": "X-Key", "secret_id": sid}])
    r = await gw.call("GET", "/catalog/call/scrape.search?q=cats&limit=10000")
    assert r.headers["X-Treg-Credential-Tier"] == "own" and up.last.target == "/v1/search?q=cats&limit=10000"
    assert await _holds(gw) == []


async def test_guards_are_shown_in_the_listing_and_in_mcp_search(scrape):
    gw, _, _ = scrape
    expected = [{"param": "limit", "in": "query", "type": "integer", "min": 1, "max": 100, "default": 25},
                {"param": "offset", "in": "query", "type": "integer", "min": 0, "max": 1000}]
    listed = await gw.api("GET", "/api/v1/catalog/endpoints?provider=scrape", expect=200)
    by_id = {e["id"]: e for e in listed["endpoints"]}
    assert by_id["scrape.search"]["guards"] == expected and by_id["scrape.plain"]["guards"] == []
    detail = await gw.api("GET", "/api/v1/catalog/endpoints/scrape.bulk", expect=200)
    assert detail["guards"][0] == {"param": "page_size", "in": "body", "type": "integer", "min": 1, "max": 50,
                                   "default": 10}
    found = (await Mcp(gw).call("catalog_search", {"query": "scrape search"}))["structuredContent"]["endpoints"]
    assert {e["id"]: e for e in found}["scrape.search"]["guards"] == expected
