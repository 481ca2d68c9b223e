"""``GET /``: an index for agents holding only the base URL (and perhaps a token), and for browsers.

JSON (a browser asking for ``text/html`` is sent to the dashboard, ``/ui/``): what treg is, the call
forms, the MCP URLs, the catalog search URL and its capabilities; with a valid token, the caller's
org, role and usable tool names. A bad token is said so in the answer, never a 401: the index is
public, the personal part is not.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from treg import __version__, authentication
from treg.catalog.search import SEARCH_PATH
from treg.errors import TregError
from treg.keys import SERVICES
from treg.mcp.protocol import SUPPORTED
from treg.org_data import org_tools, usable
from treg.web.jsonio import json_response

routes = web.RouteTableDef()

ABOUT = ("treg is a self-hosted API gateway: agents and scripts call third-party APIs through it, and treg "
         "injects the team's credentials, so callers never hold the keys.")


def _wants_html(accept: str) -> bool:
    """A browser's navigation (``text/html`` listed, JSON not): the dashboard, not JSON."""
    media = [item.split(";", 1)[0].strip().lower() for item in accept.split(",")]
    return "text/html" in media and "application/json" not in media


def _token(request: web.Request) -> str | None:
    token = request.headers.get("X-Treg-Token")
    if token:
        return token
    scheme, _, value = request.headers.get("Authorization", "").strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" and value.strip() else None


@routes.get("/")
async def index(request: web.Request) -> web.StreamResponse:
    if _wants_html(request.headers.get("Accept", "")):
        return web.Response(status=303, headers={"Location": "/ui/"})
    svc = request.app[SERVICES]
    registry = svc.catalog
    body: dict[str, Any] = {
        "name": "treg", "version": __version__, "about": ABOUT,
        "identity": "send your treg token as X-Treg-Token: <token> (MCP also takes Authorization: Bearer <token>); "
                    "X-Treg-Org: <slug> picks one of several orgs",
        "call": {
            "own_tool": "/call/<tool>/<path>?<query>",
            "by_url": "/call/https://<host>/<path>",
            "catalog": "/catalog/call/<endpoint-id>?<param>=<value>",
        },
        "catalog": {
            "search": f"{SEARCH_PATH}?q=<words>",
            "by_capability": f"{SEARCH_PATH}?capability=<capability>",
            "endpoint": f"{SEARCH_PATH}/<endpoint-id>",
            "capabilities": sorted(registry.capabilities),
            "endpoints": sum(1 for ep in registry.endpoints.values() if ep.is_live),
        },
        "mcp": {"tools_and_catalog": "/mcp", "catalog_only": "/catalog/mcp", "protocol_versions": list(SUPPORTED),
                "transport": "streamable HTTP (POST, answered as application/json)"},
        "api": "/api/v1",
        "dashboard": "/ui/",
        "next": "find an endpoint: GET /api/v1/catalog/endpoints?q=<what you want>, then call "
                "/catalog/call/<endpoint-id>?<param>=<value> with your token",
    }
    token = _token(request)
    if token:
        try:
            ident = await authentication.authenticate(svc, token, request.headers.get("X-Treg-Org"))
        except TregError as exc:
            body["you"] = {"token_accepted": False, "error": exc.code, "detail": exc.detail}
        else:
            tools = sorted(t.name for t in await org_tools(svc, ident.org_id) if usable(ident, t))
            body["you"] = {"token_accepted": True, "org_id": ident.org_id, "org_slug": ident.org_slug,
                           "member_id": ident.member_id, "role": ident.role, "tools": tools}
    return json_response(body)
