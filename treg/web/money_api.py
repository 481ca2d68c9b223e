"""Money routes of the management API (docs/money.md): the balance, the limits, the credit ledger."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from treg import money
from treg.errors import BadRequest
from treg.identity import require_manager
from treg.money import limits
from treg.web.api import identify
from treg.web.jsonio import json_response, read_json_object

routes = web.RouteTableDef()


def _limit_from(body: dict[str, Any], key: str) -> int | None:
    if key not in body:
        raise BadRequest(f'send {{"{key}": <micro-USD>}}, or {{"{key}": null}} to remove the limit',
                         code="invalid_limit")
    return limits.check_limit(body[key], key)


@routes.get("/api/v1/balance")
async def get_balance(request: web.Request) -> web.Response:
    """Any member may read it: a caller refused with 402 must be able to see why."""
    svc, ident = await identify(request)
    out = (await money.balance(svc, ident.org_id)).as_dict()
    out["member"] = await limits.member_today(svc, ident.org_id, ident.member_id)
    return json_response(out)


@routes.get("/api/v1/limits")
async def get_limits(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    return json_response(await limits.get_limits(svc, ident))


@routes.put("/api/v1/limits/daily-cap")
async def put_daily_cap(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    require_manager(ident)
    micro = _limit_from(await read_json_object(request), "micro")
    return json_response(await limits.set_daily_cap(svc, ident, micro))


@routes.put("/api/v1/limits/tags/{tag}")
async def put_tag_budget(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    require_manager(ident)
    tag = limits.check_tag(request.match_info["tag"])
    budget = _limit_from(await read_json_object(request), "budget_micro")
    return json_response(await limits.set_tag_budget(svc, ident, tag, budget))


@routes.put("/api/v1/limits/members/{member_id}")
async def put_member_cap(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    require_manager(ident)
    cap = _limit_from(await read_json_object(request), "daily_cap_micro")
    return json_response(await limits.set_member_cap(svc, ident, request.match_info["member_id"], cap))


@routes.get("/api/v1/credits")
async def list_credits(request: web.Request) -> web.Response:
    """The org's credit ledger (operator grants and the trial allowance), newest first."""
    svc, ident = await identify(request)
    require_manager(ident)
    return json_response({"grants": await money.list_grants(svc, ident.org_id)})
