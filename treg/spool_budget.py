"""The bytes the spooled answers of one process may hold at once (``Services.spool_budget``).

A metered answer of an endpoint declaring ``spooled_response`` is read into an unlinked temporary file
before it is settled (``treg/call/metered.py``); each claims its bytes here first, so concurrent answers
are admitted or refused whole, and at most two spools are parsed at a time. A plain value of the
process, below the services that hold it.
"""

from __future__ import annotations

import asyncio
import threading

SPOOL_BUDGET = 512 * 1024 * 1024
SPOOL_PARSE_CONCURRENCY = 2


class SpoolBudget:
    """Bytes the spools of one process may hold at once."""

    def __init__(self, total: int | None = None, parse_concurrency: int = SPOOL_PARSE_CONCURRENCY) -> None:
        self.total = SPOOL_BUDGET if total is None else total
        self.used = 0
        self._lock = threading.Lock()  # released from weakref finalizers too
        self.parse_gate = asyncio.Semaphore(parse_concurrency)

    def claim(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.total:
                return False
            self.used += n
            return True

    def give_back(self, n: int) -> None:
        with self._lock:
            self.used = max(0, self.used - n)
