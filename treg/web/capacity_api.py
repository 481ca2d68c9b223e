"""``GET /api/v1/capacity`` (owner/admin): the platform tier's capacity locks (docs/resilience.md)."""

from __future__ import annotations

from aiohttp import web

from treg.identity import require_manager
from treg.web.api import identify
from treg.web.jsonio import json_response

routes = web.RouteTableDef()


@routes.get("/api/v1/capacity")
async def get_capacity(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    require_manager(ident)
    locks = await svc.breaker.locks()
    return json_response({"locks": [{k: v for k, v in lock.items() if k != "locked"} for lock in locks]})
