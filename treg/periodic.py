"""One background task that runs ``work`` every ``interval_s`` seconds until closed: the reaper and the
archive's pruning. A failed run is logged and the next one tries again (a sweep must never stop treg
from serving); ``close`` cancels the task and waits for it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Awaitable, Callable


def every(interval_s: float, work: Callable[[], Awaitable[object]], *, name: str,
          log: logging.Logger) -> Callable[[], Awaitable[None]]:
    async def loop() -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await work()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("%s: run failed", name)

    task = asyncio.create_task(loop(), name=name)

    async def close() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return close
