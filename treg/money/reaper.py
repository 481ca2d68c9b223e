"""The reaper: releases holds a crash left open (in the caller's favour) and prunes expired
idempotency entries. It runs once at startup and then every ``TREG_REAPER_INTERVAL_S`` seconds.

Several treg processes may share one database and all run it: every close is the same conditional
``UPDATE … WHERE state = 'held'`` as the pipeline's, so a hold is still closed exactly once. Only holds
past their ``expires_at`` (placed ``TREG_HOLD_TTL_S`` ago) are touched, never a live call's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Awaitable, Callable

from sqlalchemy import and_, func, select, text

from treg.context import Services
from treg.infra.schema import holds
from treg.money.holds import HELD, RELEASED, _close

log = logging.getLogger(__name__)

BATCH = 200
MAX_BATCHES = 50  # at most 10 000 holds a run; the next run continues


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
        for call_id in ids:
            seen.add(call_id)
            async with svc.db.tx() as tx:  # one short transaction per hold: the pipeline's lock order
                if await _close(tx, call_id, RELEASED, 0) is not None:
                    released += 1
    if released:
        log.warning("reaper released %d orphaned hold(s)", released)
    return released


async def run_once(svc: Services) -> dict[str, int]:
    from treg import idempotency

    return {"holds_released": await reap_orphans(svc), "idempotency_pruned": await idempotency.prune(svc)}


async def setup(app: Any, svc: Services) -> Callable[[], Awaitable[None]] | None:
    """Component (treg.app.COMPONENTS): one run at startup, then a periodic task until shutdown."""
    try:
        await run_once(svc)
    except Exception:  # a failed sweep must not stop treg from serving; the next run retries
        log.exception("reaper: startup run failed")
    interval = svc.settings.reaper_interval_s
    if interval <= 0:
        return None

    async def loop() -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await run_once(svc)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("reaper: run failed")

    task = asyncio.create_task(loop(), name="treg-reaper")

    async def close() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return close
