"""Spending limits: the org's daily cap, tag budgets and per-member daily caps.

Checked when a hold is placed, by the one statement that places it (``treg_place_hold``, installed by
migration 0015; treg.money.holds), under the org's account lock, in this order; the first one that
refuses names itself in the 402:

1. ``balance``    — the org's available balance (``insufficient_balance``);
2. ``daily_cap``  — the org's settled + held spend of the current UTC day;
3. ``tag_budget`` — the tag's (``X-Treg-Tag``) settled + held spend, over its whole life;
4. ``member_cap`` — the member's settled + held spend of the current UTC day.

Owners and admins set them (``PUT /api/v1/limits/…``); ``null`` removes a limit.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

from sqlalchemy import and_, delete, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from treg.context import Services
from treg.errors import BadRequest, NotFound, PaymentRequired
from treg.identity import Identity, require_manager
from treg.infra.schema import member_caps, members, money_daily, org_balances, tag_budgets
from treg.money.ledger import ORG_SCOPE, TODAY, lock_account

# A tag is a short label: visible ASCII without spaces (it travels in a header and in URLs).
_TAG = re.compile(r"\A[\x21-\x7e]{1,200}\Z")
#: the largest limit accepted (1 000 000 USD); anything bigger is a typo
MAX_LIMIT_MICRO = 1_000_000 * 1_000_000


def valid_tag(tag: Any) -> bool:
    return isinstance(tag, str) and _TAG.fullmatch(tag) is not None


def check_tag(tag: Any) -> str:
    if not valid_tag(tag):
        raise BadRequest("a tag (X-Treg-Tag) is 1-200 visible ASCII characters without spaces", code="invalid_tag")
    return tag


def check_limit(value: Any, key: str) -> int | None:
    """A limit from a request body: a non-negative integer of micro-USD, or null to remove it."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_LIMIT_MICRO:
        raise BadRequest(f"{key} must be an integer number of micro-USD between 0 and {MAX_LIMIT_MICRO}, or null "
                         "to remove the limit", code="invalid_limit")
    return value


def refusal(code: str, limit: str, needed: int, available: int, detail: str, **extra: Any) -> PaymentRequired:
    return PaymentRequired(detail, code=code, limit=limit, needed_micro=needed, available_micro=max(0, available),
                           **extra)


def hold_refusal(limit: str, needed: int, available: int, cap: int | None, *, tag: str | None,
                 member_id: str | None) -> PaymentRequired:
    """The 402 of the limit that refused a hold (``treg_place_hold`` names it; ``cap`` is its value)."""
    if limit == "balance":
        return refusal("insufficient_balance", "balance", needed, available,
                       f"this call may cost up to {needed} micro-USD but the org has {max(0, available)} available; "
                       "ask the operator for credits (treg credits grant)")
    if limit == "daily_cap":
        return refusal("daily_cap", "daily_cap", needed, available,
                       f"the org's daily cap of {cap} micro-USD leaves {max(0, available)} for today (UTC); this call "
                       f"may cost up to {needed}. An owner or admin can raise it (PUT /api/v1/limits/daily-cap)")
    if limit == "tag_budget":
        return refusal("tag_budget", "tag_budget", needed, available,
                       f"the budget of tag {tag!r} ({cap} micro-USD) has {max(0, available)} left; "
                       f"this call may cost up to {needed}. An owner or admin can raise it "
                       "(PUT /api/v1/limits/tags/{tag})", tag=tag)
    assert limit == "member_cap", limit
    return refusal("member_cap", "member_cap", needed, available,
                   f"your daily cap of {cap} micro-USD leaves {max(0, available)} for today (UTC); this call "
                   f"may cost up to {needed}. An owner or admin can raise it "
                   "(PUT /api/v1/limits/members/{member_id})", member_id=member_id)


# -- management (owner/admin) ------------------------------------------------------------------------

async def set_daily_cap(svc: Services, ident: Identity, micro: int | None) -> dict[str, Any]:
    require_manager(ident)
    async with svc.db.tx() as tx:
        await lock_account(tx, svc, ident.org_id)
        await tx.execute(update(org_balances).where(org_balances.c.org_id == ident.org_id)
                         .values(daily_cap_micro=micro, updated_at=func.now()))
    return {"daily_cap_micro": micro}


async def set_tag_budget(svc: Services, ident: Identity, tag: str, budget: int | None) -> dict[str, Any]:
    require_manager(ident)
    tag = check_tag(tag)
    async with svc.db.tx() as tx:
        await lock_account(tx, svc, ident.org_id)
        row = await tx.fetch_one(
            pg_insert(tag_budgets).values(org_id=ident.org_id, tag=tag, budget_micro=budget)
            .on_conflict_do_update(index_elements=[tag_budgets.c.org_id, tag_budgets.c.tag],
                                   set_={"budget_micro": budget, "updated_at": func.now()})
            .returning(tag_budgets.c.tag, tag_budgets.c.budget_micro, tag_budgets.c.spent_micro,
                       tag_budgets.c.held_micro))
    assert row is not None
    return row


async def set_member_cap(svc: Services, ident: Identity, member_id: str, cap: int | None) -> dict[str, Any]:
    require_manager(ident)
    async with svc.db.tx() as tx:
        await lock_account(tx, svc, ident.org_id)
        known = await tx.scalar(select(members.c.id).where(and_(members.c.id == member_id,
                                                                members.c.org_id == ident.org_id)))
        if known is None:
            raise NotFound("no such member in this org", code="member_not_found")
        if cap is None:
            await tx.execute(delete(member_caps).where(member_caps.c.member_id == member_id))
        else:
            await tx.execute(pg_insert(member_caps).values(member_id=member_id, org_id=ident.org_id,
                                                           daily_cap_micro=cap)
                             .on_conflict_do_update(index_elements=[member_caps.c.member_id],
                                                    set_={"daily_cap_micro": cap, "updated_at": func.now()}))
    return {"member_id": member_id, "daily_cap_micro": cap}


async def member_today(svc: Services, org_id: str, member_id: str) -> dict[str, Any]:
    """A member's cap and spend of the current UTC day."""
    await svc.settler.drain()
    async with svc.db.tx() as tx:
        cap = await tx.scalar(select(member_caps.c.daily_cap_micro).where(and_(
            member_caps.c.member_id == member_id, member_caps.c.org_id == org_id)))
        row = await tx.fetch_one(select(money_daily.c.spent_micro, money_daily.c.held_micro).where(and_(
            money_daily.c.org_id == org_id, money_daily.c.day == TODAY, money_daily.c.scope == member_id)))
    return {"member_id": member_id, "daily_cap_micro": cap,
            "spent_today_micro": row["spent_micro"] if row else 0,
            "held_today_micro": row["held_micro"] if row else 0}


async def get_limits(svc: Services, ident: Identity) -> dict[str, Any]:
    require_manager(ident)
    await svc.settler.drain()
    async with svc.db.tx() as tx:
        account = await lock_account(tx, svc, ident.org_id, lock=False)
        day: datetime.date = account["today"]
        caps = await tx.fetch_all(select(member_caps.c.member_id, member_caps.c.daily_cap_micro)
                                  .where(member_caps.c.org_id == ident.org_id).order_by(member_caps.c.member_id))
        usage = {r["scope"]: r for r in await tx.fetch_all(
            select(money_daily.c.scope, money_daily.c.spent_micro, money_daily.c.held_micro)
            .where(and_(money_daily.c.org_id == ident.org_id, money_daily.c.day == day)))}
        tags = await tx.fetch_all(select(tag_budgets.c.tag, tag_budgets.c.budget_micro, tag_budgets.c.spent_micro,
                                         tag_budgets.c.held_micro)
                                  .where(tag_budgets.c.org_id == ident.org_id).order_by(tag_budgets.c.tag))
    org_usage = usage.get(ORG_SCOPE)
    return {
        "day": day.isoformat(),
        "daily_cap_micro": account["daily_cap_micro"],
        "spent_today_micro": org_usage["spent_micro"] if org_usage else 0,
        "held_today_micro": org_usage["held_micro"] if org_usage else 0,
        "members": [{"member_id": c["member_id"], "daily_cap_micro": c["daily_cap_micro"],
                     "spent_today_micro": usage[c["member_id"]]["spent_micro"] if c["member_id"] in usage else 0,
                     "held_today_micro": usage[c["member_id"]]["held_micro"] if c["member_id"] in usage else 0}
                    for c in caps],
        "tags": tags,
    }
