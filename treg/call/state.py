"""What one call carries through the pipeline (:class:`CallState`) and what it ends in (:class:`CallOutcome`).

The stages hand each other frozen values (``treg/call/types.py``); this is the one mutable object of a
call, filled in as stages learn things, so whichever exit ends the call can record what is known. What
several stages do with it is one method here: the audit row (``record``), the request body read whole
(``read_body``), the answer stored for a replay (``store_for_replay``), the hold closed
(``close_money``) and the catalog's own answer headers (``catalog_headers``); an answer treg has whole is
built by :meth:`CallOutcome.whole_answer`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator, Callable

from treg import idempotency, money
from treg.call import evidence, headers as hdr, hub_views
from treg.call.bodies import buffer_body
from treg.call.types import CallInput, PreparedRequest, ResolvedTarget
from treg.call_record import USER_AGENT_MAX, CallRecord
from treg.capacity.breaker import Lock
from treg.capacity.classify import Signal, Unrecorded
from treg.context import Services
from treg.identity import DEMO, Identity
from treg.infra.schema import INT_MAX
from treg.infra.upstream import InHand, RawHeaders, UpstreamResponse
from treg.oauth.credentials import credential_kind
from treg.redaction import MASK, NO_SECRETS, Redactor, mask_userinfo


#: CallRecord's own ``__new__`` is a generated Python function taking its fields one by one, then this
_new_record = tuple.__new__


def call_record(state: "CallState", *, outcome: str, status: int | None, refused_by: str | None = None,
                error_code: str | None = None, blame: str | None = None, request_bytes: int | None = None,
                response_bytes: int | None = None, error_request: dict[str, Any] | None = None,
                error_response: dict[str, Any] | None = None, failure_kind: str | None = None,
                kind: str | None = None) -> CallRecord:
    """The audit row (``CallState.record``), with the optional columns a stage knows.

    A speed trick, kept on purpose (docs/performance.md): the columns come in as named parameters (a
    misspelt one is a TypeError, and no keyword dict is built per call) and go out positionally, in
    :class:`CallRecord`'s field order, every one of them (the tuple is made directly, without the
    generated ``__new__`` and its parameter list of every field: a quarter of its cost), since this runs
    on every call."""
    assert state.ident is not None
    t = state.target
    inp = state.inp
    tool = t.tool if t else None
    rec = _new_record(CallRecord, (
        inp.call_id, state.ident.org_id, state.ident.member_id, inp.surface, inp.method,
        mask_userinfo(state.masked(inp.rest[:2000]), MASK), outcome, status,
        evidence.redact_url(t.upstream_url, state.redactor if state.secret_values else NO_SECRETS)
        if t else None,
        tool.id if tool else None, tool.name if tool else None, t.provider if t else None,
        t.endpoint_id if t else None, refused_by, error_code, blame,
        t.credential_tier if t else None, state.cost_micro, state.hold_state, inp.tag, request_bytes,
        response_bytes, min(int((time.monotonic() - state.started) * 1000), INT_MAX), state.ttfb_ms,
        error_request, error_response, failure_kind, inp.parent_call_id, state.result_state, state.cache_state,
        kind or state.kind, state.capacity_signal.kind if state.capacity_signal is not None else None, None,
        *(credential_kind(t.bindings) if t else (None, None)), state.ident.scope == DEMO, None, None,
        state.hold.lease_id if state.hold is not None else None,
        inp.user_agent[:USER_AGENT_MAX] if inp.user_agent is not None else None, state.capacity_probe is not None,
        ", ".join(state.smoothed) or None, state.result_reason, state.cache_admission, None))
    if t is not None and t.hub is not None:  # a hub call: the caller's view, and the publisher's row beside it
        return hub_views.audit_rows(rec, state.ident, t, lambda: hub_views.sent(inp, state.redactor),
                                    answered=state.resp is not None)
    # once an overflow attempt took the answer over, the call's further rows are that attempt's
    return rec if state.overflow is None else state.overflow.retarget(rec)


def request_evidence(state: "CallState") -> dict[str, Any] | None:
    """What was sent (or would have been), redacted, for a failed call's row."""
    if state.prepared is not None:
        r = state.prepared.request
        return evidence.request_evidence(r.method, r.url, r.headers, r.body if isinstance(r.body, bytes) else None,
                                         state.prepared.body_kept, state.redactor)
    if state.target is not None:
        body = state.inp.body if isinstance(state.inp.body, bytes) else None
        return evidence.request_evidence(state.inp.method, state.target.full_url,
                                         hdr.request_headers(state.inp.headers), body, body is not None,
                                         state.redactor)
    return None


#: an outcome's ``finish(bytes sent, the error that ended the streaming or None)``
Finish = Callable[[int, BaseException | None], None]


def _nothing() -> None:
    """``close`` of an answer with nothing open (its body is in hand)."""


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
    finish: Finish
    #: the upstream sent a Content-Length: keep it even on a bodyless answer (HEAD/204/304)
    content_length: int | None = None
    has_content_type: bool = True
    has_server: bool = True
    #: the whole body, when it is already in hand (``body`` yields the same bytes)
    whole: bytes | None = field(default=None, repr=False)
    #: the upstream's headers that are not UTF-8, by their text pair: the edge sends their raw bytes
    raw_headers: RawHeaders | None = field(default=None, repr=False)

    @classmethod
    def whole_answer(cls, status: int, headers: list[tuple[str, str]], body: bytes, finish: Finish, *,
                     reason: str = "", relayed: bool = True, raw_headers: RawHeaders | None = None) -> "CallOutcome":
        """An answer whose body is in hand (a metered answer read whole, an idempotent replay, an archive
        hit, an overflow's or a routed call's answer): ``whole`` is ``body``, nothing is left to close.
        ``relayed``: the headers are an upstream's (as received, stored or archived), so the edge adds no
        Content-Type or Server header they lack; False: treg's own answer, which keeps the edge's."""
        if relayed:
            names = {k.lower() for k, _ in headers}
            has_type, has_server = "content-type" in names, "server" in names
        else:
            has_type = has_server = True
        return cls(status, reason, headers, InHand(body), _nothing, finish, len(body), has_type, has_server, body,
                   raw_headers)


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
    _redactor: Redactor | None = field(default=None, repr=False)
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
    #: a 2xx answer that failed the endpoint's declared success rule (treg/catalog/success.py): audited
    #: ``vendor_error``, its hold released
    vendor_error: bool = False
    #: the call counted against its member's call cap (treg/call/call_caps.py), given back if refused
    call_counted: Any = None
    #: a ``/table/`` call: what the caller asked of the table (treg/call/table.py ``TableCall``), else None
    table: Any = None

    #: the audit row (:func:`call_record`)
    record = call_record
    request_evidence = request_evidence

    @property
    def reshaped(self) -> bool:
        """The answer is not given as it came: a ``/table/`` call's (a table), a public demo call's (marked)."""
        return self.table is not None or (self.ident is not None and self.ident.is_demo)

    @property
    def redactor(self) -> Redactor:
        # built on first use: its encoded variants cost more than a whole successful relay's bookkeeping
        if self._redactor is None:
            self._redactor = (self.prepared.redactor() if self.prepared is not None
                              else Redactor.for_values(self.secret_values))
        return self._redactor

    async def read_body(self, limit: int) -> bytes | None:
        """The caller's body in hand from here on: a stream read whole (at most ``limit`` bytes, else 400
        ``body_too_large``) and relayed from memory with its length; a body already in hand as it is;
        None when the caller sent none."""
        body = self.inp.body
        if body is None or isinstance(body, bytes):
            return body
        raw = await buffer_body(body, limit)  # type: ignore[arg-type]
        self.inp = replace(self.inp, body=raw, content_length=len(raw))
        return raw

    def masked(self, text: str) -> str:
        """``text`` with injected values masked; the cheap path when no value could be in it."""
        if not self.secret_values:
            return text
        return self.redactor.text(text)

    async def store_for_replay(self, svc: Services, status: int, headers: list[tuple[str, str]],
                               body: bytes | None) -> None:
        """The answer stored for a replay of the call's ``Idempotency-Key`` (nothing claimed: nothing to do),
        BEFORE its hold is settled: a crash between the two leaves an open hold the reaper releases (a free
        call), never a settled charge a retry would pay again. ``body`` None: not stored (a spooled
        answer), the label goes back."""
        if self.claim is None:
            return
        if body is None:
            await idempotency.abandon(svc, self.claim)
        else:
            await idempotency.complete(svc, self.claim, status, headers, body)
        self.claim = None

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

    def catalog_headers(self, cost_micro: int | None) -> list[tuple[str, str]]:
        """treg's own headers on every answer of a catalog call that reached the ladder (none for an own
        tool's), refusals included: the credential tier, the cost (``cost_micro`` None: not known yet, an
        async submission's hold is still open), the archive's part (``X-Treg-Cache``: hit, stored, miss)
        and, on the platform tier, the capacity probe and the smoothing applied. A hub call's answers
        carry the first two too (``credential_tier: hub``, treg/call/hub_stage.py)."""
        t = self.target
        if t is None or (t.catalog is None and t.hub is None):
            return []
        out = [("X-Treg-Credential-Tier", str(t.credential_tier))]
        if cost_micro is not None:
            out.append(("X-Treg-Cost-Micro", str(int(cost_micro))))
        if self.cache_state is not None:
            out.append(("X-Treg-Cache", self.cache_state))
        if self.capacity_probe is not None:
            out.append(("X-Treg-Capacity-Probe", "1"))
        if self.smoothed:
            out.append(("X-Treg-Smoothed", ", ".join(self.smoothed)))
        return out
