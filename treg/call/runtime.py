"""The call pipeline's long-lived parts: caches + their change listener, the audit writer and the
evidence-retention pruner. Installed as an app component (``async def setup(app, svc)``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Awaitable, Callable

from treg.cache import ChangeListener, OrgCache
from treg.call.audit import AuditWriter, prune_evidence
from treg.context import Services
from treg.errors import TregError

log = logging.getLogger(__name__)

PRUNE_INTERVAL_S = 3600.0


async def setup(app: Any, svc: Services) -> Callable[[], Awaitable[None]]:
    ttl = svc.settings.cache_ttl_s
    caches: list[OrgCache[Any]] = []
    for name in ("identity_cache", "tools_cache", "deny_cache", "secrets_cache"):
        cache: OrgCache[Any] = OrgCache(name, ttl)
        svc.extras[name] = cache
        caches.append(cache)
    listener = ChangeListener(svc.db.dsn, caches)
    await listener.start()
    writer = AuditWriter(svc)
    writer.start()
    svc.extras["audit"] = writer
    svc.extras["token_touch"] = writer.touch_token
    svc.extras["cache_listener"] = listener

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
        await listener.stop()
        svc.extras.pop("token_touch", None)

    return close
