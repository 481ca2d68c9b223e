"""The call use case: intake → resolve → authorize → (reserve) → relay → (settle) → evidence.

Plain Python: the web edge hands in a :class:`CallInput` and gets back a :class:`CallOutcome` to
stream, or a :class:`TregError` (already audited). No database connection is held while the upstream
is being waited on: each stage that reads opens and closes its own short transaction, and the audit
row is queued, not written, on the hot path.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable

from treg import tenancy
from treg.call import evidence, headers as hdr
from treg.call.authorize import authorize
from treg.call.relay import PreparedRequest, prepare
from treg.call.resolve import CatalogFallback, resolve
from treg.call.types import CallInput, CallRecord, ResolvedTarget
from treg.context import Services
from treg.errors import GatewayFailed, TregError
from treg.events import Event
from treg.infra import upstream
from treg.infra.upstream import UpstreamResponse
from treg.plugins import emit
from treg.tenancy import Identity

log = logging.getLogger(__name__)


@dataclass
class CallOutcome:
    """An upstream answer ready to stream: status, headers for the caller, the body, and ``finish``
    which the edge must await exactly once when streaming ended (normally or not)."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: AsyncIterator[bytes]
    response: UpstreamResponse
    finish: Callable[[int, BaseException | None], Awaitable[None]]
    #: the upstream sent a Content-Length: keep it even on a bodyless answer (HEAD/204/304)
    content_length: int | None = None
    has_content_type: bool = True
    has_server: bool = True


@dataclass
class CallState:
    """What is known about a call so far, for its audit row and event."""

    inp: CallInput
    started: float = field(default_factory=time.monotonic)
    ident: Identity | None = None
    target: ResolvedTarget | None = None
    prepared: PreparedRequest | None = None
    ttfb_ms: int | None = None
    redactor: evidence.Redactor = field(default_factory=evidence.Redactor)

    def record(self, *, outcome: str, status: int | None, **kw: Any) -> CallRecord:
        assert self.ident is not None
        t = self.target
        inp = self.inp
        target_text = inp.rest if len(inp.rest) < 2000 else inp.rest[:2000]
        return CallRecord(
            id=inp.call_id, org_id=self.ident.org_id, member_id=self.ident.member_id, surface=inp.surface,
            method=inp.method, target=self.redactor.text(target_text), outcome=outcome, status=status,
            upstream_url=evidence.redact_url(t.upstream_url, self.redactor) if t else None,
            tool_id=t.tool.id if t and t.tool else None, tool_name=t.tool.name if t and t.tool else None,
            provider=t.provider if t else None, endpoint_id=t.endpoint_id if t else None,
            credential_tier=t.credential_tier if t else None, tag=inp.tag,
            duration_ms=int((time.monotonic() - self.started) * 1000), ttfb_ms=self.ttfb_ms, **kw)


def _audit(svc: Services, rec: CallRecord) -> None:
    writer = svc.extras.get("audit")
    if writer is not None:
        writer.record(rec)
    emit(svc.pm, Event("tool_called", {
        "call_id": rec.id, "org_id": rec.org_id, "member_id": rec.member_id, "surface": rec.surface,
        "method": rec.method, "outcome": rec.outcome, "status": rec.status, "refused_by": rec.refused_by,
        "error_code": rec.error_code, "blame": rec.blame, "tool_id": rec.tool_id, "tool_name": rec.tool_name,
        "provider": rec.provider, "endpoint_id": rec.endpoint_id, "credential_tier": rec.credential_tier,
        "cost_micro": rec.cost_micro, "duration_ms": rec.duration_ms, "ttfb_ms": rec.ttfb_ms,
        "request_bytes": rec.request_bytes, "response_bytes": rec.response_bytes,
    }))


def _failure_record(state: CallState, exc: TregError) -> CallRecord:
    refused = exc.refused_by is not None or exc.status < 500 or exc.code == "ssrf_refused"
    outcome = "refused" if refused else "gateway_failed"
    err_req = err_resp = None
    if state.prepared is not None:
        p = state.prepared
        err_req = evidence.request_evidence(p.request.method, p.request.url, p.request.headers,
                                            p.request.body if isinstance(p.request.body, bytes) else None,
                                            p.body_kept, state.redactor)
    elif state.target is not None:
        err_req = evidence.request_evidence(state.inp.method, state.target.full_url,
                                            hdr.request_headers(state.inp.headers),
                                            state.inp.body if isinstance(state.inp.body, bytes) else None,
                                            isinstance(state.inp.body, bytes), state.redactor)
    if err_req is not None:
        err_resp = {"status": exc.status, "headers": [["Content-Type", "application/json"], ["X-Treg-Error", "1"]],
                    "body": state.redactor.text(json.dumps(exc.body())), "body_truncated": False}
    return state.record(outcome=outcome, status=exc.status, refused_by=exc.refused_by, error_code=exc.code,
                        blame=exc.blame, error_request=err_req, error_response=err_resp)


async def execute(svc: Services, inp: CallInput, *, catalog_fallback: CatalogFallback | None = None) -> CallOutcome:
    state = CallState(inp)
    # 401s are answered and logged, not recorded: there is no org to record them under.
    state.ident = await tenancy.authenticate(svc, inp.token, inp.org_hint)
    try:
        state.target = await resolve(svc, state.ident, inp, catalog_fallback)
        await authorize(svc, state.ident, inp.method, state.target)
        state.prepared = await prepare(svc, inp, state.target)
        state.redactor = evidence.Redactor.for_values(state.prepared.secret_values)
        req = state.prepared.request
        if svc.resolver is not None:
            # vet the host's current resolution before every send, kept-alive connection or not
            await svc.resolver.vet(upstream_host(req.url))
        if svc.client is None:
            raise GatewayFailed("treg is shutting down", code="shutting_down", blame="treg")
        sent_at = time.monotonic()
        resp = await upstream.send(svc.client, req)
        state.ttfb_ms = int((time.monotonic() - sent_at) * 1000)
    except TregError as exc:
        _audit(svc, _failure_record(state, exc))
        raise
    return await _outcome(svc, state, resp)


def upstream_host(url: str) -> str:
    from yarl import URL

    return URL(url, encoded=True).host or ""


async def _outcome(svc: Services, state: CallState, resp: UpstreamResponse) -> CallOutcome:
    body = resp.body
    err_resp_head: tuple[bytes, bool] | None = None
    if resp.status >= 400:
        # keep the head of a failed answer for evidence; the caller still gets every byte
        try:
            head, more, body = await evidence.peek_head(body)
        except TregError as exc:
            resp.close()
            _audit(svc, _failure_record(state, exc))
            raise
        err_resp_head = (head, more)
    out_headers = hdr.response_headers(resp.headers)
    names = {k.lower() for k, _ in resp.headers}
    cl = next((v for k, v in resp.headers if k.lower() == "content-length"), None)
    finished = False

    async def finish(sent: int, error: BaseException | None) -> None:
        nonlocal finished
        if finished:
            return
        finished = True
        resp.close()  # no-op after a full read (the body iterator released it); else drop the connection
        kw: dict[str, Any] = {}
        if error is not None:
            outcome = "cancelled" if isinstance(error, (ConnectionError, asyncio.CancelledError)) else "stream_error"
        else:
            outcome = "ok" if resp.status < 400 else "upstream_error"
        if err_resp_head is not None or error is not None:
            p = state.prepared
            assert p is not None
            kw["error_request"] = evidence.request_evidence(
                p.request.method, p.request.url, p.request.headers,
                p.request.body if isinstance(p.request.body, bytes) else None, p.body_kept, state.redactor)
            if err_resp_head is not None:
                kw["error_response"] = evidence.response_evidence(resp.status, resp.headers, err_resp_head[0],
                                                                  err_resp_head[1], state.redactor)
            if resp.status >= 400:
                kw["blame"] = "upstream"
        req_len = state.inp.content_length
        _audit(svc, state.record(outcome=outcome, status=resp.status, response_bytes=sent,
                                 request_bytes=req_len, **kw))

    return CallOutcome(status=resp.status, reason=resp.reason, headers=out_headers, body=body, response=resp,
                       finish=finish, content_length=int(cl) if cl and cl.isdigit() else None,
                       has_content_type="content-type" in names, has_server="server" in names)

