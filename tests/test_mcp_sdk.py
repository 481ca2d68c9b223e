"""The official MCP Python SDK client, in both its modes, against a running treg (real sockets).

``mode="legacy"`` speaks 2025-11-25 (the initialize handshake); ``mode="auto"`` probes
``server/discover`` and stays on 2026-07-28. Both must list treg's tools and call them through the
pipeline (the upstream sees the request, the audit row says ``surface: mcp``).
"""

from __future__ import annotations

import json

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from treg.testing import LEGACY, MODERN


def sdk(gateway, path: str = "/mcp", mode: str = "auto", token: str | None = None):
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token or gateway.org['token']}"}, timeout=30)
    url = str(gateway.client.make_url(path))
    return http, Client(streamable_http_client(url, http_client=http), mode=mode)


@pytest.mark.parametrize("mode, version", [("legacy", LEGACY), ("auto", MODERN)])
async def test_sdk_client_lists_and_calls_an_own_tool(gateway, up, mode, version):
    await gateway.tool("up", up.url + "/v1")
    http, client = sdk(gateway, mode=mode)
    async with http, client as c:
        assert c.protocol_version == version
        assert c.server_info is not None and c.server_info.name == "treg"
        listed = await c.list_tools()
        assert [t.name for t in listed.tools] == ["up", "catalog_search", "catalog_call"]
        up_tool = listed.tools[0]
        assert set(up_tool.input_schema["properties"]) == {"method", "path", "query", "headers", "body"}
        result = await c.call_tool("up", {"method": "POST", "path": "/items/7", "query": {"q": "a b"},
                                          "body": {"name": "x"}})
    assert result.is_error is False
    assert result.content[0].text == "ok"
    sc = result.structured_content
    assert sc["status"] == 200 and sc["body"] == "ok" and sc["credential_tier"] == "tool"
    assert sc["served_via"] == "upstream" and sc["call_id"].startswith("call")
    assert up.last.request_line == "POST /v1/items/7?q=a%20b HTTP/1.1"
    assert json.loads(up.last.body) == {"name": "x"} and up.last.header("Content-Type") == "application/json"
    assert up.last.header("Authorization") is None  # treg's token never reaches an upstream
    calls = await gateway.calls()
    row = next(c for c in calls if c["call_id"] == sc["call_id"])
    assert row["status"] == 200 and row["outcome"] == "ok"
    detail = await gateway.api("GET", f"/api/v1/calls/{sc['call_id']}", expect=200)
    assert detail["surface"] == "mcp" and detail["tool_name"] == "up"


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_sdk_client_gets_refusals_as_error_results_and_unknown_tools_as_errors(gateway, mode):
    http, client = sdk(gateway, path="/catalog/mcp", mode=mode)
    async with http, client as c:
        listed = await c.list_tools()
        assert [t.name for t in listed.tools] == ["catalog_search", "catalog_call"]
        result = await c.call_tool("catalog_call", {"endpoint": "open-meteo.forcast", "params": {}})
        assert result.is_error is True
        sc = result.structured_content
        assert sc["error"] == "endpoint_not_found" and "open-meteo.forecast" in sc["did_you_mean"]
        assert "/api/v1/catalog/endpoints?q=" in sc["hint"]
        with pytest.raises(MCPError) as info:
            await c.call_tool("nope", {})
        assert info.value.error.code == -32602


async def test_sdk_client_without_token_fails_to_connect(gateway):
    http = httpx2.AsyncClient(timeout=30)
    client = Client(streamable_http_client(str(gateway.client.make_url("/mcp")), http_client=http), mode="legacy")
    async with http:
        with pytest.raises(Exception):
            async with client:
                pass
