"""The public demo (docs/sharing.md "The public demo"): an org the operator runs as a demo, the tokens a
web page may publish, and the two limits that keep a visitor from running up treg's vendor bill.

* ``treg demo enable|disable --org SLUG`` (:func:`set_enabled`) flips ``orgs.public_demo`` through
  ``org_changes.changes``, so every process drops the org's cached identities at once: a disabled demo's
  tokens answer 403 ``demo_disabled`` on their next request (treg/authentication.py), enabling it again
  revives them.
* ``treg demo token --org SLUG`` (:func:`issue_token`) issues a ``demo``-scoped token for the org's
  first owner, shown once. A demo token is never a manager (``Identity.is_manager``) and no management
  route, dashboard or MCP endpoint admits it.
* The hourly limit (:func:`admit`): at most ``TREG_DEMO_CALLS_PER_HOUR`` demo calls per client address in
  any sliding hour, exact across processes: each admitted call is a ``demo_calls`` row, counted under a
  transaction-scoped advisory lock of the (org, client) pair, and a call refused afterwards before any
  vendor contact gives its row back (:func:`give_back`): refused calls do not count.
* The daily budget (:func:`budget_refusal`): the demo org's spend of the UTC day is capped at
  ``TREG_DEMO_DAILY_BUDGET_MICRO`` by the hold itself (``money.place_hold(extra_cap_micro=…)``): a call
  whose hold would pass it is refused, 429 ``demo_budget_spent``, in the statement that would place it.

The client address is :func:`treg.forwarded.demo_client`: the one the access log reads
(``treg.forwarded.client_address``: the peer, or, only when the peer is a trusted proxy, its
``X-Forwarded-For`` read from the right); an IPv6 client counts by its /64.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from sqlalchemy import and_, func, select, update

from treg import membership
from treg.authentication import DEMO_HEADER
from treg.context import Services
from treg.errors import NotFound, TregError
from treg.identity import DEMO
from treg.infra.schema import members, orgs, tokens
from treg.org_changes import changes

#: the sliding window of the hourly limit
WINDOW_S = 3600
#: the namespace of the advisory locks of :func:`admit` (two-key form: its keys never meet one-key locks)
_LOCK_SPACE = 0x7DE0


async def _org(svc: Services, slug: str) -> dict[str, Any]:
    async with svc.db.tx() as tx:
        row = await tx.fetch_one(select(orgs.c.id, orgs.c.slug, orgs.c.public_demo).where(orgs.c.slug == slug))
    if row is None:
        raise NotFound(f"no org with slug {slug!r}", code="org_not_found")
    return row


async def set_enabled(svc: Services, slug: str, enabled: bool) -> dict[str, Any]:
    """``treg demo enable|disable``: ``{org, public_demo}``. Every process drops the org's cached
    identities (its demo tokens are judged again on their next request)."""
    org = await _org(svc, slug)
    async with changes(svc, "tokens", org["id"]) as tx:
        await tx.execute(update(orgs).where(orgs.c.id == org["id"]).values(public_demo=enabled))
    return {"org": slug, "public_demo": enabled}


async def issue_token(svc: Services, slug: str) -> dict[str, Any]:
    """``treg demo token``: a new ``demo``-scoped token of the org (for its first owner), shown once:
    ``{token, org, public_demo}`` (``public_demo`` false: it answers ``demo_disabled`` until enabled)."""
    org = await _org(svc, slug)
    async with svc.db.tx() as tx:
        owner = await tx.scalar(select(members.c.id).where(and_(members.c.org_id == org["id"],
                                                                members.c.role == "owner"))
                                .order_by(members.c.created_at, members.c.id).limit(1))
        if owner is None:
            raise NotFound(f"the org {slug!r} has no owner to issue a demo token for", code="member_not_found")
        token = await membership.issue_token(tx, org_id=org["id"], member_id=owner, scope=DEMO)
    return {"token": token, "org": slug, "public_demo": org["public_demo"]}


async def status(svc: Services, org_id: str) -> dict[str, Any]:
    """The demo as the dashboard's Org page shows it: on or off, its limits and its live demo tokens
    (the spend of the day the budget counts is the org's, ``money.balance``)."""
    async with svc.db.tx() as tx:
        enabled = await tx.scalar(select(orgs.c.public_demo).where(orgs.c.id == org_id))
        live = await tx.scalar(select(func.count()).select_from(tokens).where(and_(
            tokens.c.org_id == org_id, tokens.c.scope == DEMO, tokens.c.revoked_at.is_(None))))
    s = svc.settings
    return {"public_demo": bool(enabled), "endpoints": list(s.demo_endpoints), "calls_per_hour": s.demo_calls_per_hour,
            "daily_budget_micro": s.demo_daily_budget_micro, "demo_tokens": int(live or 0)}


# -- the hourly limit ------------------------------------------------------------------------------

_ADMIT_SQL = """
SELECT pg_advisory_xact_lock(%(space)s, hashtext(%(org)s || '/' || %(client)s));
"""
_TRIM_SQL = ("DELETE FROM demo_calls WHERE org_id = %(org)s AND client = %(client)s "
             "AND at <= clock_timestamp() - make_interval(secs => %(window)s)")
_COUNT_SQL = ("SELECT count(*) AS n, extract(epoch FROM min(at) + make_interval(secs => %(window)s) "
              "- clock_timestamp()) AS retry FROM demo_calls WHERE org_id = %(org)s AND client = %(client)s")
_INSERT_SQL = ("INSERT INTO demo_calls (call_id, org_id, client, at) "
               "VALUES (%(call)s, %(org)s, %(client)s, clock_timestamp())")


def rate_limited(limit: int, retry_after_s: int) -> TregError:
    return TregError(f"this address made {limit} public demo calls in the last hour, the most it may "
                     f"(TREG_DEMO_CALLS_PER_HOUR); retry in {retry_after_s} s", code="demo_rate_limited", status=429,
                     blame="caller", refused_by="demo", limit=limit, retry_after_s=retry_after_s,
                     headers={"Retry-After": str(retry_after_s), DEMO_HEADER[0]: DEMO_HEADER[1]})


async def admit(svc: Services, *, org_id: str, client: str, call_id: str) -> None:
    """Count this call against ``client``'s sliding hour, or refuse it (429 ``demo_rate_limited``, not
    counted). One short transaction; concurrent calls of one client, in any process, queue on its lock."""
    limit = max(0, int(svc.settings.demo_calls_per_hour))
    params = {"space": _LOCK_SPACE, "org": org_id, "client": client, "call": call_id, "window": float(WINDOW_S)}
    async with svc.db.tx() as tx:
        await tx.execute(_ADMIT_SQL, params)
        await tx.execute(_TRIM_SQL, params)  # what left the window (the reaper sweeps clients gone quiet)
        row = await tx.fetch_one(_COUNT_SQL, params)
        assert row is not None
        if row["n"] >= limit:
            # the oldest call in the window leaves it first; a limit of 0 (no calls at all): a whole window
            retry = WINDOW_S if row["retry"] is None else max(1, math.ceil(float(row["retry"])))
            raise rate_limited(limit, retry)
        await tx.execute(_INSERT_SQL, params)


async def give_back(svc: Services, call_id: str) -> None:
    """A call counted by :func:`admit` and then refused before any vendor contact: it does not count."""
    async with svc.db.tx() as tx:
        await tx.execute("DELETE FROM demo_calls WHERE call_id = %(call)s", {"call": call_id})


async def prune(svc: Services) -> int:
    """The reaper's sweep: rows that left every window (the clients that did not come back)."""
    async with svc.db.tx() as tx:
        return await tx.execute("DELETE FROM demo_calls WHERE at <= now() - make_interval(secs => %(window)s)",
                                {"window": float(WINDOW_S)})


# -- the daily budget ------------------------------------------------------------------------------

def _next_midnight(now: dt.datetime | None = None) -> dt.datetime:
    now = now or dt.datetime.now(dt.timezone.utc)
    return dt.datetime.combine(now.date() + dt.timedelta(days=1), dt.time(), tzinfo=dt.timezone.utc)


def budget_refusal(needed: int, available: int) -> TregError:
    """``money.place_hold``'s ``extra_refusal``: this hold would pass the demo's budget of the day."""
    resets = _next_midnight()
    retry = max(1, math.ceil((resets - dt.datetime.now(dt.timezone.utc)).total_seconds()))
    return TregError(f"the public demo spent its budget for today (TREG_DEMO_DAILY_BUDGET_MICRO): this call "
                     f"needs {needed} micro-USD, {max(0, available)} are left; it resets at midnight UTC",
                     code="demo_budget_spent", status=429, blame="caller", refused_by="demo",
                     needed_micro=needed, available_micro=max(0, available),
                     resets_at=resets.isoformat().replace("+00:00", "Z"), retry_after_s=retry,
                     headers={"Retry-After": str(retry), DEMO_HEADER[0]: DEMO_HEADER[1]})
