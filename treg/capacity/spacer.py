"""The spacer: per provider, at most one platform-tier call started per ``window_s / limit`` seconds
per process. A call that would start sooner waits, at most ``TREG_SMOOTHING_MAX_WAIT_MS``, then proceeds
anyway (smoothing is never a refusal). Pure asyncio: no database connection is held while waiting.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

from treg.catalog.model import RateLimit


class Spacer:
    """``await spacer.wait(provider_id, rate_limit)`` → the milliseconds waited (0: started at once),
    for ``X-Treg-Smoothed: wait=<ms>``. ``clock``/``sleep`` are injectable for tests."""

    def __init__(self, max_wait_ms: int, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.max_wait_s = max(0, max_wait_ms) / 1000
        self.clock = clock
        self.sleep = sleep
        #: provider → when the next call may start
        self._next: dict[str, float] = {}

    def reserve(self, provider: str, rate: RateLimit) -> float:
        """Take the next start slot and return the seconds to wait for it (no waiting here).

        A call whose slot is further than the cap away takes no slot: it proceeds after the cap, outside
        the spacing, so a queue never grows without bound behind a provider that is simply busy."""
        now = self.clock()
        interval = rate.window_s / rate.limit
        slot = max(now, self._next.get(provider, now))
        wait = slot - now
        if wait > self.max_wait_s:
            return self.max_wait_s
        self._next[provider] = slot + interval
        return wait

    async def wait(self, provider: str, rate: RateLimit | None) -> int:
        if rate is None:
            return 0
        wait = self.reserve(provider, rate)
        if wait <= 0:
            return 0
        await self.sleep(wait)
        return round(wait * 1000)
