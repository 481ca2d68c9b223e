"""Reading the audit trail: owners/admins see every call of the org, a member only their own;
only owners/admins get a failed call's evidence."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, case, func, or_, select

from treg.context import Services
from treg.errors import BadRequest, NotFound
from treg.identity import Identity
from treg.infra.schema import calls, holds
from treg.jobs import store as job_store

# An async submission's row is written when its answer leaves, its hold still open; the job's polls
# (or the reaper) close the hold later. Its cost and hold state are therefore read from the hold, live,
# by every reader (the list, one call, Activity): the same expressions, so they never disagree.
_job_hold = holds.alias("job_hold")
_JOB_HELD = and_(calls.c.kind == "async_submit", _job_hold.c.id.isnot(None))
#: the FROM of every audit read: the calls, and a submission's hold (the hold's id is its call's id)
CALLS_FROM = calls.outerjoin(_job_hold, and_(_job_hold.c.id == calls.c.id, _job_hold.c.org_id == calls.c.org_id,
                                             calls.c.kind == "async_submit"))
COST = case((_JOB_HELD, case((_job_hold.c.state == "settled", _job_hold.c.settled_micro), else_=0)),
            else_=calls.c.cost_micro).label("cost_micro")
HOLD_STATE = case((_JOB_HELD, _job_hold.c.state), else_=calls.c.hold_state).label("hold_state")

LIST_COLUMNS = (calls.c.id.label("call_id"), calls.c.created_at, calls.c.method, calls.c.target, calls.c.status,
                calls.c.outcome, calls.c.refused_by, calls.c.credential_tier, COST,
                calls.c.duration_ms, calls.c.kind, calls.c.demo)
DETAIL_COLUMNS = LIST_COLUMNS + (calls.c.member_id, calls.c.surface, calls.c.upstream_url, calls.c.tool_id,
                                 calls.c.tool_name, calls.c.provider, calls.c.endpoint_id, calls.c.error_code,
                                 calls.c.blame, HOLD_STATE, calls.c.tag, calls.c.request_bytes,
                                 calls.c.response_bytes, calls.c.ttfb_ms, calls.c.failure_kind,
                                 calls.c.parent_call_id, calls.c.result_state, calls.c.cache_state,
                                 calls.c.credential_kind, calls.c.connection_id, calls.c.hub_ref,
                                 calls.c.hub_caller_org)
MAX_LIMIT = 500
#: ``?kind=``: an async job's calls (docs/lifecycle.md); polls are listed only when asked for by kind
KINDS = ("async_submit", "async_poll", "async_fetch")


def _kind_filter(kind: str | None) -> Any:
    if kind is None:
        return or_(calls.c.kind.is_(None), calls.c.kind != "async_poll")
    if kind not in KINDS:
        raise BadRequest(f"kind must be one of {', '.join(KINDS)}", code="invalid_filter")
    return calls.c.kind == kind


async def _flush(svc: Services) -> None:
    # the writer batches and the settler closes holds after the answers: a reader must see its own
    # calls and what they were charged
    await svc.settler.drain()
    await svc.audit.flush()


async def list_calls(svc: Services, ident: Identity, limit_text: str | None,
                     kind: str | None = None) -> list[dict[str, Any]]:
    try:
        limit = int(limit_text) if limit_text is not None else 50
    except ValueError as exc:
        raise BadRequest("limit must be an integer", code="invalid_limit") from exc
    if not 1 <= limit <= MAX_LIMIT:
        raise BadRequest(f"limit must be between 1 and {MAX_LIMIT}", code="invalid_limit")
    where_kind = _kind_filter(kind)
    await _flush(svc)
    q = select(*LIST_COLUMNS).select_from(CALLS_FROM).where(calls.c.org_id == ident.org_id, where_kind)
    if not ident.is_manager:
        q = q.where(calls.c.member_id == ident.member_id)
    async with svc.db.tx() as tx:
        return await tx.fetch_all(q.order_by(calls.c.created_at.desc(), calls.c.id.desc()).limit(limit))


async def get_call(svc: Services, ident: Identity, call_id: str) -> dict[str, Any]:
    await _flush(svc)
    cols = DETAIL_COLUMNS + ((calls.c.error_request, calls.c.error_response) if ident.is_manager else ())
    q = select(*cols).select_from(CALLS_FROM).where(and_(calls.c.org_id == ident.org_id, calls.c.id == call_id))
    if not ident.is_manager:
        q = q.where(calls.c.member_id == ident.member_id)
    async with svc.db.tx() as tx:
        row = await tx.fetch_one(q)
    if row is None:
        raise NotFound("no such call visible to you", code="call_not_found")
    row.update(await job_store.call_detail(svc, ident.org_id, call_id))  # an async submission: its job
    row["overflow"] = await _overflow_of(svc, ident, call_id)
    return row


async def _overflow_of(svc: Services, ident: Identity, call_id: str) -> dict[str, Any] | None:
    """The call's overflow attempt (its row ``<call_id>:overflow``, treg/call/overflow_stage.py), or None."""
    q = select(calls.c.served_via, calls.c.status, calls.c.cost_micro).where(
        and_(calls.c.org_id == ident.org_id, calls.c.id == call_id + ":overflow"))
    async with svc.db.tx() as tx:
        row = await tx.fetch_one(q)
    if row is None or not (row["served_via"] or "").startswith("overflow:"):
        return None
    return {"aggregator": row["served_via"].split(":", 1)[1], "status": row["status"], "cost_micro": row["cost_micro"]}


#: what the dashboard's Activity page shows per row (the list columns plus what its status column names)
PAGE_COLUMNS = LIST_COLUMNS + (calls.c.member_id, calls.c.surface, calls.c.tool_name, calls.c.provider,
                               calls.c.endpoint_id, calls.c.error_code, HOLD_STATE)
OUTCOMES = ("ok", "upstream_error", "vendor_error", "refused", "gateway_failed", "stream_error", "cancelled",
            "replayed")


@dataclass(frozen=True)
class CallFilter:
    """Activity's filters; every one is optional. ``before`` is the keyset cursor of the page's last row."""

    outcome: str | None = None
    tool: str | None = None
    member_id: str | None = None
    before: str | None = None
    limit: int = 50


def cursor_of(row: dict[str, Any]) -> str:
    return f"{row['created_at'].isoformat()}~{row['call_id']}"


def _parse_cursor(text: str) -> tuple[dt.datetime, str]:
    stamp, sep, call_id = text.partition("~")
    try:
        when = dt.datetime.fromisoformat(stamp)
    except ValueError as exc:
        raise BadRequest("the page cursor is malformed; open the first page again", code="invalid_cursor") from exc
    if not sep or not call_id or when.tzinfo is None:
        raise BadRequest("the page cursor is malformed; open the first page again", code="invalid_cursor")
    return when, call_id


async def page_calls(svc: Services, ident: Identity, f: CallFilter) -> tuple[list[dict[str, Any]], str | None]:
    """One page of the audit trail, newest first, and the cursor of the next (None: last page).

    Keyset, not OFFSET: a page deep in a million rows costs what the first does. The order
    (created_at, id) descending is served by ix_calls_org_id_created_at (or the member / outcome /
    tool_name index of migration 0004 when that filter is set): ``created_at <= t`` bounds the index
    scan, ``created_at < t OR id < i`` breaks ties of one microsecond."""
    if not 1 <= f.limit <= MAX_LIMIT:
        raise BadRequest(f"limit must be between 1 and {MAX_LIMIT}", code="invalid_limit")
    if f.outcome is not None and f.outcome not in OUTCOMES:
        raise BadRequest(f"outcome must be one of {', '.join(OUTCOMES)}", code="invalid_filter")
    await _flush(svc)
    where = [calls.c.org_id == ident.org_id, _kind_filter(None)]
    if not ident.is_manager:
        where.append(calls.c.member_id == ident.member_id)  # a member's filter cannot widen this
    elif f.member_id:
        where.append(calls.c.member_id == f.member_id)
    if f.outcome:
        where.append(calls.c.outcome == f.outcome)
    if f.tool:
        where.append(calls.c.tool_name == f.tool)
    if f.before:
        when, call_id = _parse_cursor(f.before)
        where += [calls.c.created_at <= when, or_(calls.c.created_at < when, calls.c.id < call_id)]
    q = (select(*PAGE_COLUMNS).select_from(CALLS_FROM).where(and_(*where))
         .order_by(calls.c.created_at.desc(), calls.c.id.desc()).limit(f.limit + 1))
    async with svc.db.tx() as tx:
        rows = await tx.fetch_all(q)
    more = len(rows) > f.limit
    rows = rows[:f.limit]
    return rows, (cursor_of(rows[-1]) if more and rows else None)


async def failing_upstreams(svc: Services, ident: Identity, hours: int = 24) -> list[dict[str, Any]]:
    """Providers and tools whose upstream failed in the last ``hours`` (blame ``upstream``), most first;
    scoped like the call list (a member: their own calls)."""
    where = [calls.c.org_id == ident.org_id, calls.c.created_at > func.now() - dt.timedelta(hours=hours),
             calls.c.blame == "upstream"]
    if not ident.is_manager:
        where.append(calls.c.member_id == ident.member_id)
    name = func.coalesce(calls.c.provider, calls.c.tool_name, "(no tool)").label("name")
    await _flush(svc)
    async with svc.db.tx() as tx:
        return await tx.fetch_all(select(name, func.count().label("failures"), func.max(calls.c.created_at)
                                         .label("last_at")).where(and_(*where)).group_by(name)
                                  .order_by(func.count().desc()).limit(10))
