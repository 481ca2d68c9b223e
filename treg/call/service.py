"""The call use case: intake → resolve → authorize → reserve → relay → settle → evidence.

Plain Python: the web edge hands in a :class:`CallInput` and gets back a :class:`CallOutcome` to
stream, or a :class:`TregError` (already audited). No database connection is held while the upstream
is being waited on: each stage opens and closes its own short transaction (most reads are cache hits),
and the audit row is queued, not written, on the hot path.

Money (catalog calls on the platform tier): the hold is placed before any upstream I/O and closed
exactly once after: settled at the observed price when the answer is 2xx, released otherwise, on a
treg-side failure, and on cancellation. A billed answer is read whole (buffered or spooled) and
settled before its headers go out, so ``X-Treg-Cost-Micro`` is exact.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from treg import idempotency, money, tenancy
from treg.call import catalog_stage, encodings, evidence, headers as hdr, metered, redirects
from treg.call.authorize import authorize
from treg.call.relay import PreparedRequest, buffer_body, prepare
from treg.call.resolve import resolve
from treg.call.target import ensure_dials, mask_userinfo
from treg.call.types import CallInput, CallRecord, PendingBody, ResolvedTarget
from treg.context import Services
from treg.errors import DbPoolExhausted, GatewayFailed, SsrfRefused, TregError
from treg.events import Event
from treg.infra import upstream
from treg.infra.upstream import UpstreamResponse
from treg.plugins import call_hook, has_impls, spool_evidence_paths
from treg.tenancy import Identity

log = logging.getLogger(__name__)


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


@dataclass(slots=True)
class CallState:
    """What is known about a call so far, for its audit row and event."""

    inp: CallInput
    started: float = field(default_factory=time.monotonic)
    ident: Identity | None = None
    target: ResolvedTarget | None = None
    prepared: PreparedRequest | None = None
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

    @property
    def redactor(self) -> evidence.Redactor:
        # built on first use: its encoded variants cost more than a whole successful relay's bookkeeping
        if self._redactor is None:
            self._redactor = (self.prepared.redactor() if self.prepared is not None
                              else evidence.Redactor.for_values(self.secret_values))
        return self._redactor

    def _masked(self, text: str) -> str:
        """``text`` with injected values masked; the cheap path when no value could be in it."""
        if not self.secret_values:
            return text
        return self.redactor.text(text)

    def record(self, *, outcome: str, status: int | None, refused_by: str | None = None,
               error_code: str | None = None, blame: str | None = None, request_bytes: int | None = None,
               response_bytes: int | None = None, error_request: dict[str, Any] | None = None,
               error_response: dict[str, Any] | None = None, failure_kind: str | None = None) -> CallRecord:
        """The audit row, with the optional columns a stage knows (named parameters: a misspelt column
        is a TypeError, and no keyword dict is built per call)."""
        assert self.ident is not None
        t = self.target
        inp = self.inp
        tool = t.tool if t else None
        # positional, in CallRecord's field order: built on every call, and keywords cost three times as much
        return CallRecord(
            inp.call_id, self.ident.org_id, self.ident.member_id, inp.surface, inp.method,
            mask_userinfo(self._masked(inp.rest[:2000]), evidence.MASK), outcome, status,
            evidence.redact_url(t.upstream_url, self.redactor if self.secret_values else evidence.NO_SECRETS)
            if t else None,
            tool.id if tool else None, tool.name if tool else None, t.provider if t else None,
            t.endpoint_id if t else None, refused_by, error_code, blame,
            t.credential_tier if t else None, self.cost_micro, self.hold_state, inp.tag, request_bytes,
            response_bytes, int((time.monotonic() - self.started) * 1000), self.ttfb_ms,
            error_request, error_response, failure_kind, inp.parent_call_id)

    def request_evidence(self) -> dict[str, Any] | None:
        if self.prepared is not None:
            r = self.prepared.request
            return evidence.request_evidence(r.method, r.url, r.headers, r.body if isinstance(r.body, bytes) else None,
                                             self.prepared.body_kept, self.redactor)
        if self.target is not None:
            body = self.inp.body if isinstance(self.inp.body, bytes) else None
            return evidence.request_evidence(self.inp.method, self.target.full_url,
                                             hdr.request_headers(self.inp.headers), body, body is not None,
                                             self.redactor)
        return None


def _audit(svc: Services, rec: CallRecord) -> None:
    writer = svc.extras.get("audit")
    if writer is not None:
        writer.record(rec)
    if not has_impls(svc.pm, "treg_event"):
        return  # no observer: do not build an event nobody reads
    call_hook(svc.pm, "treg_event", event=Event("tool_called", {
        "call_id": rec.id, "org_id": rec.org_id, "member_id": rec.member_id, "surface": rec.surface,
        "method": rec.method, "outcome": rec.outcome, "status": rec.status, "refused_by": rec.refused_by,
        "error_code": rec.error_code, "blame": rec.blame, "tool_id": rec.tool_id, "tool_name": rec.tool_name,
        "provider": rec.provider, "endpoint_id": rec.endpoint_id, "credential_tier": rec.credential_tier,
        "cost_micro": rec.cost_micro, "duration_ms": rec.duration_ms, "ttfb_ms": rec.ttfb_ms,
        "request_bytes": rec.request_bytes, "response_bytes": rec.response_bytes, "failure_kind": rec.failure_kind,
    }))


def _intake_failed(svc: Services, inp: CallInput, exc: TregError) -> None:
    """A call that failed before its caller was known (the database pool timed out on the identity
    lookup): no org to record it under, so only an event, naming the surface and nothing of the target."""
    log.warning("call %s failed before identity: %s", inp.call_id, exc.code)
    call_hook(svc.pm, "treg_event", event=Event("call_intake_failed", {
        "call_id": inp.call_id, "surface": inp.surface, "failure_kind": exc.code, "status": exc.status}))


def _unexpected() -> TregError:
    """What an unexpected exception is recorded as: treg's own failure (the edge answers the same 500)."""
    return TregError("treg failed unexpectedly; the error was logged", code="internal_error", status=500,
                     blame="treg")


def _failure_record(state: CallState, exc: TregError, failure_kind: str | None = None) -> CallRecord:
    refused = exc.refused_by is not None or exc.status < 500 or isinstance(exc, SsrfRefused)
    err_req = state.request_evidence()
    err_resp = None
    if err_req is not None:
        err_resp = {"status": exc.status, "headers": [["Content-Type", "application/json"], ["X-Treg-Error", "1"]],
                    "body": state.redactor.text(json.dumps(exc.body())), "body_truncated": False}
    if failure_kind is None and isinstance(exc, DbPoolExhausted):
        failure_kind = "db_pool"  # the pool timed out after identity: treg's capacity, not the caller's
    return state.record(outcome="refused" if refused else "gateway_failed", status=exc.status,
                        refused_by=exc.refused_by, error_code=exc.code, blame=exc.blame, error_request=err_req,
                        error_response=err_resp, failure_kind=failure_kind)


async def _close_money(svc: Services, state: CallState, *, settle_micro: int | None = None) -> None:
    """Close the call's hold exactly once (settle when ``settle_micro`` is given, else release) and
    give back an idempotency claim that will not be completed. Safe to call twice."""
    if state.hold is not None and state.hold_state is None:
        if settle_micro is not None and await money.settle(svc, state.inp.call_id, settle_micro):
            state.cost_micro = state.hold.charge_for(settle_micro)
            state.hold_state = money.SETTLED
        else:
            # released now, or already released by the reaper (settle found no open hold): charged 0
            await money.release(svc, state.inp.call_id)
            state.cost_micro = 0
            state.hold_state = money.RELEASED


async def _unwind(svc: Services, state: CallState) -> None:
    """A call ended before its answer: release the hold, give the label back (shielded from cancellation:
    a cancelled call must still close its money; the reaper is the last resort)."""
    async def work() -> None:
        try:
            await _close_money(svc, state)
        finally:
            await idempotency.abandon(svc, state.claim)
    with contextlib.suppress(Exception):
        await asyncio.shield(work())


async def _exit(svc: Services, state: CallState, exc: BaseException, *, status: int | None = None,
                resp: UpstreamResponse | None = None) -> None:
    """An exceptional exit of an identified call, recorded once: the upstream answer (if any) closed,
    the hold and the claim given back, the audit row queued: a TregError as itself, any other
    exception as treg's ``unexpected_exception``, a cancellation (or a caller gone) as cancelled. The
    row is queued even when a second cancellation interrupts the unwinding."""
    if resp is not None:
        resp.close()  # once: CloseOnce ignores a repeat
    try:
        await _unwind(svc, state)
    finally:
        if not state.audited:
            state.audited = True
            if isinstance(exc, TregError):
                exc.headers.update(catalog_stage.tier_headers(state.target))
                _audit(svc, _failure_record(state, exc))
            elif isinstance(exc, Exception) and not isinstance(exc, ConnectionError):
                # the edge logs it with its traceback and answers 500 internal_error
                _audit(svc, _failure_record(state, _unexpected(), failure_kind="unexpected_exception"))
            else:
                _audit(svc, state.record(outcome="cancelled", status=status))


async def execute(svc: Services, inp: CallInput) -> CallOutcome:
    state = CallState(inp)
    # 401s are answered and logged, not recorded: there is no org to record them under.
    try:
        state.ident = ident = (tenancy.cached_identity(svc, inp.token, inp.org_hint)
                               or await tenancy.authenticate(svc, inp.token, inp.org_hint))
    except DbPoolExhausted as exc:
        _intake_failed(svc, inp, exc)
        raise
    try:
        if isinstance(inp.body, PendingBody):  # the edge's reading that waited for identity
            state.inp = inp = await inp.body.load(inp)
        if inp.catalog_form:
            inp, target = await catalog_stage.resolve_catalog_surface(svc, ident, inp)
        elif inp.surface == "redirect":
            inp, target = redirects.redirect_target(svc, ident, inp)
        else:
            inp, target = await resolve(svc, ident, inp, catalog_stage.named_miss, catalog_stage.final_miss)
        state.inp, state.target = inp, target
        await authorize(svc, ident, inp.method, target, inp.headers)
        if target.billed:  # reserve stage: the platform tier only
            replay = await _reserve(svc, state)
            if replay is not None:
                return replay
        state.prepared = await prepare(svc, ident.org_id, state.inp, target)
        state.secret_values = state.prepared.secret_values
        req = state.prepared.request
        url = upstream.parse_url(req.url)
        if target.dial is not None:
            ensure_dials(url, target.dial)  # a passthrough's credential goes only where its tool was chosen by
        if svc.resolver is not None:
            # vet the host's current resolution before every send, kept-alive connection or not
            await svc.resolver.vet(url.raw_host or "")
        if svc.client is None:
            raise GatewayFailed("treg is shutting down", code="shutting_down", blame="treg")
        sent_at = time.monotonic()
        resp = await upstream.send(svc.client, req, url=url)
        state.ttfb_ms = int((time.monotonic() - sent_at) * 1000)
    except BaseException as exc:  # identified: recorded, cancelled or not
        await _exit(svc, state, exc)
        raise
    if state.hold is not None:
        return await _metered_outcome(svc, state, resp)
    if state.claim is not None:
        # a free streamed read is not stored for replay: the label goes back so a retry fetches again
        try:
            await idempotency.abandon(svc, state.claim)
        except BaseException as exc:
            await _exit(svc, state, exc, status=resp.status, resp=resp)
            raise
        state.claim = None
    return await _streamed_outcome(svc, state, resp)


async def _reserve(svc: Services, state: CallState) -> CallOutcome | None:
    """Reserve stage (platform tier only): treg's idempotency claim, then the money hold."""
    target, inp, ident = state.target, state.inp, state.ident
    assert target is not None and ident is not None
    cat = target.catalog
    if cat is None or not target.billed:
        return None
    if inp.idempotency_key:
        body = await buffer_body(inp.body, svc.settings.json_body_max_bytes) if inp.body is not None else b""
        if not isinstance(inp.body, bytes) and inp.body is not None:
            from dataclasses import replace
            state.inp = inp = replace(inp, body=body, content_length=len(body))
        digest = idempotency.request_digest(inp.method, target.endpoint_id or "", inp.raw_query, body)
        state.claim = await idempotency.claim(svc, ident.org_id, inp.idempotency_key, digest, call_id=inp.call_id)
        if state.claim.outcome is idempotency.ClaimOutcome.REPLAY:
            return _replay_outcome(svc, state)
        refusal = state.claim.refusal()
        if refusal is not None:
            state.claim = None  # not ours to abandon
            raise refusal
    state.hold = await money.place_hold(svc, org_id=ident.org_id, member_id=ident.member_id, call_id=inp.call_id,
                                        amount_micro=cat.hold_micro, tag=inp.tag)
    return None


def _replay_outcome(svc: Services, state: CallState) -> CallOutcome:
    c = state.claim
    assert c is not None and c.status is not None
    body = c.body or b""
    headers = [(k, v) for k, v in c.headers if k.lower() not in ("x-treg-call-id", "x-treg-cost-micro",
                                                                   "x-treg-idempotent-replay", "content-length",
                                                                   "x-treg-credential-tier")]
    headers += [("Content-Length", str(len(body))), ("X-Treg-Idempotent-Replay", "true")]
    headers += list(catalog_stage.tier_headers(state.target, 0).items())  # a replay is not charged again
    state.claim = None

    async def gen() -> AsyncIterator[bytes]:
        yield body

    def finish(sent: int, error: BaseException | None) -> None:
        _audit(svc, state.record(outcome="replayed", status=c.status, response_bytes=sent))

    names = {k.lower() for k, _ in headers}
    return CallOutcome(status=c.status, reason="", headers=headers, body=gen(), close=lambda: None, finish=finish,
                       content_length=len(body), has_content_type="content-type" in names,
                       has_server="server" in names)


async def _metered_outcome(svc: Services, state: CallState, resp: UpstreamResponse) -> CallOutcome:
    target = state.target
    assert target is not None and target.catalog is not None
    ok = 200 <= resp.status < 300
    # the upstream's headers the caller gets; the length is set below from what was actually read
    relayed = [(k, v) for k, v in hdr.response_headers(resp.headers) if k.lower() != "content-length"]
    spooled: metered.Spooled | None = None
    try:
        if "location" in resp.index or "content-location" in resp.index:
            relayed = _treg_locations(svc, state, relayed)
        if ok and target.catalog.spooled_response:
            budget = svc.extras.setdefault("spool_budget", metered.SpoolBudget())
            spooled = await metered.spool_answer(resp, budget)
            answer: Any = await metered.spool_evidence(
                spooled, (*target.catalog.endpoint.price.evidence_paths,
                          *spool_evidence_paths(svc.pm, target.catalog.endpoint)),
                encodings.codings(resp.headers))
            data = b""
        else:
            data = await metered.buffer_answer(resp)
            # the usage is read from the decoded copy; the caller gets ``data`` as the upstream sent it
            answer = await metered.answer_evidence(data, resp.headers) if ok else None
        if state.claim is not None:
            # store the answer BEFORE settling: a crash in between then leaves an open hold the reaper
            # releases (a free call), never a settled charge a retry would pay again
            if spooled is None:
                await idempotency.complete(svc, state.claim, resp.status, relayed, data)
            else:
                await idempotency.abandon(svc, state.claim)  # a spooled body is not stored for replay
            state.claim = None
        if ok:
            await _close_money(svc, state, settle_micro=catalog_stage.settle_amount(target, answer))
        else:
            await _close_money(svc, state)
    except BaseException as exc:
        if spooled is not None:
            spooled.close()
        await _exit(svc, state, exc, status=resp.status, resp=resp)
        raise
    length = spooled.size if spooled is not None else len(data)
    out_headers = list(relayed)
    out_headers.append(("Content-Length", str(length)))
    out_headers += list(catalog_stage.tier_headers(target, state.cost_micro).items())
    err_head = None if ok else (data[:evidence.RESPONSE_HEAD_MAX], len(data) > evidence.RESPONSE_HEAD_MAX)

    async def body() -> AsyncIterator[bytes]:
        if spooled is not None:
            async for chunk in spooled.stream():
                yield chunk
        elif data:
            yield data

    finish = _finisher(svc, state, resp, err_head)
    names = {k.lower() for k, _ in resp.headers}
    return CallOutcome(status=resp.status, reason=resp.reason, headers=out_headers, body=body(),
                       close=(spooled.close if spooled is not None else (lambda: None)), finish=finish,
                       content_length=length, has_content_type="content-type" in names, has_server="server" in names)


def _treg_locations(svc: Services, state: CallState, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A client following a relayed redirect must come back through treg (treg/call/redirects.py)."""
    assert state.ident is not None and state.target is not None
    return redirects.rewrite_locations(svc, state.ident, state.inp, state.target, headers, state._masked)


async def _streamed_outcome(svc: Services, state: CallState, resp: UpstreamResponse) -> CallOutcome:
    body = resp.body
    err_head: tuple[bytes, bool] | None = None
    if resp.status >= 400 and resp.whole is not None:
        err_head = (resp.whole[:evidence.RESPONSE_HEAD_MAX], len(resp.whole) > evidence.RESPONSE_HEAD_MAX)
    elif resp.status >= 400:
        # keep the head of a failed answer for evidence; the caller still gets every byte
        try:
            head, more, body = await evidence.peek_head(body)
        except BaseException as exc:  # the upstream broke, or the caller left, before any byte went out
            await _exit(svc, state, exc, status=resp.status, resp=resp)
            raise
        err_head = (head, more)
    out_headers = hdr.response_headers(resp.headers)
    if "location" in resp.index or "content-location" in resp.index:
        out_headers = _treg_locations(svc, state, out_headers)
    if state.target is not None and state.target.catalog is not None:
        out_headers += list(catalog_stage.tier_headers(state.target).items())
    index = resp.index
    cl = index.get("content-length")
    return CallOutcome(resp.status, resp.reason, out_headers, body, resp.close, _finisher(svc, state, resp, err_head),
                       int(cl) if cl and cl.strip().isdigit() else None, "content-type" in index, "server" in index,
                       resp.whole)


def _finisher(svc: Services, state: CallState, resp: UpstreamResponse,
              err_head: tuple[bytes, bool] | None) -> Callable[[int, BaseException | None], None]:
    finished = False

    def finish(sent: int, error: BaseException | None) -> None:
        nonlocal finished
        if finished:
            return
        finished = True
        state.audited = True
        resp.close()  # no-op after a full read (the body iterator released it); else drop the connection
        if error is None and err_head is None:  # the common case: a relayed answer, nothing to keep
            _audit(svc, state.record(outcome="ok" if resp.status < 400 else "upstream_error", status=resp.status,
                                     response_bytes=sent, request_bytes=state.inp.content_length))
            return
        if error is not None:
            outcome = "cancelled" if isinstance(error, (ConnectionError, asyncio.CancelledError)) else "stream_error"
        else:
            outcome = "ok" if resp.status < 400 else "upstream_error"
        error_response = None
        if err_head is not None:
            error_response = evidence.response_evidence(resp.status, resp.headers, err_head[0], err_head[1],
                                                        state.redactor)
        _audit(svc, state.record(outcome=outcome, status=resp.status, response_bytes=sent,
                                 request_bytes=state.inp.content_length, error_request=state.request_evidence(),
                                 error_response=error_response,
                                 blame="upstream" if resp.status >= 400 else None))

    return finish
