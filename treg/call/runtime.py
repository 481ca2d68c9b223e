"""The call pipeline's long-lived parts: caches + their change listener, the audit writer, the settler
(holds closed off the answers' path) and the evidence-retention pruner. Installed as an app component (``async def setup(app, svc)``)."""

from __future__ import annotations

import logging
from typing import Any, Awaitable, Callable

from treg import periodic
from treg.cache import Caches, ChangeListener
from treg.call.audit import AuditWriter, prune_evidence
from treg.context import NullAuditWriter, Services
from treg.money.holds import LEASES_WANTED
from treg.money.settler import Settler

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
    # holds closed off the answers' path, credit leases for busy keys (treg/money/settler.py, leases.py)
    settler = Settler(svc.db, hold_ttl_s=svc.settings.hold_ttl_s, lease_calls=svc.settings.money_lease_calls,
                      lease_after=svc.settings.money_lease_after, lease_s=svc.settings.money_lease_s,
                      lease_max_calls=svc.settings.money_lease_max_calls)
    settler.start()
    svc.settler = settler
    svc.metrics.bind_leases(settler.leases)
    # a call refused while an org's credit is parked in leases asks every process for them back
    listener.handlers[LEASES_WANTED] = settler.return_leases
    # ... and cannot ask a process whose listener is down: that one parks no credit meanwhile
    listener.watch_connection(settler.listening)

    async def prune() -> None:
        n = await prune_evidence(svc)
        if n:
            log.info("pruned evidence of %d calls older than %d days", n, svc.settings.evidence_retention_days)

    # at startup, then hourly; a failed run (any exception, not only a TregError) is logged and retried
    # next period: it once ended the task, and shutdown re-raised it before the audit queue was flushed
    close_pruner = periodic.every(PRUNE_INTERVAL_S, prune, name="treg-evidence-pruner", log=log, first_s=0.0)

    async def close() -> None:
        try:
            await close_pruner()
        finally:  # whatever happened to the pruner, the queued closes and audit rows are written
            try:
                # every queued close written before the database closes; a call still closing after this
                # is closed inline by the stopped settler, which knows the leases its hold came from
                await settler.stop()
                await writer.close()
            finally:
                await listener.stop()  # the live caches are bypassed from here on, as null caches would be
                svc.audit = NullAuditWriter()  # nothing writes batches any more: token uses are noted at once

    return close
