"""MCP tools over real sockets: the list follows the ACL, calls go through the one call pipeline (ACL,
deny, money, idempotency, audit with surface mcp, evidence), results an agent can act on."""

from __future__ import annotations

import json

import pytest

from treg import membership
from treg.keys import SERVICES
from treg.testing import Gateway, Mcp, example_provider, http_response, raw_upstream, vendor_gateway


def names(result: dict) -> list[str]:
    return [t["name"] for t in result["result"]["tools"]]


async def test_list_follows_the_acl_in_a_stable_order_with_valid_names(gateway, up):
    proj = await gateway.api("POST", "/api/v1/projects", json={"name": "p1"}, expect=201)
    other = await gateway.api("POST", "/api/v1/projects", json={"name": "p2"}, expect=201)
    await gateway.tool("zeta", up.url)
    await gateway.tool("alpha~beta", up.url)
    await gateway.tool("alpha_beta", up.url)
    await gateway.tool("catalog_search", up.url)
    await gateway.tool("in-p1", up.url, project_id=proj["id"])
    await gateway.tool("in-p2", up.url, project_id=other["id"])
    member = await gateway.member("m@acme.test", project_ids=[proj["id"]])
    await gateway.tool("not-for-m", up.url, allowed_member_ids=[gateway.org["member_id"]])

    status, owner_list = await Mcp(gateway).modern("tools/list")
    listed = names(owner_list)
    assert listed[-2:] == ["catalog_search", "catalog_call"]
    own = listed[:-2]
    assert len(own) == 7 and len(set(listed)) == len(listed)
    assert all(len(n) <= 128 and set(n) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")
               for n in listed)
    # sorted by the tool's own name; a collision gets the tool id's tail; the catalog tools keep theirs
    assert own[0] == "alpha_beta" and own[1].startswith("alpha_beta-") and own[2].startswith("catalog_search-")
    assert own[3:] == ["in-p1", "in-p2", "not-for-m", "zeta"]
    titles = {t["name"]: t["title"] for t in owner_list["result"]["tools"]}
    assert titles[own[1]] == "alpha~beta"
    again = await Mcp(gateway).modern("tools/list")
    assert names(again[1]) == listed  # stable

    m = Mcp(gateway, token=member["token"])
    status, member_list = await m.modern("tools/list")
    assert names(member_list) == ["alpha_beta", own[1], own[2], "in-p1", "zeta", "catalog_search", "catalog_call"]


async def test_a_tool_the_caller_may_not_use_is_refused_by_the_pipeline_acl_and_audited(gateway, up):
    await gateway.tool("secret-tool", up.url, allowed_member_ids=[gateway.org["member_id"]])
    member = await gateway.member("m@acme.test")
    result = await Mcp(gateway, token=member["token"]).call("secret-tool", {"path": "/x"})
    assert result["isError"] is True
    sc = result["structuredContent"]
    assert sc["status"] == 403 and sc["served_via"] == "treg" and sc["blame"] == "caller"
    assert up.exchanges == []
    detail = await gateway.api("GET", f"/api/v1/calls/{sc['call_id']}", expect=200)
    assert detail["refused_by"] == "acl" and detail["surface"] == "mcp" and detail["outcome"] == "refused"


async def test_a_deny_rule_refuses_an_mcp_call_with_its_body(gateway, up):
    await gateway.tool("up", up.url + "/v1")
    host = up.url.split("//", 1)[1]
    await gateway.api("POST", "/api/v1/deny-rules", json={"host": host, "path": "/v1/admin", "reason": "no admin"},
                      expect=201)
    result = await Mcp(gateway).call("up", {"path": "/admin", "method": "DELETE"})
    assert result["isError"] is True and up.exchanges == []
    sc = result["structuredContent"]
    assert sc["status"] == 403 and sc["error"] and "no admin" in json.dumps(sc)
    assert "no admin" in result["content"][0]["text"]  # a model reading only text sees why


async def test_audit_of_an_mcp_call_equals_that_of_the_same_call_over_call(gateway, up):
    await gateway.tool("up", up.url + "/v1")
    r = await gateway.call("GET", "/call/up/items/7?fields=all")
    assert r.status == 200
    via_http = r.headers["X-Treg-Call-Id"]
    result = await Mcp(gateway).call("up", {"path": "/items/7", "query": {"fields": "all"}})
    via_mcp = result["structuredContent"]["call_id"]
    assert up.exchanges[0].request_line == up.exchanges[1].request_line == "GET /v1/items/7?fields=all HTTP/1.1"
    a = await gateway.api("GET", f"/api/v1/calls/{via_http}", expect=200)
    b = await gateway.api("GET", f"/api/v1/calls/{via_mcp}", expect=200)
    assert a["surface"] == "call" and b["surface"] == "mcp"
    differ = {"call_id", "id", "created_at", "duration_ms", "ttfb_ms", "surface", "request_bytes", "response_bytes"}
    assert {k: v for k, v in a.items() if k not in differ} == {k: v for k, v in b.items() if k not in differ}


async def test_vendor_error_is_an_error_result_with_its_body_and_evidence(gateway):
    async with raw_upstream(lambda ex: http_response(404, b'{"message": "no such item"}',
                                                     [("Content-Type", "application/json")], "Not Found")) as up:
        await gateway.tool("up", up.url + "/v1")
        result = await Mcp(gateway).call("up", {"path": "/items/9"})
    assert result["isError"] is True
    sc = result["structuredContent"]
    assert sc["status"] == 404 and sc["body"] == {"message": "no such item"} and sc["served_via"] == "upstream"
    assert sc["error"] == "upstream_status" and sc["blame"] == "upstream"
    assert "404" in result["content"][0]["text"] and "no such item" in result["content"][0]["text"]
    detail = await gateway.api("GET", f"/api/v1/calls/{sc['call_id']}", expect=200)
    assert detail["outcome"] == "upstream_error" and detail["error_response"]["status"] == 404
    assert "no such item" in detail["error_response"]["body"]


@pytest.mark.parametrize("streamed", [False, True])
async def test_long_bodies_are_cut_at_the_limit_saying_so(make_app, aiohttp_client, streamed):
    big = ("é" * 3000).encode()  # 6000 bytes, a character cut at the limit
    def respond(ex):
        if streamed:
            chunks = b"".join(f"{len(big[i:i + 1000]):x}\r\n".encode() + big[i:i + 1000] + b"\r\n"
                              for i in range(0, len(big), 1000))
            return http_response(200, chunks + b"0\r\n\r\n", [("Transfer-Encoding", "chunked")], length=False)
        return http_response(200, big, [("Content-Type", "text/plain; charset=utf-8")])
    async with raw_upstream(respond) as up:
        client = await aiohttp_client(make_app(ssrf_allow=("127.0.0.0/8",), mcp_max_text_bytes=1001))
        org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
        gw = Gateway(client, org)
        await gw.tool("up", up.url)
        result = await Mcp(gw).call("up", {})
        sc = result["structuredContent"]
        assert result["isError"] is False and sc["body_truncated"] is True
        assert sc["body"] == "é" * 500  # 1000 bytes: the 1001st would split a character
        text = result["content"][0]["text"]
        assert text.startswith("é" * 500) and "cut at 1001 bytes" in text and "TREG_MCP_MAX_TEXT_BYTES" in text
        if not streamed:
            assert sc["body_bytes"] == 6000 and "of 6000 bytes" in text
        detail = await gw.api("GET", f"/api/v1/calls/{sc['call_id']}", expect=200)
        assert detail["status"] == 200
        await client.close()


@pytest.mark.parametrize("args, word", [
    ({"verb": "GET"}, "unknown argument"),
    ({"method": "FETCH"}, "method must be one of"),
    ({"path": 7}, "path must be a string"),
    ({"headers": {"Bad Name": "x"}}, "not a valid header name"),
    ({"headers": {"X-A": "a\r\nX-B: b"}}, "CR, LF or NUL"),
    ({"query": ["a"]}, "query must be an object"),
])
async def test_bad_arguments_are_invalid_params(gateway, up, args, word):
    await gateway.tool("up", up.url)
    status, body = await Mcp(gateway).modern("tools/call", {"name": "up", "arguments": args})
    assert status == 400 and body["error"]["code"] == -32602 and word in body["error"]["message"], body
    assert up.exchanges == []


async def test_unknown_tool_is_invalid_params_pointing_at_the_catalog(gateway):
    status, body = await Mcp(gateway).modern("tools/call", {"name": "weather.forecast", "arguments": {}})
    assert status == 400 and body["error"]["code"] == -32602
    data = body["error"]["data"]
    assert data["tools"] == ["catalog_search", "catalog_call"]
    assert "open-meteo.forecast" in data["did_you_mean"] and "openweathermap.forecast" in data["did_you_mean"]
    assert "/api/v1/catalog/endpoints?q=weather+forecast" in data["hint"]


# -- the catalog tools ---------------------------------------------------------------------------------

@pytest.fixture
async def cat(aiohttp_client, make_app):
    """A gateway with the acme test provider on a raw upstream, a platform key, credits to spend."""
    async with raw_upstream(lambda ex: http_response(200, b'{"id": 7}', [("Content-Type", "application/json")])) as up:
        async with vendor_gateway(aiohttp_client, make_app, [example_provider(up.url + "/v1")],
                                  platform={"TREG_PLATFORM_KEY_ACME": "pk-1"}, slug="acme-org", email="o@acme.test",
                                  credits=10_000) as gw:
            yield gw, up


async def test_catalog_search_names_params_price_tier_and_alternatives(cat):
    gw, _ = cat
    result = await Mcp(gw).call("catalog_search", {"query": "items lookup"})
    found = result["structuredContent"]["endpoints"]
    by_id = {e["id"]: e for e in found}
    get = by_id["acme.items.get"]
    assert get["price_micro"] == 2000 and get["credential_tier"] == "platform" and get["billed"] is True
    assert {p["name"] for p in get["params"]} == {"item_id", "fields"}
    assert get["alternatives"][0]["id"] == "acme.items.cheap"
    assert get["call"] == {"tool": "catalog_call", "arguments": {"endpoint": "acme.items.get",
                                                                  "params": {"item_id": "<item_id>"}}}
    assert "acme.items.old" not in by_id and "acme.items.legacy" not in by_id  # not live: never suggested
    by_cap = await Mcp(gw).call("catalog_search", {"capability": "items"})
    # with the routed treg.items.lookup the two live items.lookup endpoints get (lifecycle.md)
    assert {e["id"] for e in by_cap["structuredContent"]["endpoints"]} == {"acme.items.get", "acme.items.cheap",
                                                                           "treg.items.lookup"}
    everything = await Mcp(gw).call("catalog_search", {})
    assert "items.lookup" in everything["structuredContent"]["capabilities"]
    none = await Mcp(gw).call("catalog_search", {"query": "zzzqqq"})
    assert none["structuredContent"]["endpoints"] == [] and "hint" in none["structuredContent"]
    status, body = await Mcp(gw).modern("tools/call", {"name": "catalog_search", "arguments": {"limit": 0}})
    assert status == 400 and body["error"]["code"] == -32602


async def test_catalog_call_bills_through_the_pipeline_and_replays_idempotently(cat):
    gw, up = cat
    args = {"endpoint": "acme.items.get", "params": {"item_id": "7", "fields": "all"}, "idempotency_key": "k-1"}
    first = await Mcp(gw).call("catalog_call", args)
    sc = first["structuredContent"]
    assert first["isError"] is False and sc["body"] == {"id": 7}
    assert sc["credential_tier"] == "platform" and sc["cost_micro"] == 2000 and sc["served_via"] == "upstream"
    assert up.last.target == "/v1/items/7?fields=all" and up.last.header("Authorization") == "Bearer pk-1"
    assert up.last.header("Idempotency-Key") != "k-1"  # the platform tier sends a digest, never the label
    assert up.last.header_all("Accept-Encoding") == ["identity"]  # treg reads the result itself
    again = await Mcp(gw).call("catalog_call", args)
    assert again["structuredContent"]["served_via"] == "idempotent_replay"
    assert again["structuredContent"]["cost_micro"] == 0 and len(up.exchanges) == 1
    bal = await gw.api("GET", "/api/v1/balance", expect=200)
    assert bal["balance_micro"] == 8000
    detail = await gw.api("GET", f"/api/v1/calls/{sc['call_id']}", expect=200)
    assert detail["surface"] == "mcp" and detail["hold_state"] == "settled" and detail["cost_micro"] == 2000


async def test_catalog_call_refusals_carry_treg_error_body(cat):
    gw, up = cat
    missing = await Mcp(gw).call("catalog_call", {"endpoint": "acme.items.get", "params": {}})
    assert missing["isError"] and missing["structuredContent"]["error"] == "invalid_parameters"
    assert missing["structuredContent"]["parameter"] == "item_id"
    retired = await Mcp(gw).call("catalog_call", {"endpoint": "acme.items.old"})
    assert retired["structuredContent"]["error"] == "endpoint_retired"
    assert retired["structuredContent"]["superseded_by"] == "acme.items.get"
    typo = await Mcp(gw).call("catalog_call", {"endpoint": "acme.item.get"})
    assert typo["structuredContent"]["error"] == "endpoint_not_found"
    assert typo["structuredContent"]["did_you_mean"][0] == "acme.items.get"
    body = await Mcp(gw).call("catalog_call", {"endpoint": "acme.items.create", "params": {"name": "n", "tags": ["a"]}})
    assert body["isError"] is False and json.loads(up.last.body) == {"name": "n", "tags": ["a"]}
    assert up.last.method == "POST"
    # an own tool named like the endpoint never shadows catalog_call (as on /catalog/call/)
    await gw.tool("acme.items.get", up.url + "/shadow")
    await Mcp(gw).call("catalog_call", {"endpoint": "acme.items.get", "params": {"item_id": "2"}})
    assert up.last.target == "/v1/items/2"


async def test_a_redirect_result_names_the_treg_location_to_follow(gateway):
    async with raw_upstream(lambda ex: http_response(302, b"", [("Location", "http://elsewhere.example/x")],
                                                     reason="Found")) as up:
        await gateway.tool("up", up.url + "/v1")
        result = await Mcp(gateway).call("up", {"path": "/go"})
    sc = result["structuredContent"]
    assert result["isError"] is False and sc["status"] == 302
    assert sc["location"].startswith("/redirect/")  # rewritten by the pipeline: never the upstream's URL


async def test_the_list_never_shows_a_base_urls_user_info(gateway, up):
    """A base URL's ``user:password@`` is a credential (treg/tool_urls.py): the tool's description and its
    path's schema show the URL masked, as every listing does."""
    host = up.url.split("://", 1)[1]
    await gateway.tool("basic", f"http://svc-user:pw-Zq81x@{host}/v1")
    status, listing = await Mcp(gateway).modern("tools/list")
    [tool] = [t for t in listing["result"]["tools"] if t["title"] == "basic"]
    text = json.dumps(tool)
    assert "pw-Zq81x" not in text and "svc-user" not in text and "[REDACTED]@" in text


def test_mcp_names_are_unique_and_fit_when_names_collide():
    """Tools whose names collide (with each other, with a catalog tool, or once made valid) keep one
    listed name each: the first its own, the next the tool id's tail, then a number; every name at most
    128 characters. Hub refs colliding with a name already taken get ``-hub``, then ``-hub-2``."""
    from types import SimpleNamespace

    from treg.mcp.tools import CATALOG_SEARCH, hub_names, mcp_names

    tools = [SimpleNamespace(name="x", id=f"{p}_12345678") for p in "cab"] + [
        SimpleNamespace(name=CATALOG_SEARCH, id="tool_00000001"),
        SimpleNamespace(name="a b", id="tool_00000002"), SimpleNamespace(name="a_b", id="tool_00000003"),
        SimpleNamespace(name="n" * 200, id="tool_00000004"), SimpleNamespace(name="n" * 130, id="tool_00000005")]
    named = {tool.id: name for name, tool in mcp_names(tools)}
    assert [named[f"{p}_12345678"] for p in "abc"] == ["x", "x-12345678", "x-12345678-2"]
    assert named["tool_00000001"] == f"{CATALOG_SEARCH}-00000001"
    assert (named["tool_00000002"], named["tool_00000003"]) == ("a_b", "a_b-00000003")
    assert named["tool_00000005"] == "n" * 128  # the shorter name sorts first: cut, it is its own
    assert named["tool_00000004"] == "n" * 119 + "-00000004"
    assert len(set(named.values())) == len(tools) and all(len(n) <= 128 for n in named.values())
    hubs = [SimpleNamespace(ref="pub.search"), SimpleNamespace(ref="pub.other")]
    assert [name for name, _ in hub_names(hubs, ["pub.search", "pub.search-hub"])] == ["pub.other",
                                                                                       "pub.search-hub-2"]
    assert [name for name, _ in hub_names(hubs[:1], ["pub.search"])] == ["pub.search-hub"]
