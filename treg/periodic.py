"""One background task that runs ``work`` every ``interval_s`` seconds until closed: the reaper, the
archive's pruning and the evidence pruner. A failed run is logged and the next one tries again (a sweep
must never stop treg from serving); ``close`` cancels the task and waits for it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Awaitable, Callable


def every(interval_s: float, work: Callable[[], Awaitable[object]], *, name: str,
          log: logging.Logger, first_s: float | None = None) -> Callable[[], Awaitable[None]]:
    """``first_s``: when the first run starts (None: after one interval). Whatever a run raises short of
    a cancellation is logged and contained: the loop never ends by itself, so ``close`` never re-raises
    a run's failure (which would skip the closers after it, the audit writer's last flush among them)."""
    async def loop() -> None:
        delay = interval_s if first_s is None else first_s
        while True:
            await asyncio.sleep(delay)
            delay = interval_s
            try:
                await work()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: run failed; the next run tries again", name)

    task = asyncio.create_task(loop(), name=name)

    async def close() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return close
