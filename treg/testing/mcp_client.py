"""The MCP surface driven by hand: JSON-RPC messages of both protocol revisions (``MODERN``, ``LEGACY``) and
``Mcp``, a bare client over a :class:`~treg.testing.Gateway` with every header and byte visible."""

from __future__ import annotations

import base64
import json
from typing import Any

MODERN = "2026-07-28"
LEGACY = "2025-11-25"

META = {"io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientInfo": {"name": "treg-tests", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {}}


def modern_headers(method: str, name: str | None = None) -> dict[str, str]:
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
         "MCP-Protocol-Version": MODERN, "Mcp-Method": method}
    if name is not None:
        h["Mcp-Name"] = name
    return h


def legacy_headers() -> dict[str, str]:
    return {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": LEGACY}


def modern_message(method: str, params: dict[str, Any] | None = None, id: Any = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": {**(params or {}), "_meta": dict(META)}}


class Mcp:
    """A bare MCP client over the gateway's aiohttp test client (every header and byte visible)."""

    def __init__(self, gateway: Any, path: str = "/mcp", token: str | None = None) -> None:
        self.gateway = gateway
        self.path = path
        self.token = token if token is not None else gateway.org["token"]

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def post(self, message: Any, headers: dict[str, str] | None = None, *, auth: bool = True) -> Any:
        hs = {"Content-Type": "application/json", **(self.auth() if auth else {}), **(headers or {})}
        data = message if isinstance(message, (bytes, str)) else json.dumps(message)
        return await self.gateway.client.post(self.path, data=data, headers=hs)

    async def modern(self, method: str, params: dict[str, Any] | None = None, *, id: Any = 1,
                     headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
        name = (params or {}).get("name") if method == "tools/call" else None
        mirrored = {}
        endpoint = ((params or {}).get("arguments") or {}).get("endpoint")
        if name == "catalog_call" and isinstance(endpoint, str):
            # catalog_call's endpoint carries x-mcp-header: a 2026-07-28 client mirrors it
            mirrored["Mcp-Param-Endpoint"] = endpoint if endpoint.isascii() and endpoint == endpoint.strip() \
                else "=?base64?" + base64.b64encode(endpoint.encode()).decode() + "?="
        resp = await self.post(modern_message(method, params, id),
                               {**modern_headers(method, name), **mirrored, **(headers or {})})
        return resp.status, await resp.json()

    async def legacy(self, method: str, params: dict[str, Any] | None = None, *, id: Any = 1) -> tuple[int, Any]:
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": id, "method": method}
        if params is not None:
            msg["params"] = params
        resp = await self.post(msg, legacy_headers())
        return resp.status, await resp.json()

    async def call(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        status, body = await self.modern("tools/call", {"name": name, "arguments": arguments})
        assert status == 200, body
        assert "result" in body, body
        return body["result"]
