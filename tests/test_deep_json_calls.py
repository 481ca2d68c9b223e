"""JSON nested deeper than Python's parser recurses, wherever treg reads it, over real HTTP hops: never a
500, and the money as for any answer treg cannot read (treg/json_text.py).

Before it, a platform-tier vendor's valid 2xx nested 50 000 deep ended the call in a 500 (the usage read
raised ``RecursionError``), and a ``/table/`` cell nested 600 deep was written after the hold was
settled: the caller was charged and answered 500."""

from __future__ import annotations

import json
import re

import aiohttp
import pytest

from treg import json_text, money
from treg.capacity.classify import _Answer
from treg.jsonpath import MISSING
from treg.mcp import tools as mcp_tools
from treg.mcp.results import Answer, answer_result
from treg.oauth.token_client import TokenEndpointDown, _parse as token_answer
from treg.overflow.http import NOT_JSON, exchange
from treg.settings import SecretStr
from treg.testing import answering_acme, audit_row, check_books, hold_row, http_response, login, raw_upstream
from treg.testing.vendors.tables import PRICE, crm_gateway

DEEP = 50_000
CREDITS = 1_000_000
JSON_TYPE = [("Content-Type", "application/json")]


def deep_array(n: int, inner: bytes = b"1") -> bytes:
    return b"[" * n + inner + b"]" * n


@pytest.fixture
async def acme(aiohttp_client, make_app):
    """(gateway, upstream, answers): ``acme`` on treg's platform key; the upstream answers ``answers["reply"]``."""
    async with answering_acme(aiohttp_client, make_app, credits=CREDITS) as world:
        yield world


# -- an upstream's answer ----------------------------------------------------------------------------------

@pytest.mark.parametrize("body", [b'{"usage":' + deep_array(DEEP) + b"}", b"{" + b'"a":{' * DEEP + b"}" * DEEP + b"}"])
async def test_a_usage_priced_answer_nested_too_deeply_is_relayed_and_settles_at_the_estimate(acme, hold_closes, body):
    gw, up, answers = acme
    answers["reply"] = http_response(200, b"this is not JSON", JSON_TYPE)
    plain = await gw.raw("POST", "/catalog/call/acme.chat", JSON_TYPE, b"{}")
    assert plain.status == 200
    answers["reply"] = http_response(200, body, JSON_TYPE)
    r = await gw.raw("POST", "/catalog/call/acme.chat", JSON_TYPE, b"{}")
    assert r.status == 200, r.body[:300]
    assert r.body == body  # the vendor's bytes, as sent
    # no usage evidence: the estimate, as for an answer that is not JSON at all (docs/money.md)
    assert r.header("X-Treg-Cost-Micro") == plain.header("X-Treg-Cost-Micro") == "9000"
    call_id = r.header("X-Treg-Call-Id")
    assert await hold_row(gw.services, call_id) == {"state": "settled", "settled_micro": 9000}
    assert hold_closes.count(("settle", call_id)) == 1
    row = await audit_row(gw, call_id)
    assert row["outcome"] == "ok" and row["status"] == 200 and row["cost_micro"] == 9000
    assert (await money.balance(gw.services, gw.org["org_id"])).balance_micro == CREDITS - 2 * 9000
    await check_books(gw.services, gw.org["org_id"])


async def test_a_flat_priced_answer_nested_too_deeply_is_relayed_and_charged_its_price(acme, hold_closes):
    gw, up, answers = acme
    answers["reply"] = http_response(200, deep_array(DEEP), JSON_TYPE)
    r = await gw.raw("GET", "/catalog/call/acme.items.get?item_id=7", [], b"")
    assert r.status == 200 and r.body == deep_array(DEEP)
    assert r.header("X-Treg-Cost-Micro") == "2000"
    assert hold_closes == [("settle", r.header("X-Treg-Call-Id"))]
    await check_books(gw.services, gw.org["org_id"])


@pytest.mark.parametrize("status", [429, 503])
async def test_a_failed_answer_nested_too_deeply_is_relayed_and_charged_nothing(acme, hold_closes, status):
    gw, up, answers = acme
    body = b'{"error":' + deep_array(2_000) + b"}"  # whole within the classifier's head
    answers["reply"] = http_response(status, body, JSON_TYPE)
    r = await gw.raw("GET", "/catalog/call/acme.items.get?item_id=7", [], b"")
    assert r.status == status and r.body == body
    assert r.header("X-Treg-Cost-Micro") == "0"
    assert hold_closes == [("release", r.header("X-Treg-Call-Id"))]
    await check_books(gw.services, gw.org["org_id"])


def test_the_capacity_classifier_reads_no_json_from_a_head_nested_too_deeply():
    assert _Answer(503, {}, deep_array(5_000)).json is MISSING
    assert _Answer(503, {}, b'{"error": {"code": "busy"}}').json == {"error": {"code": "busy"}}


# -- /table/ --------------------------------------------------------------------------------------------

@pytest.fixture
async def crm(aiohttp_client, make_app):
    async with crm_gateway(aiohttp_client, make_app) as (gw, vendor, _):
        vendor.broken_status = 200
        yield gw, vendor


@pytest.mark.parametrize("depth", [600, 900])
async def test_a_table_cell_nested_deeply_is_written_as_its_json_and_charged(crm, hold_closes, depth):
    gw, vendor = crm
    cell = deep_array(depth)
    vendor.broken_body = b'{"data":{"items":[{"id":1,"deep":' + cell + b"}]}}"
    r = await gw.call("GET", "/table/crm.broken")
    raw = await r.read()
    assert r.status == 200, raw[:300]
    assert json.loads(raw) == {"columns": ["id", "deep"], "rows": [[1, json.loads(cell)]], "truncated": False}
    assert r.headers["X-Treg-Cost-Micro"] == str(PRICE)
    r = await gw.call("GET", "/table/crm.broken?format=csv")
    text = (await r.read()).decode()
    assert r.status == 200 and text == f"id,deep\r\n1,{cell.decode()}\r\n"
    assert [k for k, _ in hold_closes] == ["settle", "settle"]
    await check_books(gw.services, gw.org["org_id"])


async def test_a_table_answer_nested_too_deeply_to_parse_is_no_table_and_charged_nothing(crm, hold_closes):
    gw, vendor = crm
    vendor.broken_body = b'{"data":{"items":[{"id":1,"deep":' + deep_array(DEEP) + b"}]}}"
    r = await gw.call("GET", "/table/crm.broken")
    body = await r.json()
    assert r.status == 502 and body["error"] == "table_upstream_error", body
    assert r.headers["X-Treg-Cost-Micro"] == "0"
    call_id = r.headers["X-Treg-Call-Id"]
    assert hold_closes == [("release", call_id)]
    assert (await audit_row(gw, call_id))["hold_state"] == "released"
    await check_books(gw.services, gw.org["org_id"])


# -- a caller's body -----------------------------------------------------------------------------------

@pytest.mark.parametrize("body", [b'{"name": "x", "tags": ' + deep_array(DEEP, b'"a"') + b"}",
                                  b'{"name": "x", "tags": [' + deep_array(900, b'"a"') + b"]}",
                                  b'{"name": ' + deep_array(DEEP, b'"x"') + b"}"])
async def test_a_catalog_body_nested_deeply_is_refused_before_any_hold(acme, hold_closes, body):
    gw, up, answers = acme
    answers["reply"] = http_response(200, b'{"id": 1}', JSON_TYPE)
    r = await gw.raw("POST", "/catalog/call/acme.items.create", JSON_TYPE, body)
    assert r.status == 400, r.body[:300]
    assert r.json()["error"] == "invalid_parameters"
    assert up.exchanges == [] and hold_closes == []
    await check_books(gw.services, gw.org["org_id"])


async def test_a_json_binding_body_nested_too_deeply_is_refused(gateway):
    async with raw_upstream(lambda ex: http_response(200, b"{}", JSON_TYPE)) as up:
        sid = await gateway.secret("js-secret-1")
        await gateway.tool("j", up.url, [{"location": "json", "name": "api_key", "format": "{secret}",
                                          "secret_id": sid}])
        for body in (deep_array(DEEP), b'{"a":' + deep_array(DEEP) + b"}"):
            r = await gateway.raw("POST", "/call/j/x", JSON_TYPE, body)
            assert r.status == 400 and r.json()["error"] == "invalid_json_body", r.body[:300]
        assert up.exchanges == []


# -- an aggregator's, an OAuth server's, an MCP result ----------------------------------------------------

async def test_an_aggregator_answer_nested_too_deeply_is_not_json():
    async with raw_upstream(lambda ex: http_response(200, deep_array(DEEP), JSON_TYPE)) as up, \
            aiohttp.ClientSession() as session:
        got = await exchange(session, "POST", up.url + "/run", SecretStr("agg-key"), {"a": 1})
    assert got.status == 200 and got.data is NOT_JSON and got.error == "not JSON"


def test_an_oauth_token_answer_nested_too_deeply_is_the_endpoint_down():
    with pytest.raises(TokenEndpointDown, match="not a JSON object"):
        token_answer(200, b'{"access_token":' + deep_array(DEEP) + b"}")


def _answer(data: bytes) -> Answer:
    return Answer(status=200, reason="OK", headers=[("Content-Type", "application/json")], data=data,
                  truncated=False, size=len(data))


def test_an_mcp_result_gives_a_deep_body_as_text_and_a_shallow_one_as_structure():
    for depth in (64, 65, 2_000, DEEP):
        data = deep_array(depth)
        result = answer_result(_answer(data), call_id="call_x", limit=len(data) + 1, fallback_tier="platform")
        structured = result["structuredContent"]["body"]
        if depth <= json_text.DEPTH_MAX:
            assert structured == json.loads(data)
        else:
            assert structured == data.decode()  # the text itself; nothing of it is lost
        json.dumps(result)  # what the MCP server writes back: possible at every depth
    assert not mcp_tools._is_json(deep_array(DEEP).decode()) and mcp_tools._is_json("[[1]]")


# -- the dashboard's secret form ---------------------------------------------------------------------------

@pytest.mark.parametrize("value", ['{"k": ' + "[" * 5_000 + "1" + "]" * 5_000 + "}",  # a form's body stays small
                                   '{"k": ' + "[" * 70 + "1" + "]" * 70 + "}", '{"k": "a\\u0000b"}'])
async def test_the_dashboard_refuses_a_json_secret_the_api_refuses(gateway, value):
    csrf = await login(gateway.client, gateway.org["token"])
    resp = await gateway.client.post("/ui/secrets", data={"name": "deep", "value": value, "is_json": "1",
                                                          "csrf": csrf})
    page = await resp.text()
    assert resp.status == 400, page[:500]
    assert re.search(r'id="value"', page)  # the refusal is shown beside the value field
    r = await gateway.raw("POST", "/api/v1/secrets", JSON_TYPE, b'{"name": "deep", "value": ' + value.encode() + b"}")
    assert r.status == 400 and r.json()["error"] == "invalid_json"
    assert (await gateway.api("GET", "/api/v1/secrets"))["secrets"] == []
