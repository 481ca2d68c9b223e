"""The reaper: releases holds a crash left open (in the caller's favour) and prunes expired
idempotency entries (and the member call caps' counts of days a week past). It runs once at startup and then every ``TREG_REAPER_INTERVAL_S`` seconds.

Several treg processes may share one database and all run it. One sweep runs at a time: a run first
takes a PostgreSQL advisory lock (``pg_try_advisory_lock``) on a connection of its own and, finding it
taken, leaves the work to the process holding it (the lock dies with that connection, so a process
killed mid-sweep blocks nobody). Two sweeps would be correct anyway (every close is the same
conditional ``UPDATE … WHERE state = 'held'`` as the pipeline's, so a hold is closed exactly once) but
would contend for the same orgs' balance rows with live calls, twice over. Only holds past their
``expires_at`` (placed ``TREG_HOLD_TTL_S`` ago) are touched, never a live call's.

It sweeps what three stores keep (money's holds, the async jobs whose hold it released, idempotency's
expired entries), so it sits above all three (``treg/money/``, ``treg/jobs/``, ``treg/idempotency.py``),
none of which imports it.
"""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

import aiopg
import psycopg2
from sqlalchemy import and_, func, select, text

from treg import periodic
from treg.context import Services
from treg.errors import DatabaseError, TregError
from treg.infra.schema import holds
from treg.jobs import store as job_store
from treg.money.holds import HELD, RELEASED, Close, by_halves, close

log = logging.getLogger(__name__)

BATCH = 200
MAX_BATCHES = 50  # at most 10 000 holds a run; the next run continues
#: the advisory lock of the sweep (a bigint; advisory locks are per database): ASCII "tregreap"
LOCK_KEY = 0x7472656772656170
#: the row of the org that held (a hub call has a second row, the publisher's, under the same id: its
#: cost was never the hold's)
_RELEASED_ROWS_SQL = ("UPDATE calls SET hold_state = 'released', cost_micro = 0 "
                      "WHERE (id, org_id) IN (SELECT * FROM unnest(%(ids)s::text[], %(orgs)s::text[]))")
#: the calls a released credit lease covered whose close was never written (no hold row of their own):
#: charged nothing either (docs/money.md "Credit leases")
_LEASED_ROWS_SQL = ("UPDATE calls c SET hold_state = 'released', cost_micro = 0 "
                    "WHERE c.lease_id = ANY(%(ids)s::text[]) AND NOT EXISTS (SELECT 1 FROM holds h WHERE h.id = c.id)")


def _refused(close: Close, exc: TregError) -> None:
    log.error("reaper: the database refused the release of hold %s (%s); it stays held", close.call_id, exc.code)


async def reap_orphans(svc: Services, older_than_s: float | None = None) -> int:
    """Release open holds past their expiry (or, with ``older_than_s``, placed at least that long ago).

    Returns how many this call released (a hold some other closer won is not counted).
    """
    if older_than_s is None:
        due = holds.c.expires_at <= func.now()
    else:
        due = holds.c.created_at <= func.now() - text(f"interval '{float(older_than_s)} seconds'")
    released = 0
    seen: set[str] = set()
    for _ in range(MAX_BATCHES):
        async with svc.db.tx() as tx:
            ids = [r["id"] for r in await tx.fetch_all(
                select(holds.c.id).where(and_(holds.c.state == HELD, due)).order_by(holds.c.expires_at)
                .limit(BATCH))]
        ids = [i for i in ids if i not in seen]
        if not ids:
            break
        seen.update(ids)
        # one statement closes the batch (its orgs' locks taken in one order, as every closer takes them); a
        # release the database refuses for what it carries is left held and logged, alone: it must not
        # keep every expired hold of its batch held, run after run
        closed = await by_halves(lambda part: close(svc, part), [Close(call_id, RELEASED) for call_id in ids],
                                 _refused)
        released += len(closed)
        if closed:
            # the audit rows written when the answers left say what the caller was told; a hold the
            # reaper released charged nothing, and the list and the detail must say so too
            async with svc.db.tx() as tx:
                await tx.execute(_RELEASED_ROWS_SQL, {"ids": [c.call_id for c in closed],
                                                      "orgs": [c.org_id for c in closed]})
                await tx.execute(_LEASED_ROWS_SQL, {"ids": [c.call_id for c in closed]})
    if released:
        log.warning("reaper released %d orphaned hold(s)", released)
    # an async job's hold is released like any other when nobody polled it in time: the job says so too
    await job_store.expire_released(svc)
    return released


async def run_once(svc: Services) -> dict[str, int]:
    """One sweep, unless another process's is under way (then nothing is done: zeros)."""
    from treg import idempotency, member_limits, public_demo

    try:
        # outside the pool: holding a pooled connection for the sweep would starve a pool of one
        lock_conn = await aiopg.connect(svc.db.dsn, enable_hstore=False)
    except psycopg2.Error as exc:
        raise DatabaseError(f"reaper: cannot connect for its lock: {exc.__class__.__name__}",
                            code="database_unavailable") from exc
    try:
        async with lock_conn.cursor() as cur:
            await cur.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_KEY,))
            (locked,) = await cur.fetchone()
        if not locked:
            log.info("reaper: another treg process is sweeping; skipped")
            return {"holds_released": 0, "idempotency_pruned": 0}
        out = {"holds_released": await reap_orphans(svc), "idempotency_pruned": await idempotency.prune(svc)}
        await member_limits.prune(svc)  # the call caps' counts of days past (a week kept, for questions)
        await public_demo.prune(svc)  # the public demo's hourly rows of clients that did not come back
        return out
    finally:
        lock_conn.close()  # releases the lock with the session


async def setup(app: Any, svc: Services) -> Callable[[], Awaitable[None]] | None:
    """Component (treg.app.COMPONENTS): one run at startup, then a periodic task until shutdown."""
    try:
        await run_once(svc)
    except Exception:  # a failed sweep must not stop treg from serving; the next run retries
        log.exception("reaper: startup run failed")
    interval = svc.settings.reaper_interval_s
    if interval <= 0:
        return None

    return periodic.every(interval, lambda: run_once(svc), name="treg-reaper", log=log)
