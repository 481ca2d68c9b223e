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
* a close the database refuses for what it carries (a data exception, a constraint) is isolated: the
  batch is written by halves until that close is alone, and only it is left to the reaper;
* shutdown drains the queue (``close``) before the database closes.

The settler also keeps the process's credit leases (treg/money/leases.py, ``take_leased``): a leased
call's close is queued like any other and written by ``treg_close_leased``, and a retired lease's
return (its remainder released) is queued after its calls' closes; a batch writes the leased closes
first, so a lease is never released before a close of a call it covered. A drain retires every lease
first, so a read of the balance after it sees no credit parked in this process's leases.

Outside a server (the CLI, domain tests) :class:`InlineSettler` closes at once and says whether this
call closed the hold; it keeps no leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from treg.errors import TregError
from treg.infra.db import Database
from treg.money import holds
from treg.money.holds import RELEASED, Close, Closed, Hold
from treg.money.leases import USE_S, Leases

log = logging.getLogger(__name__)

#: a hold with less lease left than this (or than a tenth of the lease) is closed inline, not queued
INLINE_MARGIN_S = 60.0
#: the most closes one statement carries
BATCH_MAX = 256
#: how long a failing batch is retried before its holds are left to the reaper
RETRY_FOR_S = 30.0
#: how long the closes are gathered before a statement: off the answers' path, so it costs a caller
#: nothing, and a quiet process's closes share statements too (a drain and a stop do not wait for it)
LINGER_S = 0.02


def _release_soon(db: Database, tasks: "set[asyncio.Task[Any]]", hold_id: str) -> None:
    """The release of an orphaned hold on a task of its own, kept in ``tasks`` until it is done (a task
    nobody refers to may be collected before it runs); a failed one is the reaper's."""
    async def release() -> None:
        try:
            await holds.close_on(db, [Close(hold_id, RELEASED)])
        except TregError as exc:
            log.warning("hold %s: its caller went away and its release failed (%s); the reaper releases it",
                        hold_id, exc.code)
    task = asyncio.ensure_future(release())
    tasks.add(task)
    task.add_done_callback(tasks.discard)


class InlineSettler:
    """Closes a hold at once (one statement) and answers whether this call closed it."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._orphans: set[asyncio.Task[Any]] = set()

    async def close(self, hold: Hold, close: Close) -> bool:
        if hold.lease_id is not None:  # never taken here, but its charge must not be lost if one arrives
            close = Close(close.call_id, close.state, close.observed_micro, hold.lease_id, hold.amount_micro)
            return bool(await holds.close_leased_on(self._db, [close]))
        return bool(await holds.close_on(self._db, [close]))

    async def take_leased(self, svc: object, **hold: object) -> Hold | None:
        """No leases outside a server: every hold is placed by its own statement."""
        return None

    async def drain(self) -> None:
        """Nothing is ever queued here."""

    def return_leases(self, org_id: str) -> None:
        """No leases here."""

    def release_orphan(self, hold_id: str) -> None:
        """Release ``hold_id`` (placed for a caller that went away) on a task of its own."""
        _release_soon(self._db, self._orphans, hold_id)

    async def stop(self) -> None:
        """Nothing runs here."""


class Settler:
    """Holds closed in the background, in batches of one statement each (see the module doc)."""

    def __init__(self, db: Database, *, hold_ttl_s: float, retry_for_s: float = RETRY_FOR_S, lease_calls: int = 0,
                 lease_after: int = 1, lease_s: float = USE_S, lease_max_calls: int | None = None) -> None:
        self._db = db
        # a lease serves well inside its own TTL, so its calls close long before the reaper may release it
        self.leases = Leases(calls=lease_calls, after=lease_after, on_retired=self._return_lease,
                             use_s=min(lease_s, hold_ttl_s / 10), max_calls=lease_max_calls)
        self._margin_s = min(INLINE_MARGIN_S, hold_ttl_s / 10)
        self.retry_for_s = retry_for_s
        self._queue: list[Close] = []
        self._wake = asyncio.Event()
        self._hurry = asyncio.Event()  # write now: a drain or a stop waits, or a full batch is queued
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._late: list[Close] = []  # lease returns after the loop stopped
        self._orphans: set[asyncio.Task[Any]] = set()  # releases of orphaned holds after the loop stopped
        #: leases with a call's close that could not be written: never returned here (the reaper releases
        #: them when they expire and marks those calls released), so no return may precede that close
        self._abandoned: set[str] = set()
        #: counters for tests and the benchmark
        self.statements = 0
        self.closed = 0
        self.left_to_reaper = 0

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="treg-settler")

    async def take_leased(self, svc: object, *, org_id: str, member_id: str | None, tag: str | None, call_id: str,
                          amount_micro: int) -> Hold | None:
        """A hold for the call taken from a credit lease (treg/money/leases.py), or None: it places its own."""
        if self._stopping or self._task is None or self._task.done():
            return None
        return await self.leases.take(svc, org_id=org_id, member_id=member_id, tag=tag, call_id=call_id,
                                      amount_micro=amount_micro)

    async def close(self, hold: Hold, close: Close) -> bool:
        """Queue the close (True: it will be written; the charge is ``hold.charge_for``), or close at once
        when the hold's lease is nearly over or the settler stopped (the answer of that close)."""
        holds.checked_close(close)  # a bad close fails its own call here, never a batch of others'
        if hold.lease_id is not None:
            close = Close(close.call_id, close.state, close.observed_micro, hold.lease_id, hold.amount_micro)
        inline = (self._stopping or self._task is None or self._task.done()
                  or hold.expires_at.timestamp() - time.time() < self._margin_s)
        if inline:
            closed = bool(await (holds.close_leased_on if close.lease_id else holds.close_on)(self._db, [close]))
        else:
            self._enqueue(close)
            closed = True
        if hold.lease_id is not None:
            self.leases.closed(hold)  # the lease's return, when it was its last call, queued after this close
            if self._late and (self._task is None or self._task.done()):  # the loop is gone: written here
                batch, self._late = self._late, []
                await self._write(batch)
        return closed

    def _enqueue(self, close: Close) -> None:
        self._queue.append(close)
        self._idle.clear()
        self._wake.set()
        if len(self._queue) >= BATCH_MAX:
            self._hurry.set()

    def _return_lease(self, lease_id: str) -> None:
        """A retired lease whose calls are all closed: what is left of it released, after their closes
        (the queue is written in order, and a batch writes its leased closes first)."""
        close = Close(lease_id, RELEASED)
        if self._stopping and (self._task is None or self._task.done()):
            self._late.append(close)  # written by stop(), after the closes before it
        else:
            self._enqueue(close)

    def release_orphan(self, hold_id: str) -> None:
        """Release ``hold_id``, a hold placed for a caller that went away meanwhile (treg/money/holds.py):
        queued as any close while the loop runs, else on a task of its own."""
        if self._stopping or self._task is None or self._task.done():
            _release_soon(self._db, self._orphans, hold_id)
        else:
            self._enqueue(Close(hold_id, RELEASED))

    def listening(self, up: bool) -> None:
        """The change listener's connection came back (``up``) or was lost: leases are paused while it
        is down, and those serving returned at once (:meth:`Leases.pause`)."""
        if up:
            self.leases.resume()
            return
        self.leases.pause()
        if self._queue:
            self._hurry.set()

    def return_leases(self, org_id: str) -> None:
        """Return ``org_id``'s leases now (each after its open calls' closes), written without the usual
        gathering: a call of that org was refused while their credit was parked (treg/money/holds.py; the
        request reaches every process by NOTIFY)."""
        if self.leases.retire_org(org_id) and self._queue:
            self._hurry.set()

    async def drain(self) -> None:
        """Wait until every close queued so far is written (or left to the reaper), this process's idle
        credit leases returned first: a read of the balance or of a call right after an answer sees its
        charge, and no credit parked here."""
        await self.leases.placements()  # a lease placed ahead lands first, and is returned with the others
        self.leases.retire_all()
        if self._queue or not self._idle.is_set():
            self._hurry.set()
            await self._idle.wait()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                while self._queue:
                    if not self._hurry.is_set():  # every batch gathers for a moment, not only the first
                        with contextlib.suppress(asyncio.TimeoutError):
                            await asyncio.wait_for(self._hurry.wait(), LINGER_S)
                    batch, self._queue = self._queue[:BATCH_MAX], self._queue[BATCH_MAX:]
                    try:
                        await self._write(batch)
                    except Exception:  # noqa: BLE001 - the loop must outlive any batch: the reaper has these
                        self.left_to_reaper += len(batch)
                        log.exception("settler: %d hold close(s) failed unexpectedly; the reaper releases them "
                                      "when their lease ends", len(batch))
            finally:
                self._hurry.clear()  # a drain's hurry lasts until the queue is empty
                self._idle.set()  # a drain never waits on a batch that is gone
            if self._stopping:
                return

    async def _write(self, batch: list[Close]) -> None:
        """The leased closes of the batch first (its lease returns are among the others), then the rest.
        A lease with a close that could not be written is never returned here: it stays held for the
        reaper, which releases it and marks the calls whose close was not written."""
        leased = [c for c in batch if c.lease_id is not None]
        if leased and (unwritten := await self._write_part(holds.close_leased_on, leased)):
            # those leases are the reaper's now: released when they expire, with these calls marked
            self._abandoned.update(c.lease_id for c in unwritten if c.lease_id is not None)
        own = [c for c in batch if c.lease_id is None] if leased or self._abandoned else batch
        if self._abandoned:
            kept = [c for c in own if c.call_id not in self._abandoned]
            self.left_to_reaper += len(own) - len(kept)
            own = kept
        if own:
            await self._write_part(holds.close_on, own)

    async def _write_part(self, statement: Any, batch: list[Close]) -> list[Close]:
        """``batch`` written by ``statement``; what is left unwritten (to the reaper) comes back. A failure
        that may pass (the database restarting, a statement timeout) is retried for ``retry_for_s``. A
        close the database refuses for what it carries (:data:`holds.REFUSED`) would be refused again: the
        batch is written by halves until it is alone (:func:`holds.by_halves`), so it cannot cost the
        closes beside it their charge (they would have been released by the reaper, callers told they were
        charged)."""
        unwritten: list[Close] = []

        def refused(close: Close, exc: TregError) -> None:
            self.left_to_reaper += 1
            unwritten.append(close)
            log.error("settler: the database refused the close of hold %s (%s); the reaper releases it when "
                      "its lease ends", close.call_id, exc.code)

        async def write(part: list[Close]) -> list[Closed]:
            deadline = time.monotonic() + self.retry_for_s
            attempt = 0
            while True:
                try:
                    closed = await statement(self._db, part)
                except holds.REFUSED:
                    raise
                except TregError as exc:
                    attempt += 1
                    if time.monotonic() >= deadline:
                        self.left_to_reaper += len(part)
                        unwritten.extend(part)
                        log.error("settler: %d hold close(s) could not be written (%s) after %d attempts; the "
                                  "reaper releases them when their lease ends", len(part), exc.code, attempt)
                        return []
                    await asyncio.sleep(min(0.05 * 2 ** attempt, 2.0))
                    continue
                self.statements += 1
                self.closed += len(closed)
                return closed

        await holds.by_halves(write, batch, refused)
        return unwritten

    async def stop(self) -> None:
        """Write what is queued, then stop; later closes run inline."""
        self._stopping = True
        await self.leases.placements()
        self.leases.retire_all()  # idle leases returned with the last batch; the others after their calls
        self._wake.set()
        self._hurry.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        if self._queue:  # queued after the loop's last look
            batch, self._queue = self._queue, []
            await self._write(batch)
        if self._late:
            batch, self._late = self._late, []
            await self._write(batch)
        self._idle.set()
