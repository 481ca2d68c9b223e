"""Closing holds off the answer's path (docs/money.md, "Settlement off the answer's path").

A billed call's charge is known before its answer leaves (``Hold.charge_for``: the observed price,
capped at the hold), so ``X-Treg-Cost-Micro`` does not wait for the database to record it. While
serving, the call runtime installs a :class:`Settler`: ``close`` queues the close and returns at once,
and one background task sends whatever is queued as **one statement** (``treg_close_holds``) as soon as
the previous one came back — one round trip for a quiet call, fewer than one per call under load.

Why this stays exact:

* every close is the conditional one of ``treg_close_holds`` (``WHERE state = 'held'``), so the
  settler, the reaper and any other closer close a hold exactly once, whoever comes first;
* a hold that could expire before the queue reaches it (less than ``INLINE_MARGIN_S``, or a tenth of
  ``TREG_HOLD_TTL_S``, of its lease left) is closed inline instead, so the reaper never releases a hold the caller was told was charged
  while treg is running;
* a failed statement (the database restarting, a statement timeout) is retried with the same closes,
  for about ``RETRY_FOR_S``; what still cannot be written stays open and the reaper releases it after
  ``TREG_HOLD_TTL_S`` in the caller's favour (logged), as it does the holds of a process killed between
  an answer and its close;
* shutdown drains the queue (``close``) before the database closes.

Outside a server (the CLI, domain tests) :class:`InlineSettler` closes at once and says whether this
call closed the hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from treg.errors import TregError
from treg.infra.db import Database
from treg.money import holds
from treg.money.holds import Close, Hold

log = logging.getLogger(__name__)

#: a hold with less lease left than this (or than a tenth of the lease) is closed inline, not queued
INLINE_MARGIN_S = 60.0
#: the most closes one statement carries
BATCH_MAX = 256
#: how long a failing batch is retried before its holds are left to the reaper
RETRY_FOR_S = 30.0


class InlineSettler:
    """Closes a hold at once (one statement) and answers whether this call closed it."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def close(self, hold: Hold, close: Close) -> bool:
        return bool(await holds.close_on(self._db, [close]))

    async def drain(self) -> None:
        """Nothing is ever queued here."""

    async def stop(self) -> None:
        """Nothing runs here."""


class Settler:
    """Holds closed in the background, in batches of one statement each (see the module doc)."""

    def __init__(self, db: Database, *, hold_ttl_s: float, retry_for_s: float = RETRY_FOR_S) -> None:
        self._db = db
        self._margin_s = min(INLINE_MARGIN_S, hold_ttl_s / 10)
        self.retry_for_s = retry_for_s
        self._queue: list[Close] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        #: counters for tests and the benchmark
        self.statements = 0
        self.closed = 0
        self.left_to_reaper = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="treg-settler")

    async def close(self, hold: Hold, close: Close) -> bool:
        """Queue the close (True: it will be written; the charge is ``hold.charge_for``), or close at once
        when the hold's lease is nearly over or the settler stopped (the answer of that close)."""
        holds.checked_close(close)  # a bad close fails its own call here, never a batch of others'
        if (self._stopping or self._task is None or self._task.done()
                or hold.expires_at.timestamp() - time.time() < self._margin_s):
            return bool(await holds.close_on(self._db, [close]))
        self._queue.append(close)
        self._idle.clear()
        self._wake.set()
        return True

    async def drain(self) -> None:
        """Wait until every close queued so far is written (or left to the reaper): a read of the
        balance or of a call right after an answer sees its charge."""
        if self._queue or not self._idle.is_set():
            await self._idle.wait()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                while self._queue:
                    batch, self._queue = self._queue[:BATCH_MAX], self._queue[BATCH_MAX:]
                    try:
                        await self._write(batch)
                    except Exception:  # noqa: BLE001 - the loop must outlive any batch: the reaper has these
                        self.left_to_reaper += len(batch)
                        log.exception("settler: %d hold close(s) failed unexpectedly; the reaper releases them "
                                      "when their lease ends", len(batch))
            finally:
                self._idle.set()  # a drain never waits on a batch that is gone
            if self._stopping:
                return

    async def _write(self, batch: list[Close]) -> None:
        deadline = time.monotonic() + self.retry_for_s
        attempt = 0
        while True:
            try:
                closed = await holds.close_on(self._db, batch)
            except TregError as exc:
                attempt += 1
                if time.monotonic() >= deadline:
                    self.left_to_reaper += len(batch)
                    log.error("settler: %d hold close(s) could not be written (%s) after %d attempts; the "
                              "reaper releases them when their lease ends", len(batch), exc.code, attempt)
                    return
                await asyncio.sleep(min(0.05 * 2 ** attempt, 2.0))
                continue
            self.statements += 1
            self.closed += len(closed)
            return

    async def stop(self) -> None:
        """Write what is queued, then stop; later closes run inline."""
        self._stopping = True
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        if self._queue:  # queued after the loop's last look
            batch, self._queue = self._queue, []
            await self._write(batch)
        self._idle.set()
