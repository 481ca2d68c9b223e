"""The management API (``/api/v1``): thin handlers that turn HTTP into calls of the domain modules."""

from __future__ import annotations

from aiohttp import web

from treg import authentication, calls, deny_rules, member_limits, membership, org_settings, secrets_store, tools
from treg.context import Services
from treg.errors import BadRequest
from treg.identity import Identity
from treg.keys import SERVICES
from treg.web.jsonio import json_response, read_json_object

routes = web.RouteTableDef()


async def identify(request: web.Request) -> tuple[Services, Identity]:
    svc = request.app[SERVICES]
    ident = await authentication.authenticate(svc, request.headers.get("X-Treg-Token"), request.headers.get("X-Treg-Org"))
    return svc, ident


@routes.get("/api/v1/me")
async def me(request: web.Request) -> web.Response:
    _, ident = await identify(request)
    return json_response({"org_id": ident.org_id, "org_slug": ident.org_slug, "member_id": ident.member_id,
                          "role": ident.role, "email": ident.email,
                          "project_ids": list(ident.project_ids) if ident.project_ids is not None else None})


@routes.post("/api/v1/members")
async def add_member(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response(await membership.add_member(svc, ident, await read_json_object(request)), status=201)


@routes.get("/api/v1/members")
async def list_members(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response({"members": await membership.list_members(svc, ident)})


@routes.get("/api/v1/members/{member_id}/limits")
async def get_member_limits(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response(await member_limits.get_limits(svc, ident, request.match_info["member_id"]))


@routes.put("/api/v1/members/{member_id}/limits")
async def put_member_limits(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response(await member_limits.set_limits(svc, ident, request.match_info["member_id"],
                                                        await read_json_object(request)))


@routes.post("/api/v1/tokens")
async def create_token(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    body = await read_json_object(request) if request.can_read_body else {}  # NewToken's fields only
    member_id = body.get("member_id")
    if member_id is not None and not isinstance(member_id, str):
        raise BadRequest("member_id must be a string", code="invalid_member")
    return json_response(await membership.create_token(svc, ident, member_id, body.get("scope")), status=201)


@routes.get("/api/v1/tokens")
async def list_tokens(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response({"tokens": await membership.list_tokens(svc, ident)})


@routes.delete("/api/v1/tokens/{token_id}")
async def revoke_token(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    await membership.revoke_token(svc, ident, request.match_info["token_id"])
    return web.Response(status=204)


@routes.post("/api/v1/projects")
async def create_project(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response(await membership.create_project(svc, ident, await read_json_object(request)), status=201)


@routes.get("/api/v1/projects")
async def list_projects(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response({"projects": await membership.list_projects(svc, ident)})


@routes.post("/api/v1/secrets")
async def create_secret(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response(await secrets_store.create_secret(svc, ident, await read_json_object(request)), status=201)


@routes.get("/api/v1/secrets")
async def list_secrets(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response({"secrets": await secrets_store.list_secrets(svc, ident)})


@routes.delete("/api/v1/secrets/{secret_id}")
async def delete_secret(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    await secrets_store.delete_secret(svc, ident, request.match_info["secret_id"])
    return web.Response(status=204)


@routes.post("/api/v1/tools")
async def create_tool(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response(await tools.create_tool(svc, ident, await read_json_object(request)), status=201)


@routes.get("/api/v1/tools")
async def list_tools(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response({"tools": await tools.list_tools(svc, ident)})


@routes.get("/api/v1/tools/{tool_id}")
async def get_tool(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response(await tools.get_tool(svc, ident, request.match_info["tool_id"]))


@routes.patch("/api/v1/tools/{tool_id}")
async def update_tool(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response(await tools.update_tool(svc, ident, request.match_info["tool_id"],
                                                 await read_json_object(request)))


@routes.delete("/api/v1/tools/{tool_id}")
async def delete_tool(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    await tools.delete_tool(svc, ident, request.match_info["tool_id"])
    return web.Response(status=204)


@routes.post("/api/v1/deny-rules")
async def create_deny_rule(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response(await deny_rules.create_rule(svc, ident, await read_json_object(request)), status=201)


@routes.get("/api/v1/deny-rules")
async def list_deny_rules(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response({"deny_rules": await deny_rules.list_rules(svc, ident)})


@routes.delete("/api/v1/deny-rules/{rule_id}")
async def delete_deny_rule(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    await deny_rules.delete_rule(svc, ident, request.match_info["rule_id"])
    return web.Response(status=204)


@routes.get("/api/v1/calls")
async def list_calls(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response({"calls": await calls.list_calls(svc, ident, request.query.get("limit"),
                                                                request.query.get("kind"))})


@routes.get("/api/v1/calls/{call_id}")
async def get_call(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response(await calls.get_call(svc, ident, request.match_info["call_id"]))


@routes.get("/api/v1/org")
async def get_org(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response(await org_settings.get_org(svc, ident))


@routes.patch("/api/v1/org")
async def update_org(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response(await org_settings.update_org(svc, ident, await read_json_object(request)))
