"""Credit leases: one hold for many calls, their holds taken from it in memory (docs/money.md "Credit leases").

A platform-tier call places its hold before any vendor contact, so the hold's round trip is on every
billed call's path, and every placement takes the org's balance row lock. When one (org, member, tag)
places holds at a rate (``TREG_MONEY_LEASE_AFTER`` in a second), the serving process instead places
one **lease**: a hold of ``TREG_MONEY_LEASE_CALLS`` calls' worth, itself an ordinary row of ``holds``
(``lease`` true) placed by ``treg_place_hold`` under every limit. The key's next calls take their holds
from it here, without a round trip, until it is spent or a second old; their closes go through the
settler (``treg_close_leased``: each call's row written closed, its amount moved out of the lease, one
statement for many calls), and the lease itself is released (what is left of it) once it is retired
and its last call is closed, queued after those calls' closes.

Why the limits stay exact:

* a lease is placed under every limit like any hold, and the calls it serves never take more than it
  holds: what a lease covers is money no other call can spend;
* it is placed only while the limits leave a headroom of ``HEADROOM`` leases beside it: near a limit
  every call places its own hold, so the last credits go to calls one by one (16 calls on credit for
  10 across two processes charge exactly 10: tests/test_money_fast_path.py);
* a refused lease (or a failed placement) leaves the calls to their own holds, which meet the limit's
  own refusal, and no lease is tried for the key for ``COOL_S``.

What a crash costs: a lease is a hold, with its ``expires_at``; a process killed with leases open
leaves them ``held``, and the reaper releases each when it expires, in the callers' favour, and marks
the calls it covered whose close was never written (``calls.lease_id``) released, as it does a killed
call's own hold. A call refused by a limit while the org has leases open asks for them back
(treg/money/holds.py): every process returns its leases of that org (:meth:`Leases.retire_org`, by
NOTIFY), and the refused hold is tried again for up to ~0.5 s, so credit parked in a lease does not
turn into a 402 while it comes back. A lease serves new calls for ``TREG_MONEY_LEASE_S`` (``USE_S``
by default).

No call waits for a lease while its key stays busy: once half of a lease is spent, the next one is
placed in the background (**placed ahead**) and serves as soon as the first is spent. Its size follows
the key's rate: enough calls for a quarter of ``TREG_MONEY_LEASE_S`` at the rate the first one was
spent, from ``TREG_MONEY_LEASE_CALLS`` up to ``TREG_MONEY_LEASE_MAX_CALLS``; a grown lease the limits
refuse leaves the key at the smaller size for ``COOL_S``.

A speed trick (docs/performance.md, rounds 8 and 15): the platform tier's hold without a round trip.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from typing import Any

from treg.errors import TregError
from treg.ids import new_id
from treg.money import holds
from treg.money.holds import Hold

log = logging.getLogger(__name__)

#: seconds a lease serves new calls; after that its calls finish and it is returned
USE_S = 1.0
#: a lease is placed only while every limit leaves this many leases' worth beside it
HEADROOM = 8
#: seconds no lease is tried for a key after one was refused (its calls place their own holds)
COOL_S = 1.0
#: keys whose rate is tracked at most (a process serving more keys starts the count again)
MAX_KEYS = 10_000
#: a lease placed ahead holds the calls the key made in this share of ``use_s`` (at least ``calls``):
#: long enough that a busy key places a few leases a second, short enough to park little credit
GROWN_SHARE = 0.25
#: seconds a drain or a shutdown waits at most for the placements under way (:meth:`Leases.placements`)
PLACEMENTS_WAIT_S = 5.0

Key = tuple[str, "str | None", "str | None"]


@dataclasses.dataclass(eq=False)
class Lease:
    """A lease as this process holds it: what is left of it, and its calls not yet closed."""

    hold: Hold
    left_micro: int
    use_until: float
    #: when it was placed, and how many calls it served: the key's rate, for the size of the next one
    placed_at: float = 0.0
    granted: int = 0
    open_calls: set[str] = dataclasses.field(default_factory=set)
    retired: bool = False
    timer: asyncio.TimerHandle | None = None

    @property
    def id(self) -> str:
        return self.hold.call_id

    def grant(self, call_id: str, amount: int) -> Hold:
        self.left_micro -= amount
        self.granted += 1
        self.open_calls.add(call_id)
        h = self.hold
        return Hold(call_id=call_id, org_id=h.org_id, member_id=h.member_id, tag=h.tag, amount_micro=amount,
                    day=h.day, expires_at=h.expires_at, lease_id=h.call_id)


class Leases:
    """The leases of one serving process (one per key at a time serves new calls); see the module doc.

    ``take`` answers a call's hold from a lease or None (the call places its own); the settler tells
    ``closed`` of every leased call's close and ``retire_all`` when it drains or stops, and returns
    (releases) each lease these answer with, after its calls' closes."""

    def __init__(self, *, calls: int, after: int, on_retired: Any, use_s: float = USE_S,
                 max_calls: int | None = None) -> None:
        self.calls = max(0, int(calls))
        #: the largest lease placed ahead for a busy key (``calls``: every lease the same size)
        self.max_calls = max(self.calls, int(max_calls) if max_calls is not None else self.calls)
        self.after = max(1, int(after))
        self.use_s = max(0.0, float(use_s))
        self._on_retired = on_retired  # called with the id of a lease to return, after its calls' closes
        self._serving: dict[Key, Lease] = {}
        #: a lease placed ahead, serving once the key's serving lease is spent
        self._next: dict[Key, Lease] = {}
        self._live: dict[str, Lease] = {}
        self._placing: dict[Key, asyncio.Future[None]] = {}
        self._rate: dict[Key, list[float]] = {}
        self._cool: dict[Key, float] = {}
        self._no_growth: dict[Key, float] = {}  # a grown lease was refused: base size until then
        #: no lease is placed or served while set: the process cannot hear a request to return one
        #: (its change listener is not connected, :meth:`pause`)
        self.paused = False
        #: counters: /metrics (treg_credit_leases_total), the tests and the benchmark
        self.placed = 0
        self.refused = 0
        self.returned = 0

    @property
    def live(self) -> int:
        """Leases placed and not yet handed back for return."""
        return len(self._live)

    async def take(self, svc: Any, *, org_id: str, member_id: str | None, tag: str | None, call_id: str,
                   amount_micro: int) -> Hold | None:
        if self.calls == 0 or self.paused:
            return None
        key = (org_id, member_id, tag)
        now = time.monotonic()
        lease = self._serving_lease(key, amount_micro, now)
        if lease is not None:
            return self._grant(svc, key, lease, call_id, amount_micro, now)
        if not self._busy(key, now) or self._cool.get(key, 0.0) > now:
            return None
        # at most twice: the placement under way may be a grown one the limits refuse (then one of the
        # base size follows), or its lease spent by the calls that waited with this one
        for _ in range(2):
            pending = self._placing.get(key)
            if pending is None:
                pending = self._start_placing(svc, key, amount_micro, self.calls)
            await asyncio.shield(pending)
            now = time.monotonic()
            lease = self._serving_lease(key, amount_micro, now)
            if lease is not None:
                return self._grant(svc, key, lease, call_id, amount_micro, now)
            if self.paused or self._cool.get(key, 0.0) > now:
                break
        return None

    def _serving_lease(self, key: Key, amount_micro: int, now: float) -> Lease | None:
        """The key's lease that can hold ``amount_micro`` now: the one serving, else the one placed ahead
        (which serves once the one before it is retired); each spent or expired one met is retired."""
        lease = self._serving.get(key)
        while lease is not None:
            if now < lease.use_until and lease.left_micro >= amount_micro:
                return lease
            self.retire(lease)
            lease = self._serving.get(key)
        return None

    def _grant(self, svc: Any, key: Key, lease: Lease, call_id: str, amount_micro: int, now: float) -> Hold:
        """The call's hold from ``lease``; once half of it is spent, the next one is placed ahead."""
        hold = lease.grant(call_id, amount_micro)
        if (lease.left_micro * 2 <= lease.hold.amount_micro and key not in self._next
                and key not in self._placing and self._cool.get(key, 0.0) <= now):
            self._start_placing(svc, key, amount_micro, self._ahead_size(key, lease, now))
        return hold

    def _ahead_size(self, key: Key, lease: Lease, now: float) -> int:
        """Calls' worth of the lease placed ahead of ``lease``: the calls the key made in ``GROWN_SHARE`` of
        ``use_s`` at the rate ``lease`` was spent, between ``calls`` and ``max_calls``."""
        elapsed = now - lease.placed_at
        if self.max_calls == self.calls or elapsed <= 0.0 or self._no_growth.get(key, 0.0) > now:
            return self.calls
        return max(self.calls, min(self.max_calls, int(lease.granted / elapsed * self.use_s * GROWN_SHARE)))

    def _start_placing(self, svc: Any, key: Key, amount_micro: int, calls: int) -> asyncio.Future[None]:
        # the placement runs on its own: a caller that goes away does not leave a lease nobody knows
        pending = asyncio.ensure_future(self._place(svc, key, amount_micro, calls))
        pending.add_done_callback(_unexpected)  # a placement ahead has no caller to see its failure
        self._placing[key] = pending
        return pending

    async def placements(self, timeout: float = PLACEMENTS_WAIT_S) -> None:
        """Wait for the placements under way, so a retire after this returns what they place too (a lease
        placed ahead is no call's to wait for); at most ``timeout`` seconds, as a database that does not
        answer must not hold a drain or a shutdown (a lease placed later is returned by the next drain, or
        released by the reaper when it expires). Waiting does not cancel them."""
        if self._placing:
            await asyncio.wait(list(self._placing.values()), timeout=timeout)

    def _busy(self, key: Key, now: float) -> bool:
        """Has the key placed ``after`` holds within a second (counting this one)?"""
        window = self._rate.get(key)
        if window is None or now - window[0] >= 1.0:
            if len(self._rate) >= MAX_KEYS:
                self._rate.clear()
            self._rate[key] = [now, 1.0]
            return self.after <= 1
        window[1] += 1
        return window[1] >= self.after

    async def _place(self, svc: Any, key: Key, amount_micro: int, calls: int) -> None:
        org_id, member_id, tag = key
        size = amount_micro * calls
        try:
            try:
                hold = await holds.place_lease(svc, lease_id=new_id("lse"), org_id=org_id, member_id=member_id,
                                               tag=tag, amount_micro=size, headroom_micro=size * HEADROOM)
            except TregError:
                hold = None  # the calls place their own holds, and meet the database's own answer
            now = time.monotonic()
            if hold is None:
                self.refused += 1
                if calls > self.calls:  # too large for the limits' headroom: the key goes on at the base size
                    self._no_growth[key] = now + COOL_S
                    _bounded(self._no_growth)
                else:
                    self._cool[key] = now + COOL_S
                    _bounded(self._cool)
                return
            self.placed += 1
            lease = Lease(hold, hold.amount_micro, now + self.use_s, placed_at=now)
            lease.timer = asyncio.get_running_loop().call_later(self.use_s, self.retire, lease)
            self._live[lease.id] = lease
            if key in self._serving:
                self._next[key] = lease  # placed ahead: it serves once ``serving`` is spent
            else:
                self._serving[key] = lease
            if self.paused:  # paused while it was placed: returned at once, no call served from it
                self.retire(lease)
        finally:
            del self._placing[key]

    def retire(self, lease: Lease) -> None:
        """No more calls from ``lease``; returned now if none is open, else when its last one closes."""
        if lease.retired:
            return
        lease.retired = True
        if lease.timer is not None:
            lease.timer.cancel()
        key = (lease.hold.org_id, lease.hold.member_id, lease.hold.tag)
        if self._serving.get(key) is lease:
            del self._serving[key]
            ahead = self._next.pop(key, None)
            if ahead is not None:  # the lease placed ahead serves from here
                self._serving[key] = ahead
        elif self._next.get(key) is lease:
            del self._next[key]
        if not lease.open_calls:
            self._hand_back(lease)

    def retire_all(self) -> None:
        for lease in [*self._serving.values(), *self._next.values()]:
            self.retire(lease)

    def pause(self) -> None:
        """Serve and place no lease, and return every one (after its open calls' closes), until
        :meth:`resume`: the change listener lost its connection, so a call another process refuses for
        the credit parked here could not ask for it back, and would stay refused for as long as a lease
        serves (``TREG_MONEY_LEASE_S``)."""
        self.paused = True
        self.retire_all()

    def resume(self) -> None:
        self.paused = False

    def retire_org(self, org_id: str) -> int:
        """Retire the leases of ``org_id`` (a call of that org was refused while credit was parked in
        leases: treg/money/holds.py); how many were serving."""
        mine = [lease for key, lease in self._serving.items() if key[0] == org_id]
        for lease in [*mine, *(lease for key, lease in self._next.items() if key[0] == org_id)]:
            self.retire(lease)
        return len(mine)

    def closed(self, hold: Hold) -> None:
        """``hold`` (taken from a lease) is closed, its close queued or written."""
        lease = self._live.get(hold.lease_id or "")
        if lease is None or hold.call_id not in lease.open_calls:
            return  # a second close of the same call (CallState.close_money's release after a settle)
        lease.open_calls.discard(hold.call_id)
        if lease.retired and not lease.open_calls:
            self._hand_back(lease)

    def _hand_back(self, lease: Lease) -> None:
        del self._live[lease.id]
        self.returned += 1
        self._on_retired(lease.id)


def _bounded(until: dict[Key, float]) -> None:
    """A per-key deadline table kept to ``MAX_KEYS`` (emptied past it: the keys start again)."""
    if len(until) > MAX_KEYS:
        until.clear()


def _unexpected(placement: asyncio.Future[None]) -> None:
    """Log a placement that failed other than by the limits' or the database's answer (a bug: its calls
    placed their own holds), and mark its error retrieved."""
    if not placement.cancelled() and (exc := placement.exception()) is not None:
        log.error("credit leases: a lease placement failed unexpectedly", exc_info=exc)
