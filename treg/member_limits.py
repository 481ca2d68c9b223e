"""A member's call cap: how many calls a member may make a UTC day, billed or not (docs/money.md "Call
caps"; sharing.md "Member caps cover unbilled calls").

The money limits (treg/money/limits.py) bound what a member spends on treg's key; this one bounds how
many calls a member makes at all, on every tier and every surface, own tools included: a runaway agent
on the team's own key costs the team its vendor quota, not treg's credits.

* The cap lives on the member's row (``members.calls_per_day``) and is read with the identity
  (treg/authentication.py, treg/ui_sessions.py), so a member without one costs a call no query at all.
* A capped member's calls are counted per UTC day in ``member_calls`` by **one statement**
  (:data:`COUNT_SQL`): a conditional upsert that adds the call only while the day's count is under the
  cap. PostgreSQL's row lock on the day's row serialises concurrent calls of every process, so a cap of
  N lets exactly N calls through, however many treg processes share the database. Its text is fixed at
  import and sent with :meth:`treg.infra.db.Database.run` (one round trip), as the money path's are.
* The day is the database's (``now()`` in UTC), so every process agrees on when it resets: the next UTC
  midnight (``resets_at``).
* A call refused after it was counted (a later gate, a 402, an idempotency conflict) gives its count back
  (:func:`give_back`, one statement on the refusal's path only): refused calls do not count.

Owners and admins set a cap (``PUT /api/v1/members/{id}/limits``); ``null`` removes it; 0 refuses every
call. An admin cannot cap an owner (an owner can).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, select, update

from treg.context import Services
from treg.errors import BadRequest, Forbidden, NotFound, TregError
from treg.identity import Identity, require_manager
from treg.infra.schema import member_caps, members
from treg.management import refuse_unknown_fields
from treg.org_changes import changes

#: the largest cap accepted: more calls a day than any member could make; a bigger number is a typo
MAX_CALLS_PER_DAY = 1_000_000_000
#: what the cap's round trips are counted as in ``Database.round_trips_of``
PATH = "call_caps"

#: count the call when the member's count of today is under the cap; one statement, one round trip. The
#: data-modifying CTE's row lock serialises concurrent calls (their WHERE re-reads the latest count), and
#: the outer SELECT reads the count as it was before this statement (a refusal's ``used``). A cap of 0
#: inserts nothing: no call passes.
COUNT_SQL = (
    "WITH today AS (SELECT (now() AT TIME ZONE 'UTC')::date AS day), "
    "bumped AS (INSERT INTO member_calls AS c (member_id, day, org_id, calls) "
    "SELECT %(member)s, today.day, %(org)s, 1 FROM today WHERE %(cap)s > 0 "
    "ON CONFLICT (member_id, day) DO UPDATE SET calls = c.calls + 1 WHERE c.calls < %(cap)s "
    "RETURNING c.calls) "
    "SELECT (SELECT calls FROM bumped), "
    "(SELECT m.calls FROM member_calls m WHERE m.member_id = %(member)s AND m.day = today.day), "
    "today.day, (today.day + 1)::timestamp AT TIME ZONE 'UTC' FROM today")
#: a refused call's count given back, on the day it was counted (never below zero)
GIVE_BACK_SQL = ("UPDATE member_calls SET calls = calls - 1 "
                 "WHERE member_id = %(member)s AND day = %(day)s AND calls > 0")
#: the day's rows older than a week are no one's business (the reaper prunes them)
PRUNE_SQL = "DELETE FROM member_calls WHERE day < (now() AT TIME ZONE 'UTC')::date - 7"
#: a member's count of today and when it resets (the limits' answer)
TODAY_SQL = ("SELECT (SELECT calls FROM member_calls WHERE member_id = %(member)s "
             "AND day = (now() AT TIME ZONE 'UTC')::date), "
             "((now() AT TIME ZONE 'UTC')::date + 1)::timestamp AT TIME ZONE 'UTC'")


class MemberCallCap(TregError):
    """429: the member made as many calls today (UTC) as their cap allows."""

    status, code, blame = 429, "member_call_cap", "caller"


@dataclass(frozen=True)
class Counted:
    """A call counted against its member's cap: what :func:`give_back` needs to take it back."""

    member_id: str
    day: datetime.date


def _iso(when: datetime.datetime) -> str:
    return when.astimezone(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def refusal(cap: int, used: int, resets_at: datetime.datetime) -> MemberCallCap:
    now = datetime.datetime.now(datetime.timezone.utc)
    retry = max(1, int((resets_at - now).total_seconds()) + 1)
    return MemberCallCap(
        f"your cap of {cap} call(s) a day (UTC) is reached ({used} made today); it resets at {_iso(resets_at)}. "
        "An owner or admin can raise it (PUT /api/v1/members/{id}/limits)", refused_by="member_cap",
        limit=cap, used=used, resets_at=_iso(resets_at), headers={"Retry-After": str(retry)})


async def count_call(svc: Services, *, org_id: str, member_id: str, cap: int) -> Counted:
    """Count one call of a capped member, or raise :class:`MemberCallCap` (nothing counted)."""
    (bumped, used, day, resets_at), = await svc.db.run(
        COUNT_SQL, {"member": member_id, "org": org_id, "cap": cap}, path=PATH)
    if bumped is None:
        raise refusal(cap, used or 0, resets_at)
    return Counted(member_id, day)


async def give_back(svc: Services, counted: Counted) -> None:
    await svc.db.run(GIVE_BACK_SQL, {"member": counted.member_id, "day": counted.day}, path=PATH)


async def prune(svc: Services) -> None:
    await svc.db.run(PRUNE_SQL, {}, path=PATH)


# -- management (owner/admin) ------------------------------------------------------------------------

def check_calls_per_day(value: Any) -> int | None:
    """A cap from a request body: a whole number of calls, 0 to :data:`MAX_CALLS_PER_DAY`, or null."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_CALLS_PER_DAY:
        raise BadRequest(f"calls_per_day must be a whole number of calls between 0 and {MAX_CALLS_PER_DAY}, "
                         "or null to remove the cap", code="invalid_limit")
    return value


async def _limits(svc: Services, org_id: str, member_id: str, calls_per_day: int | None) -> dict[str, Any]:
    (used, resets_at), = await svc.db.run(TODAY_SQL, {"member": member_id}, path=PATH)
    async with svc.db.tx() as tx:
        money_cap = await tx.scalar(select(member_caps.c.daily_cap_micro).where(and_(
            member_caps.c.member_id == member_id, member_caps.c.org_id == org_id)))
    return {"member_id": member_id, "calls_per_day": calls_per_day, "calls_today": used or 0,
            "resets_at": _iso(resets_at), "daily_cap_micro": money_cap}


async def _member_row(svc: Services, org_id: str, member_id: str) -> dict[str, Any]:
    async with svc.db.tx() as tx:
        row = await tx.fetch_one(select(members.c.id, members.c.role, members.c.calls_per_day).where(
            and_(members.c.id == member_id, members.c.org_id == org_id)))
    if row is None:
        raise NotFound("no such member in this org", code="member_not_found")
    return row


async def get_limits(svc: Services, ident: Identity, member_id: str) -> dict[str, Any]:
    """A member's limits: their call cap, today's calls and when they reset, their daily money cap
    (yourself, or any member for an owner or admin)."""
    if member_id != ident.member_id:
        require_manager(ident)
    row = await _member_row(svc, ident.org_id, member_id)
    return await _limits(svc, ident.org_id, member_id, row["calls_per_day"])


async def set_limits(svc: Services, ident: Identity, member_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """``{"calls_per_day": N | null}`` for one member of the org; the member's limits as they now stand."""
    require_manager(ident)
    refuse_unknown_fields(body, ("calls_per_day",), "a member's limits")
    if "calls_per_day" not in body:
        raise BadRequest("send {\"calls_per_day\": N} (or null to remove the cap)", code="invalid_limit")
    cap = check_calls_per_day(body["calls_per_day"])
    # the identity cache holds the cap: the write drops the org's cached identities in every process
    async with changes(svc, "members", ident.org_id) as tx:
        row = await tx.fetch_one(select(members.c.role).where(and_(members.c.id == member_id,
                                                                   members.c.org_id == ident.org_id))
                                 .with_for_update())
        if row is None:
            raise NotFound("no such member in this org", code="member_not_found")
        if row["role"] == "owner" and ident.role != "owner":
            raise Forbidden("only an owner may limit an owner", code="forbidden_role")
        await tx.execute(update(members).where(members.c.id == member_id).values(calls_per_day=cap))
    return await _limits(svc, ident.org_id, member_id, cap)
