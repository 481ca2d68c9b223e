"""The ``async_jobs`` table: one row per vendor job a platform-tier submission started.

Each function is one short transaction (never held across an upstream call). Money follows the job:
the submission's hold (id = the submission's call id) stays open while the job is pending and is closed
by :func:`finish` in the same transaction that marks the job, through the holds' own conditional close
(``UPDATE … WHERE state = 'held'``), so however many polls read a terminal status, concurrently or
not, the hold is settled or released once. Lock order is money's (``treg/money/holds.py``): the org's
balance row, then the hold, then the job row.
"""

from __future__ import annotations

import enum
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from sqlalchemy import and_, func, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from treg.context import Services
from treg.ids import new_id
from treg.infra.schema import async_job_utilities, async_jobs, holds
from treg.catalog.async_jobs import JobTerms, UtilityUse
from treg.org_changes import forget_local, notify
# the holds' one conditional close, inside this module's transaction (the reaper uses it the same way)
from treg.money.holds import RELEASED, SETTLED, Close, close_in

PENDING, DONE, FAILED, EXPIRED = "pending", "done", "failed", "expired"
#: a task or fetch id longer than this is not recorded (the column's width)
ID_MAX = 500
#: the cache tag (an "org" no org id can be) of the utilities view: a NOTIFY of it drops the view in
#: every process (treg/cache.py's listener), sent only when a job names a utility the table lacked
UTILITIES_TAG = "*async_job_utilities"
_UTILITIES_KEY = ("async_job_utilities",)


class Recorded(str, enum.Enum):
    NEW = "new"
    #: the vendor answered with a task id this org already owns (its own retried submission)
    SAME_ORG = "same_org"
    #: a task id another org owns: never handed over
    FOREIGN = "foreign"


async def record(svc: Services, *, org_id: str, member_id: str | None, provider: str, endpoint_id: str,
                 task_id: str, call_id: str, poll: str, fetch: str | None, terms: JobTerms,
                 tag: str | None = None) -> Recorded:
    """Record the job (the submission's hold stays open under ``call_id``; ``tag``: its pin) with the
    ``terms`` its polls read and settle by, and its utilities in ``async_job_utilities``: one
    transaction, so no job exists whose poll or fetch is not owner-only everywhere."""
    uses = [(poll, terms.uses("poll"))] + ([(fetch, terms.uses("fetch"))] if fetch is not None else [])
    known = await utility_uses(svc)  # read before the transaction: never a second connection inside it
    # a use this process knows is in the table already (the view is read from it)
    uses = [(uid, use) for uid, use in uses if use not in known.get(uid, ())]
    new_use = False
    async with svc.db.tx() as tx:
        row = await tx.fetch_one(
            pg_insert(async_jobs).values(id=new_id("job"), org_id=org_id, member_id=member_id, provider=provider,
                                         endpoint_id=endpoint_id, task_id=task_id, call_id=call_id,
                                         poll_endpoint=poll, fetch_endpoint=fetch, state=PENDING, tag=tag,
                                         terms=terms.to_json())
            .on_conflict_do_nothing(index_elements=[async_jobs.c.provider, async_jobs.c.task_id])
            .returning(async_jobs.c.id))
        if row is None:
            owner = await tx.scalar(select(async_jobs.c.org_id).where(and_(async_jobs.c.provider == provider,
                                                                           async_jobs.c.task_id == task_id)))
            return Recorded.SAME_ORG if owner == org_id else Recorded.FOREIGN
        for uid, use in uses:
            added = await tx.fetch_one(
                pg_insert(async_job_utilities).values(endpoint_id=uid, kind=use.kind, task_param=use.task_param,
                                                      by_result_id=use.by_result_id)
                .on_conflict_do_nothing().returning(async_job_utilities.c.endpoint_id))
            new_use = new_use or added is not None
        if new_use:
            await notify(tx, "async_jobs", UTILITIES_TAG)  # delivered on commit: every process reloads
    if new_use:
        forget_local(svc, UTILITIES_TAG)
    return Recorded.NEW


async def utility_uses(svc: Services) -> Mapping[str, tuple[UtilityUse, ...]]:
    """Every way a recorded job may be read, by poll/fetch endpoint id: the whole (tiny) table, cached
    in the process and dropped by a NOTIFY when a job names a new one (with the caches off: read)."""
    cache = svc.caches.jobs
    hit = cache.get(_UTILITIES_KEY)
    if hit is not None:
        return hit  # type: ignore[no-any-return]
    return await cache.get_or_load(_UTILITIES_KEY, UTILITIES_TAG, lambda: _load_uses(svc))


async def _load_uses(svc: Services) -> Mapping[str, tuple[UtilityUse, ...]]:
    t = async_job_utilities.c
    async with svc.db.tx() as tx:
        rows = await tx.fetch_all(select(t.endpoint_id, t.kind, t.task_param, t.by_result_id)
                                  .order_by(t.endpoint_id, t.created_at, t.task_param))
    out: dict[str, list[UtilityUse]] = {}
    for r in rows:
        out.setdefault(r["endpoint_id"], []).append(UtilityUse(r["kind"], r["task_param"] or None,
                                                               bool(r["by_result_id"])))
    return MappingProxyType({k: tuple(v) for k, v in out.items()})


async def find_owned(svc: Services, *, org_id: str, provider: str, utility: str, kind: str, value: str,
                     by_result_id: bool) -> dict[str, Any] | None:
    """The caller's org's job that ``utility`` (a poll or fetch endpoint id) may read with ``value``: a
    task id, or on a fetch by result id a fetch id learned from a done poll. None: not owned (unknown,
    another org's, another provider's, or a utility the job was not submitted with)."""
    where = [async_jobs.c.org_id == org_id, async_jobs.c.provider == provider]
    if kind == "poll":
        where += [async_jobs.c.poll_endpoint == utility, async_jobs.c.task_id == value]
    elif by_result_id:
        where += [async_jobs.c.fetch_endpoint == utility, async_jobs.c.fetch_ids.contains([value])]
    else:
        where += [async_jobs.c.fetch_endpoint == utility, async_jobs.c.task_id == value]
    async with svc.db.tx() as tx:
        return await tx.fetch_one(select(async_jobs).where(and_(*where)).limit(1))


async def finish(svc: Services, job: dict[str, Any], terminal: str, *, settle_micro: int = 0,
                 fetch_ids: Iterable[str] = ()) -> bool:
    """A poll read a terminal status: settle (``done``, at ``settle_micro``, capped at the hold) or
    release (``failed``) the submission's hold, mark the job, keep the learned fetch ids. True when this
    call closed the hold; False when it was closed already (an earlier poll, the reaper, price_on submit)."""
    assert terminal in (DONE, FAILED)
    async with svc.db.tx() as tx:
        closed = bool(await close_in(tx, [Close(job["call_id"], SETTLED if terminal == DONE else RELEASED,
                                                settle_micro if terminal == DONE else 0)]))
        current = await tx.fetch_one(select(async_jobs.c.state, async_jobs.c.fetch_ids)
                                     .where(async_jobs.c.id == job["id"]).with_for_update())
        if current is None:
            return closed
        known = list(current["fetch_ids"] or ())
        learned = known + [f for f in dict.fromkeys(fetch_ids) if f not in known]
        values: dict[str, Any] = {"fetch_ids": learned, "updated_at": func.now(), "last_polled_at": func.now()}
        if current["state"] in (PENDING, EXPIRED):
            # an expired job (its hold released) that finishes later is still the caller's: it becomes
            # done or failed, charged nothing (the hold's own state says released)
            values.update(state=terminal, finished_at=func.now())
        await tx.execute(update(async_jobs).where(async_jobs.c.id == job["id"]).values(**values))
    return closed


async def touch(svc: Services, job: dict[str, Any]) -> None:
    """A poll read a non-terminal status: the job is alive, so its hold's lease starts again (the
    reaper releases only holds of jobs nobody polled for ``TREG_HOLD_TTL_S``)."""
    lease = text(f"interval '{int(svc.settings.hold_ttl_s)} seconds'")
    async with svc.db.tx() as tx:  # hold row, then job row: the lock order of finish()
        await tx.execute(update(holds).where(and_(holds.c.id == job["call_id"], holds.c.state == "held"))
                         .values(expires_at=func.now() + lease))
        await tx.execute(update(async_jobs).where(async_jobs.c.id == job["id"])
                         .values(last_polled_at=func.now(), updated_at=func.now()))


async def expire_released(svc: Services) -> int:
    """Mark pending jobs whose hold the reaper released (nobody polled them in time) ``expired``."""
    async with svc.db.tx() as tx:
        return await tx.execute(
            update(async_jobs).where(and_(async_jobs.c.state == PENDING, async_jobs.c.call_id == holds.c.id,
                                          holds.c.state == RELEASED))
            .values(state=EXPIRED, finished_at=func.now(), updated_at=func.now()))


async def call_detail(svc: Services, org_id: str, call_id: str) -> dict[str, Any]:
    """What a submission's call detail adds: ``async`` (task id, job state, learned fetch ids). {}: not
    a job. (Its cost and hold state, live from the hold, are the audit read's own: treg/calls.py.)"""
    async with svc.db.tx() as tx:
        row = await tx.fetch_one(
            select(async_jobs.c.task_id, async_jobs.c.state, async_jobs.c.fetch_ids)
            .where(and_(async_jobs.c.org_id == org_id, async_jobs.c.call_id == call_id)))
    if row is None:
        return {}
    return {"async": {"task_id": row["task_id"], "state": row["state"], "fetch_ids": list(row["fetch_ids"] or ())}}
