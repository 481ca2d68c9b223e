"""``GET /api/v1/resources``: the objects the org created on treg's platform vendor accounts (owned
resources, docs/lifecycle.md), newest first. Any member may read it: every member's platform calls may
update, use or delete these objects, so every member needs their ids."""

from __future__ import annotations

from aiohttp import web

from treg import owned_resources
from treg.web.api import identify
from treg.web.jsonio import json_response

routes = web.RouteTableDef()


@routes.get("/api/v1/resources")
async def list_resources(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    q = request.query
    rows = await owned_resources.list_for_org(svc, ident.org_id, limit=q.get("limit"), state=q.get("state"),
                                              kind=q.get("kind"), provider=q.get("provider"))
    return json_response({"resources": rows})
