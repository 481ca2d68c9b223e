"""Hub routes of the management API (docs/sharing.md "Hub"): publish one of the org's tools, list every
published tool, unpublish. The same functions as the dashboard's Hub page (treg/hub/store.py)."""

from __future__ import annotations

from aiohttp import web

from treg.hub import store
from treg.web.api import identify
from treg.web.jsonio import json_response, read_json_object

routes = web.RouteTableDef()


@routes.post("/api/v1/hub/tools")
async def publish(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response(await store.publish(svc, ident, await read_json_object(request)), status=201)


@routes.get("/api/v1/hub/tools")
async def list_published(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response({"tools": await store.list_published(svc, ident)})


@routes.delete("/api/v1/hub/tools/{hub_tool_id}")
async def unpublish(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    await store.unpublish(svc, ident, request.match_info["hub_tool_id"])
    return web.Response(status=204)
