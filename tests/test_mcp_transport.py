"""The MCP transport over real sockets (surfaces.md, MCP): streamable HTTP answered as JSON, stateless,
both protocol revisions, the 2026-07-28 header rules, identity, Origin, 405 on GET/DELETE."""

from __future__ import annotations

import base64
import json

import pytest

from treg import membership
from treg.keys import SERVICES
from treg.testing import LEGACY, MODERN, Gateway, Mcp, legacy_headers, modern_headers, modern_message


# -- 2025-11-25 --------------------------------------------------------------------------------------

async def test_legacy_handshake_issues_no_session_and_answers_json(gateway):
    m = Mcp(gateway)
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize",
            "params": {"protocolVersion": LEGACY, "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
    resp = await m.post(init, {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"})
    assert resp.status == 200 and resp.content_type == "application/json"
    assert "Mcp-Session-Id" not in resp.headers
    body = await resp.json()
    assert body["id"] == 0 and body["result"]["protocolVersion"] == LEGACY
    assert body["result"]["serverInfo"]["name"] == "treg" and "tools" in body["result"]["capabilities"]
    assert "catalog_search" in body["result"]["instructions"]

    resp = await m.post({"jsonrpc": "2.0", "method": "notifications/initialized"}, legacy_headers())
    assert resp.status == 202 and await resp.read() == b""

    assert await m.legacy("ping", id="p") == (200, {"jsonrpc": "2.0", "id": "p", "result": {}})
    status, body = await m.legacy("tools/list", id=2)
    assert status == 200 and [t["name"] for t in body["result"]["tools"]] == ["catalog_search", "catalog_call"]
    assert "resultType" not in body["result"]  # a 2026-07-28 field: not in a 2025-11-25 answer


async def test_legacy_method_errors_are_200_and_envelope_errors_400(gateway):
    m = Mcp(gateway)
    status, body = await m.legacy("resources/list")
    assert status == 200 and body["error"]["code"] == -32601 and body["id"] == 1
    resp = await m.post(b"{not json", legacy_headers())
    assert resp.status == 400 and (await resp.json())["error"]["code"] == -32700
    resp = await m.post([{"jsonrpc": "2.0", "id": 1, "method": "ping"}], legacy_headers())
    assert resp.status == 400 and (await resp.json())["error"]["code"] == -32600
    resp = await m.post({"jsonrpc": "1.0", "id": 1, "method": "ping"}, legacy_headers())
    assert resp.status == 400 and (await resp.json())["error"]["code"] == -32600
    # an unknown protocol version in the header: 400, naming what treg speaks
    resp = await m.post({"jsonrpc": "2.0", "id": 1, "method": "ping"}, {"MCP-Protocol-Version": "2024-01-01"})
    body = await resp.json()
    assert resp.status == 400 and body["error"]["code"] == -32022
    assert body["error"]["data"] == {"supported": [MODERN, LEGACY], "requested": "2024-01-01"}


# -- 2026-07-28 --------------------------------------------------------------------------------------

async def test_modern_discover_and_every_result_carry_the_revision_fields(gateway):
    m = Mcp(gateway)
    status, body = await m.modern("server/discover", id="d")
    assert status == 200 and body["id"] == "d"
    result = body["result"]
    assert result["resultType"] == "complete" and result["supportedVersions"] == [MODERN, LEGACY]
    assert result["capabilities"] == {"tools": {"listChanged": False}}
    assert result["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "treg"
    status, body = await m.modern("tools/list")
    assert status == 200 and body["result"]["resultType"] == "complete"
    assert body["result"]["ttlMs"] == 0 and body["result"]["cacheScope"] == "private"


@pytest.mark.parametrize("case, change, code", [
    ("no _meta", lambda msg, h: msg["params"].pop("_meta"), -32602),
    ("no clientCapabilities", lambda msg, h: msg["params"]["_meta"].pop("io.modelcontextprotocol/clientCapabilities"),
     -32602),
    ("no version header", lambda msg, h: h.pop("MCP-Protocol-Version"), -32020),
    ("version header differs", lambda msg, h: h.update({"MCP-Protocol-Version": LEGACY}), -32020),
    ("no Mcp-Method", lambda msg, h: h.pop("Mcp-Method"), -32020),
    ("Mcp-Method differs", lambda msg, h: h.update({"Mcp-Method": "prompts/list"}), -32020),
    ("Mcp-Method case differs", lambda msg, h: h.update({"Mcp-Method": "TOOLS/LIST"}), -32020),
])
async def test_modern_envelope_refusals_are_400(gateway, case, change, code):
    msg, headers = modern_message("tools/list"), modern_headers("tools/list")
    change(msg, headers)
    resp = await Mcp(gateway).post(msg, headers)
    body = await resp.json()
    assert resp.status == 400, (case, body)
    assert body["error"]["code"] == code and body["id"] == 1, (case, body)
    assert resp.headers["X-Treg-Error"] == "1"


async def test_modern_header_names_are_case_insensitive(gateway):
    headers = {k.lower(): v for k, v in modern_headers("tools/list").items()}
    resp = await Mcp(gateway).post(modern_message("tools/list"), headers)
    assert resp.status == 200, await resp.text()


async def test_modern_mcp_name_must_match_and_may_be_base64(gateway):
    m = Mcp(gateway)
    msg = modern_message("tools/call", {"name": "catalog_search", "arguments": {"query": "x"}})
    for value, want in (("catalog_search", 200), ("catalog_call", 400), (None, 400),
                        ("=?base64?" + base64.b64encode(b"catalog_search").decode() + "?=", 200),
                        ("=?base64?Y2F0YWxvZ19zZWFyY2g?=", 400)):  # non-canonical padding: never a match
        headers = modern_headers("tools/call", value)
        resp = await m.post(msg, headers)
        body = await resp.json()
        assert resp.status == want, (value, body)
        if want == 400:
            assert body["error"]["code"] == -32020


async def test_modern_unsupported_version_lists_the_supported_ones(gateway):
    msg = modern_message("server/discover")
    msg["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "v999.0.0"
    headers = {**modern_headers("server/discover"), "MCP-Protocol-Version": "v999.0.0"}
    resp = await Mcp(gateway).post(msg, headers)
    body = await resp.json()
    assert resp.status == 400 and body["error"]["code"] == -32022
    assert body["error"]["data"] == {"supported": [MODERN, LEGACY], "requested": "v999.0.0"}


@pytest.mark.parametrize("method", ["initialize", "ping", "logging/setLevel", "unknown/method", "prompts/list"])
async def test_modern_unknown_and_removed_methods_are_404_32601(gateway, method):
    status, body = await Mcp(gateway).modern(method, id=500)
    assert status == 404 and body["error"]["code"] == -32601 and body["id"] == 500


async def test_notification_is_202_without_body(gateway):
    resp = await Mcp(gateway).post({"jsonrpc": "2.0", "method": "notifications/cancelled",
                                    "params": {"requestId": 1}}, modern_headers("notifications/cancelled"))
    assert resp.status == 202 and await resp.read() == b""


# -- HTTP: methods, identity, origin -----------------------------------------------------------------

@pytest.mark.parametrize("path", ["/mcp", "/catalog/mcp"])
@pytest.mark.parametrize("method", ["GET", "DELETE"])
async def test_get_and_delete_are_405(gateway, path, method):
    resp = await gateway.client.request(method, path, headers={"Authorization": f"Bearer {gateway.org['token']}",
                                                               "Mcp-Session-Id": "abc"})
    assert resp.status == 405 and resp.headers["Allow"] == "POST"
    body = await resp.json()
    assert body["error"] == "method_not_allowed" and body["blame"] == "caller"


@pytest.mark.parametrize("path", ["/mcp", "/catalog/mcp"])
async def test_no_or_bad_token_is_401_with_www_authenticate(gateway, path):
    m = Mcp(gateway, path)
    resp = await m.post(modern_message("tools/list"), modern_headers("tools/list"), auth=False)
    assert resp.status == 401 and resp.headers["WWW-Authenticate"] == "Bearer"
    body = await resp.json()
    assert body["error"] == "missing_token" and "Authorization: Bearer" in body["detail"]
    resp = await m.post(modern_message("tools/list"), {**modern_headers("tools/list"),
                                                      "Authorization": "Bearer treg_nope"}, auth=False)
    assert resp.status == 401 and resp.headers["WWW-Authenticate"] == "Bearer"
    # X-Treg-Token works as on every route, and a wrong X-Treg-Org is 403
    resp = await m.post(modern_message("tools/list"), {**modern_headers("tools/list"),
                                                      "X-Treg-Token": gateway.org["token"]}, auth=False)
    assert resp.status == 200
    resp = await m.post(modern_message("tools/list"), {**modern_headers("tools/list"), "X-Treg-Org": "other"})
    assert resp.status == 403


async def test_origin_other_than_treg_is_403_and_host_header_is_never_trusted(gateway):
    m = Mcp(gateway)
    port = gateway.client.port
    msg, headers = modern_message("tools/list"), modern_headers("tools/list")
    # DNS rebinding: the page's name resolves to 127.0.0.1; Host and Origin both say evil
    for origin in ("http://evil.example.com", f"http://evil.example.com:{port}", "null", f"https://127.0.0.1:{port}"):
        resp = await m.post(msg, {**headers, "Origin": origin, "Host": f"evil.example.com:{port}"})
        body = await resp.json()
        assert resp.status == 403, origin
        assert body["error"]["code"] == -32600 and body["id"] is None
        assert body["error"]["data"]["error"] == "origin_not_allowed"
    for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}", f"http://LOCALHOST:{port}/"):
        resp = await m.post(msg, {**headers, "Origin": origin, "Host": f"evil.example.com:{port}"})
        assert resp.status == 200, origin
    # no Origin (not a browser): allowed, whatever Host says
    resp = await m.post(msg, {**headers, "Host": "evil.example.com"})
    assert resp.status == 200


async def test_allowed_origins_and_public_url_decide_the_origin(make_app, aiohttp_client):
    client = await aiohttp_client(make_app(mcp_allowed_origins=("https://inspector.example",),
                                           public_url="https://treg.example.com/"))
    org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
    m = Mcp(Gateway(client, org))
    msg, headers = modern_message("tools/list"), modern_headers("tools/list")
    resp = await m.post(msg, {**headers, "Origin": "https://inspector.example"})
    assert resp.status == 200 and resp.headers["Access-Control-Allow-Origin"] == "https://inspector.example"
    resp = await m.post(msg, {**headers, "Origin": "https://treg.example.com"})
    assert resp.status == 200
    # with a public URL, the listen address is no longer treg's origin
    resp = await m.post(msg, {**headers, "Origin": f"http://127.0.0.1:{client.port}"})
    assert resp.status == 403
    pre = await client.request("OPTIONS", "/mcp", headers={"Origin": "https://inspector.example",
                                                           "Access-Control-Request-Method": "POST"})
    assert pre.status == 204 and "Mcp-Method" in pre.headers["Access-Control-Allow-Headers"]
    await client.close()


async def test_wrong_content_type_accept_and_oversized_body(gateway):
    m = Mcp(gateway)
    resp = await m.post(json.dumps(modern_message("tools/list")), {**modern_headers("tools/list"),
                                                                  "Content-Type": "text/plain"})
    assert resp.status == 415
    resp = await m.post(modern_message("tools/list"), {**modern_headers("tools/list"), "Accept": "text/html"})
    assert resp.status == 406


async def test_oversized_body_is_413(make_app, aiohttp_client):
    client = await aiohttp_client(make_app(json_body_max_bytes=1000))
    org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
    m = Mcp(Gateway(client, org))
    msg = modern_message("tools/call", {"name": "catalog_search", "arguments": {"query": "x" * 2000}})
    resp = await m.post(msg, modern_headers("tools/call", "catalog_search"))
    assert resp.status == 413 and (await resp.json())["error"]["data"]["error"] == "body_too_large"
    await client.close()


async def test_catalog_mcp_lists_only_the_catalog_tools(gateway, up):
    await gateway.tool("weather", up.url + "/v1")
    status, body = await Mcp(gateway, "/catalog/mcp").modern("tools/list")
    assert [t["name"] for t in body["result"]["tools"]] == ["catalog_search", "catalog_call"]
    status, body = await Mcp(gateway, "/catalog/mcp").modern("tools/call", {"name": "weather", "arguments": {}})
    assert status == 400 and body["error"]["code"] == -32602
    status, body = await Mcp(gateway).modern("tools/list")
    assert [t["name"] for t in body["result"]["tools"]] == ["weather", "catalog_search", "catalog_call"]



@pytest.mark.parametrize("value, want", [
    ("acme.nop", 200),                                               # mirrors the argument: served
    ("=?base64?YWNtZS5ub3A=?=", 200),                                # the same, base64-wrapped
    (None, 400),                                                     # argument present, header missing
    ("other.endpoint", 400),                                         # disagrees with the body
    ("=?base64?YWNtZS5ub3A?=", 400),                                 # base64 without its padding
    ("=?base64?YWNt!!!ZS5ub3A=?=", 400),                             # not base64
])
async def test_catalog_call_endpoint_is_mirrored_in_mcp_param_endpoint(gateway, value, want):
    tools = (await Mcp(gateway).modern("tools/list"))[1]["result"]["tools"]
    call = next(t for t in tools if t["name"] == "catalog_call")
    assert call["inputSchema"]["properties"]["endpoint"]["x-mcp-header"] == "Endpoint"
    msg = modern_message("tools/call", {"name": "catalog_call", "arguments": {"endpoint": "acme.nop"}})
    headers = modern_headers("tools/call", "catalog_call")
    if value is not None:
        headers["Mcp-Param-Endpoint"] = value
    resp = await Mcp(gateway).post(msg, headers)
    body = await resp.json()
    assert resp.status == want, (value, body)
    if want == 400:
        assert body["error"]["code"] == -32020
    else:
        assert body["result"]["isError"] is True  # no such endpoint: treg's refusal, as a result
    # a header without its argument is refused too
    msg = modern_message("tools/call", {"name": "catalog_call", "arguments": {}})
    resp = await Mcp(gateway).post(msg, {**modern_headers("tools/call", "catalog_call"),
                                         "Mcp-Param-Endpoint": "acme.nop"})
    assert resp.status == 400 and (await resp.json())["error"]["code"] == -32020


async def test_no_token_reaches_a_log(gateway, up, caplog):
    import logging

    caplog.set_level(logging.DEBUG)
    await gateway.tool("up", up.url)
    m = Mcp(gateway)
    await m.modern("tools/list")
    await m.call("up", {"headers": {"X-Note": "hello"}})
    await m.post(b"{broken", modern_headers("tools/list"))
    await Mcp(gateway, token="treg_wrong_secret_value").modern("tools/list")
    text = "\n".join(r.getMessage() + str(r.args) for r in caplog.records)
    assert gateway.org["token"] not in text and "treg_wrong_secret_value" not in text
