"""``/api/v1/oauth-apps/<provider>`` and ``/api/v1/connections``: thin handlers over treg/oauth
(docs/oauth.md). The URLs a connection hands out (``connect_url``) and the origin ``redirect_after`` must
be on are treg's own (TREG_PUBLIC_URL, else the address this request came in on; never the Host header)."""

from __future__ import annotations

from aiohttp import web

from treg.keys import SETTINGS
from treg.oauth import apps, manage, store
from treg.origin import note_listen, own_base, own_origins
from treg.web.api import identify
from treg.web.jsonio import json_response, read_json_object

routes = web.RouteTableDef()


def _sockname(request: web.Request) -> object:
    return request.transport.get_extra_info("sockname") if request.transport is not None else None


def base_of(request: web.Request) -> str:
    """treg's own base URL for this request; noted for the domain code that builds links further down
    (a re-consent link of a refresh that met invalid_grant)."""
    sockname = _sockname(request)
    note_listen(sockname)
    return own_base(request.app[SETTINGS], sockname)


@routes.put("/api/v1/oauth-apps/{provider}")
async def put_oauth_app(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response(await apps.put_app(svc, ident, request.match_info["provider"],
                                            await read_json_object(request)))


@routes.get("/api/v1/oauth-apps/{provider}")
async def get_oauth_app(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response(await apps.get_app(svc, ident, request.match_info["provider"]))


@routes.delete("/api/v1/oauth-apps/{provider}")
async def delete_oauth_app(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    await apps.delete_app(svc, ident, request.match_info["provider"])
    return web.Response(status=204)


@routes.post("/api/v1/connections")
async def create_connection(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    body = await read_json_object(request)
    out = await store.create_connection(svc, ident, body, base=base_of(request),
                                        own=own_origins(request.app[SETTINGS], _sockname(request)))
    return json_response(out, status=201)


@routes.get("/api/v1/connections")
async def list_connections(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response({"connections": await store.list_connections(svc, ident, base_of(request))})


@routes.get("/api/v1/connections/{connection_id}")
async def get_connection(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response(await store.get_connection(svc, ident, request.match_info["connection_id"],
                                                    base_of(request)))


@routes.delete("/api/v1/connections/{connection_id}")
async def delete_connection(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    await manage.delete_connection(svc, ident, request.match_info["connection_id"])
    return web.Response(status=204)


@routes.post("/api/v1/connections/{connection_id}/refresh")
async def refresh_connection(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response(await manage.refresh_connection(svc, ident, request.match_info["connection_id"],
                                                         base_of(request)))
