"""The call pipeline's long-lived parts: caches + their change listener, the audit writer and the
evidence-retention pruner. Installed as an app component (``async def setup(app, svc)``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Awaitable, Callable

from treg.cache import Caches, ChangeListener
from treg.call.audit import AuditWriter, prune_evidence
from treg.context import NullAuditWriter, Services
from treg.errors import TregError

log = logging.getLogger(__name__)

PRUNE_INTERVAL_S = 3600.0


async def setup(app: Any, svc: Services) -> Callable[[], Awaitable[None]]:
    caches = Caches.live(svc.settings.cache_ttl_s)
    svc.caches = caches
    listener = ChangeListener(svc.db.dsn, caches)
    await listener.start()
    writer = AuditWriter(svc)
    writer.start()
    svc.audit = writer

    async def prune_loop() -> None:
        while True:
            try:
                n = await prune_evidence(svc)
                if n:
                    log.info("pruned evidence of %d calls older than %d days", n,
                             svc.settings.evidence_retention_days)
            except TregError as exc:
                log.warning("evidence pruning failed: %s", exc.code)
            await asyncio.sleep(PRUNE_INTERVAL_S)

    pruner = asyncio.create_task(prune_loop(), name="treg-evidence-pruner")

    async def close() -> None:
        pruner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pruner
        await writer.close()
        await listener.stop()  # the live caches are bypassed from here on, as null caches would be
        svc.audit = NullAuditWriter()  # nothing writes batches any more: token uses are noted at once

    return close
