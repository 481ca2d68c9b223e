"""Record stage: every attempt with an identity becomes one audit row (queued, written in batches by the
audit writer, ``treg/call/audit.py``) and one ``tool_called`` event, exactly once, however it ended.

* a relayed answer is recorded by its outcome's ``finish`` (:func:`finisher`), called by the edge when
  streaming ended; an answer treg has whole (a replay, an archive hit, an overflow's or a routed call's)
  by :func:`answered`'s;
* every exceptional exit goes through :func:`exit_call`, the one unwind: the upstream answer closed,
  the hold and the idempotency claim given back, the failure recorded with redacted evidence.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from treg import idempotency
from treg.call import call_caps, demo, evidence, hub_views, intake
from treg.call.state import CallState, Finish
from treg.call_record import CallRecord
from treg.context import Services
from treg.errors import DbPoolExhausted, TregError
from treg.events import Event
from treg.infra.upstream import UpstreamResponse
from treg.plugins import call_hook, has_impls


def audit(svc: Services, rec: CallRecord, *, event: bool = True) -> None:
    """Queue the row (and count it in the metrics), then tell the ``treg_event`` observers (``tool_called``),
    if there are any. ``event`` False: a row of a call whose one event another row carries (an
    overflowed call's direct attempt, treg/call/overflow_stage.py)."""
    svc.audit.record(rec)
    if rec.hub_twin is not None:  # a hub call of another org's tool: the publishing org's row too
        svc.audit.record(rec.hub_twin)
    svc.metrics.observe_call(rec)
    if not event or not has_impls(svc.pm, "treg_event"):
        return  # no observer: do not build an event nobody reads
    call_hook(svc.pm, "treg_event", event=Event("tool_called", {
        "call_id": rec.id, "org_id": rec.org_id, "member_id": rec.member_id, "surface": rec.surface,
        "method": rec.method, "outcome": rec.outcome, "status": rec.status, "refused_by": rec.refused_by,
        "error_code": rec.error_code, "blame": rec.blame, "tool_id": rec.tool_id, "tool_name": rec.tool_name,
        "provider": rec.provider, "endpoint_id": rec.endpoint_id, "credential_tier": rec.credential_tier,
        "cost_micro": rec.cost_micro, "duration_ms": rec.duration_ms, "ttfb_ms": rec.ttfb_ms,
        "request_bytes": rec.request_bytes, "response_bytes": rec.response_bytes, "failure_kind": rec.failure_kind,
        "result_state": rec.result_state, "result_reason": rec.result_reason, "cache_state": rec.cache_state,
        "cache_admission": rec.cache_admission, "kind": rec.kind, "capacity_signal": rec.capacity_signal,
        "probe": rec.probe, "smoothed": rec.smoothed, "tag": rec.tag, "user_agent": rec.user_agent,
        "credential_kind": rec.credential_kind, "connection_id": rec.connection_id, "demo": rec.demo,
    }))


def _unexpected() -> TregError:
    """What an unexpected exception is recorded as: treg's own failure (the edge answers the same 500)."""
    return TregError("treg failed unexpectedly; the error was logged", code="internal_error", status=500,
                     blame="treg")


def _failure_record(state: CallState, exc: TregError, failure_kind: str | None = None) -> CallRecord:
    intake.drop_invalid_tag(state)  # refused before its tag was checked: the row cannot hold every tag
    err_req = state.request_evidence()
    err_resp = None
    if err_req is not None:
        err_resp = {"status": exc.status, "headers": [["Content-Type", "application/json"], ["X-Treg-Error", "1"]],
                    "body": state.redactor.text(json.dumps(exc.body())), "body_truncated": False}
    if failure_kind is None and isinstance(exc, DbPoolExhausted):
        failure_kind = "db_pool"  # the pool timed out after identity: treg's capacity, not the caller's
    return state.record(outcome="refused" if exc.is_refusal else "gateway_failed", status=exc.status,
                        refused_by=exc.refused_by, error_code=exc.code, blame=exc.blame, error_request=err_req,
                        error_response=err_resp, failure_kind=failure_kind)


async def _unwind(svc: Services, state: CallState, exc: BaseException) -> None:
    """Release the hold, give the label back, and a refused demo call's hour (shielded from cancellation:
    a cancelled call must still close its money; the reaper is the last resort)."""
    svc.hub.release(svc, state.inp.call_id)  # a hub call's slot (none taken: nothing to give back)

    async def work() -> None:
        try:
            try:
                await state.close_money(svc)
            finally:
                if state.overflow is not None:
                    await state.overflow.close(svc)  # the overflow attempt's own hold (treg/call/overflow_stage.py)
        finally:
            try:
                await idempotency.abandon(svc, state.claim)
            finally:
                await demo.give_back(svc, state, exc)  # refused before any vendor contact: not counted
    with contextlib.suppress(Exception):
        await asyncio.shield(work())


async def exit_call(svc: Services, state: CallState, exc: BaseException) -> None:
    """An exceptional exit of an identified call, at any stage, recorded once: the upstream answer (if
    one arrived) closed, the hold and the claim given back, the audit row queued: a TregError as
    itself, any other exception as treg's ``unexpected_exception``, a cancellation (or a caller gone)
    as cancelled. The row is queued even when a second cancellation interrupts the unwinding."""
    resp = state.resp
    if resp is not None:
        resp.close()  # once: CloseOnce ignores a repeat
    if isinstance(exc, TregError):  # a hub caller never reads the publisher's setup in a refusal
        hub_views.scrub_error(exc, state.ident, state.target, state.masked)
    try:
        await _unwind(svc, state, exc)
        await call_caps.give_back(svc, state, exc)  # a refused call does not count against the member's cap
    finally:
        if not state.audited:
            state.audited = True
            if isinstance(exc, TregError):
                exc.headers.update(state.catalog_headers(0))  # a refusal or failure is charged nothing
                exc.headers.update(demo.refusal_headers(state))  # X-Treg-Demo: 1 on a demo call's refusal
                audit(svc, _failure_record(state, exc))
            elif isinstance(exc, Exception) and not isinstance(exc, ConnectionError):
                # the edge logs it with its traceback and answers 500 internal_error
                audit(svc, _failure_record(state, _unexpected(), failure_kind="unexpected_exception"))
            else:
                audit(svc, state.record(outcome="cancelled", status=resp.status if resp is not None else None))


def ended_as(status: int, error: BaseException | None) -> str:
    """The audit outcome of an answer whose streaming ended: whole (``error`` None) by its status, else
    cancelled (the caller left) or a stream error."""
    if error is not None:
        return "cancelled" if isinstance(error, (ConnectionError, asyncio.CancelledError)) else "stream_error"
    return "ok" if status < 400 else "upstream_error"


def finish_once(state: CallState, record_answer: Finish) -> Finish:
    """An outcome's ``finish``: ``record_answer(sent, error)`` run once however often the edge calls it,
    and the call counted as audited (an exit after it records nothing more)."""
    finished = False

    def finish(sent: int, error: BaseException | None) -> None:
        nonlocal finished
        if finished:
            return
        finished = True
        state.audited = True
        record_answer(sent, error)

    return finish


def finisher(svc: Services, state: CallState, resp: UpstreamResponse,
             err_head: tuple[bytes, bool] | None) -> Finish:
    """The outcome's ``finish``: records the relayed answer once streaming ended (``err_head``: the head
    of a failed answer, kept as evidence)."""
    def record_answer(sent: int, error: BaseException | None) -> None:
        resp.close()  # no-op after a full read (the body iterator released it); else drop the connection
        if error is None and err_head is None:  # the common case: a relayed answer, nothing to keep
            audit(svc, state.record(outcome="ok" if resp.status < 400 else "upstream_error", status=resp.status,
                                    response_bytes=sent, request_bytes=state.inp.content_length))
            return
        outcome = ended_as(resp.status, error)
        failed = resp.status >= 400 or state.vendor_error
        if outcome == "ok" and state.vendor_error:
            outcome = "vendor_error"  # a 2xx that failed the endpoint's success rule (treg/catalog/success.py)
        error_response = None
        if err_head is not None:
            error_response = evidence.response_evidence(resp.status, resp.headers, err_head[0], err_head[1],
                                                        state.redactor)
        audit(svc, state.record(outcome=outcome, status=resp.status, response_bytes=sent,
                                request_bytes=state.inp.content_length, error_request=state.request_evidence(),
                                error_response=error_response, blame="upstream" if failed else None))

    return finish_once(state, record_answer)


def answered(svc: Services, state: CallState, status: int, *, replayed: bool = False) -> Finish:
    """The ``finish`` of an answer treg has whole (``CallOutcome.whole_answer``: an archive hit, an
    overflow's or a routed call's answer, a replay): its one audit row once streaming ended, as
    :func:`finisher` records a relayed one (nothing of it is kept as evidence). ``replayed``: an
    idempotent replay, recorded as such."""
    def finish(sent: int, error: BaseException | None) -> None:
        if state.audited:
            return
        state.audited = True
        if replayed:
            audit(svc, state.record(outcome="replayed", status=status, response_bytes=sent))
        else:
            audit(svc, state.record(outcome=ended_as(status, error), status=status, response_bytes=sent,
                                    request_bytes=state.inp.content_length,
                                    blame="upstream" if status >= 400 else None))

    return finish
