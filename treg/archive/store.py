"""The ``archive_entries`` table: one short transaction per lookup or store, and the bounded prune.

An entry is served only before its ``expires_at``; expired rows are deleted by :func:`prune`, which
runs at startup and every ``TREG_ARCHIVE_PRUNE_INTERVAL_S`` (an app component, like the reaper), in
batches, at most :data:`MAX_BATCHES` of them a run (the next run continues). A store of a key that is
already there replaces it (a ``refresh``, or an expired row the prune has not reached yet).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from sqlalchemy import and_, delete, func, literal_column, select, text
from sqlalchemy.dialects.postgresql import insert as pg_insert

from treg.context import Services
from treg.infra.schema import archive_entries

log = logging.getLogger(__name__)

BATCH = 500
MAX_BATCHES = 20


@dataclass(frozen=True)
class Entry:
    status: int
    content_type: str | None
    body: bytes = field(repr=False)
    #: whole seconds since the answer was stored (``X-Treg-Cache-Age``)
    age_s: int = 0


async def lookup(svc: Services, key: str) -> Entry | None:
    """The live entry of ``key`` (None: none, or expired)."""
    t = archive_entries.c
    age = func.floor(func.extract("epoch", func.now() - t.stored_at)).label("age_s")
    async with svc.db.tx() as tx:
        row = await tx.fetch_one(select(t.status, t.content_type, t.body, age)
                                 .where(and_(t.key == key, t.expires_at > func.now())))
    if row is None:
        return None
    return Entry(status=row["status"], content_type=row["content_type"], body=bytes(row["body"]),
                 age_s=max(0, int(row["age_s"] or 0)))


async def store(svc: Services, *, key: str, endpoint: str, org_id: str | None, status: int,
                content_type: str | None, body: bytes, ttl_s: int) -> None:
    expires = func.now() + text(f"interval '{int(ttl_s)} seconds'")
    stmt = pg_insert(archive_entries).values(key=key, endpoint=endpoint, org_id=org_id, status=status,
                                             content_type=content_type, body=body, expires_at=expires)
    stmt = stmt.on_conflict_do_update(index_elements=[archive_entries.c.key], set_={
        "endpoint": stmt.excluded.endpoint, "org_id": stmt.excluded.org_id, "status": stmt.excluded.status,
        "content_type": stmt.excluded.content_type, "body": stmt.excluded.body, "stored_at": func.now(),
        "expires_at": stmt.excluded.expires_at})
    async with svc.db.tx() as tx:
        await tx.execute(stmt)


async def prune(svc: Services, *, batch: int = BATCH, max_batches: int = MAX_BATCHES) -> int:
    """Delete expired entries, ``batch`` rows a transaction, at most ``max_batches`` transactions."""
    t = archive_entries.c
    pruned = 0
    for _ in range(max_batches):
        async with svc.db.tx() as tx:
            n = await tx.execute(delete(archive_entries).where(t.expires_at <= func.now()).where(
                literal_column("ctid").in_(select(literal_column("ctid")).select_from(archive_entries)
                                           .where(t.expires_at <= func.now()).limit(batch))))
        pruned += max(0, n)
        if n < batch:
            break
    return pruned


async def setup(app: Any, svc: Services) -> Callable[[], Awaitable[None]] | None:
    """Component (treg.app.COMPONENTS): one prune at startup, then a periodic task until shutdown."""
    try:
        await prune(svc)
    except Exception:  # an archive that cannot be pruned must not stop treg from serving
        log.exception("archive: startup prune failed")
    interval = svc.settings.archive_prune_interval_s
    if interval <= 0:
        return None

    async def loop() -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                n = await prune(svc)
                if n:
                    log.info("archive: pruned %d expired entr%s", n, "y" if n == 1 else "ies")
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("archive: prune failed")

    task = asyncio.create_task(loop(), name="treg-archive-prune")

    async def close() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return close
