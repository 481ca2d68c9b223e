"""What one call carries through the pipeline (:class:`CallState`) and what it ends in (:class:`CallOutcome`).

The stages hand each other frozen values (``treg/call/types.py``); this is the one mutable object of a
call, filled in as stages learn things, so whichever exit ends the call can record what is known."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from treg import idempotency, money
from treg.call import evidence
from treg.call.record import call_record, request_evidence
from treg.call.relay import PreparedRequest
from treg.call.types import CallInput, ResolvedTarget
from treg.capacity.breaker import Lock
from treg.capacity.classify import Signal, Unrecorded
from treg.context import Services
from treg.identity import Identity
from treg.infra.upstream import RawHeaders, UpstreamResponse


@dataclass(slots=True)
class CallOutcome:
    """An answer ready to stream: status, headers for the caller, the body, ``close`` (idempotent) and
    ``finish``, which the edge must call exactly once when streaming ended (normally or not). ``finish``
    is synchronous on purpose: it only queues the audit row, so even a cancelled handler completes it."""

    status: int
    reason: str
    headers: list[tuple[str, str]] = field(repr=False)
    body: AsyncIterator[bytes]
    close: Callable[[], None]
    finish: Callable[[int, BaseException | None], None]
    #: the upstream sent a Content-Length: keep it even on a bodyless answer (HEAD/204/304)
    content_length: int | None = None
    has_content_type: bool = True
    has_server: bool = True
    #: the whole body, when it is already in hand (``body`` yields the same bytes)
    whole: bytes | None = field(default=None, repr=False)
    #: the upstream's headers that are not UTF-8, by their text pair: the edge sends their raw bytes
    raw_headers: RawHeaders | None = field(default=None, repr=False)


@dataclass(slots=True)
class CallState:
    """What is known about a call so far, for its audit row and event."""

    inp: CallInput
    started: float = field(default_factory=time.monotonic)
    ident: Identity | None = None
    target: ResolvedTarget | None = None
    prepared: PreparedRequest | None = None
    #: the upstream's answer once it arrived (an exit closes it)
    resp: UpstreamResponse | None = field(default=None, repr=False)
    ttfb_ms: int | None = None
    #: the injected credential values (masked in anything recorded), never logged
    secret_values: tuple[str, ...] = field(default=(), repr=False)
    _redactor: evidence.Redactor | None = field(default=None, repr=False)
    claim: idempotency.Claim | None = None
    hold: money.Hold | None = None
    hold_state: str | None = None
    cost_micro: int = 0
    #: the audit row is queued (an exceptional exit records the call once, whichever path saw it first)
    audited: bool = False
    #: the archive's plan for the call (treg/call/archive.py), the classifier's verdict, what the archive did
    archive: Any = None
    result_state: str | None = None
    result_reason: str | None = None
    cache_state: str | None = None
    cache_admission: str | None = None
    #: the audit row's kind (None: an ordinary call; async_submit / async_poll / async_fetch)
    kind: str | None = None
    #: the owned async job a platform-tier poll or fetch reads (treg/call/jobs.py), else None
    job: Any = None
    #: the overflow attempt (treg/call/overflow_stage.py ``Attempt``), once one started
    overflow: Any = None
    #: platform tier (treg/call/capacity_stage.py): the final answer's classification, the lock this
    #: call probes, and the smoothing applied (``X-Treg-Smoothed`` parts)
    capacity_signal: Signal | Unrecorded | None = None
    capacity_probe: Lock | None = None
    #: a lock covering this call that overflow may serve around (the reserve stage skips the direct attempt)
    capacity_lock: Lock | None = None
    smoothed: tuple[str, ...] = ()
    #: a ``/table/`` call: what the caller asked of the table (treg/call/table.py ``TableCall``), else None
    table: Any = None

    #: the audit row (treg/call/record.py)
    record = call_record
    request_evidence = request_evidence

    @property
    def reshaped(self) -> bool:
        """The answer is not given as it came: a ``/table/`` call's (a table), a public demo call's (marked)."""
        return self.table is not None or (self.ident is not None and self.ident.scope == "demo")

    @property
    def redactor(self) -> evidence.Redactor:
        # built on first use: its encoded variants cost more than a whole successful relay's bookkeeping
        if self._redactor is None:
            self._redactor = (self.prepared.redactor() if self.prepared is not None
                              else evidence.Redactor.for_values(self.secret_values))
        return self._redactor

    def masked(self, text: str) -> str:
        """``text`` with injected values masked; the cheap path when no value could be in it."""
        if not self.secret_values:
            return text
        return self.redactor.text(text)

    async def close_money(self, svc: Services, *, settle_micro: int | None = None) -> None:
        """Close the call's hold exactly once: settle when ``settle_micro`` is given, else release. Safe
        to call twice (the second call finds it closed). While serving, the close is written off the
        answer's path (treg.money.settler): the charge is known now, the statement follows."""
        hold = self.hold
        if hold is not None and self.hold_state is None:
            if settle_micro is not None and await svc.settler.close(
                    hold, money.Close(hold.call_id, money.SETTLED, settle_micro)):
                self.cost_micro = hold.charge_for(settle_micro)
                self.hold_state = money.SETTLED
            else:
                # released now, or already released by the reaper (settle found no open hold): charged 0
                await svc.settler.close(hold, money.Close(hold.call_id, money.RELEASED))
                self.cost_micro = 0
                self.hold_state = money.RELEASED
