"""Settle stage: the upstream's answer made into the :class:`CallOutcome` the edge streams.

* **metered** (a hold is open): the answer is read whole (buffered, or spooled to disk for a large
  one), stored for an idempotent replay, and the hold settled at the observed price (2xx) or released,
  all before its headers go out, so ``X-Treg-Cost-Micro`` is exact;
* **streamed** (everything else): relayed as it arrives; only the head of a failed answer is peeked
  and kept as evidence.

Both rewrite ``Location``/``Content-Location`` back into treg (``treg/call/redirects.py``). A failure
here is the caller's (``service.execute``) one exit, like any stage's.
"""

from __future__ import annotations

from typing import Any, AsyncIterator

from treg import idempotency
from treg.call import (archive, capacity_stage, catalog_stage, encodings, evidence, headers as hdr, jobs,
                       metered, overflow_stage, redirects, resources, table)
from treg.call.record import finisher
from treg.call.state import CallOutcome, CallState
from treg.context import Services
from treg.infra.upstream import UpstreamResponse
from treg.plugins import spool_evidence_paths


async def settle(svc: Services, state: CallState) -> CallOutcome:
    resp = state.resp
    assert resp is not None
    # read whole too: an owned object's answer, an async submission or owned poll, a /table/ call's
    if state.hold is not None or resources.read_whole(state) or jobs.read_whole(state) or table.read_whole(state):
        return await _metered_outcome(svc, state, resp)
    if state.claim is not None:
        # a free streamed read is not stored for replay: the label goes back so a retry fetches again
        await idempotency.abandon(svc, state.claim)
        state.claim = None
    return await _streamed_outcome(svc, state, resp)


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
        if ok and target.catalog.spooled_response and state.inp.deferred is None:  # a routed parent reads it
            spooled = await metered.spool_answer(resp, svc.spool_budget)
            answer: Any = await metered.spool_evidence(
                spooled, (*target.catalog.endpoint.price.evidence_paths,
                          *spool_evidence_paths(svc.pm, target.catalog.endpoint),
                          *archive.classifier_paths(svc, target.endpoint_id)),
                encodings.codings(resp.headers))
            data = b""
        else:
            data = await metered.buffer_answer(resp)
            # the usage is read from the decoded copy; the caller gets ``data`` as the upstream sent it
            answer = await metered.answer_evidence(data, resp.headers) if ok else None
            if not ok and (overflowed := await overflow_stage.after_direct(svc, state, resp, data)) is not None:
                # treg's account is out: served through an aggregator; the direct hold is released, so
                # the breaker learns from the direct answer now (its strike locks the key for the next)
                overflowed.headers += await capacity_stage.after_answer(svc, state, resp, data)
                return overflowed
        await resources.observe_answer(svc, state, resp.status, answer)  # ownership before the answer leaves
        relayed += await jobs.after_answer(svc, state, resp.status, answer)  # async jobs (treg/call/jobs.py)
        if state.claim is not None:
            # store the answer BEFORE settling: a crash in between then leaves an open hold the reaper
            # releases (a free call), never a settled charge a retry would pay again
            if spooled is None:
                await idempotency.complete(svc, state.claim, resp.status, relayed, data)
            else:
                await idempotency.abandon(svc, state.claim)  # a spooled body is not stored for replay
            state.claim = None
        if state.inp.deferred is not None:  # a routed call's child: the routed call closes it (treg/call/routed.py)
            state.inp.deferred.add(state, catalog_stage.settle_amount(target, answer) if ok else None)
        elif table.settles(svc, state, ok, data, resp.headers):  # (/table/: a 2xx with no rows is not charged)
            await state.close_money(svc, settle_micro=catalog_stage.settle_amount(target, answer))
        else:
            await state.close_money(svc)
        await archive.observe(svc, state, resp, data if spooled is None else None, answer if ok else None)
    except BaseException:
        if spooled is not None:
            spooled.close()  # the spool file; the call's own unwind is the caller's
        raise
    length = spooled.size if spooled is not None else len(data)
    out_headers = list(relayed)
    out_headers.append(("Content-Length", str(length)))
    out_headers += list(catalog_stage.tier_headers(target, state.cost_micro, cost=not jobs.deferred(state)).items())
    out_headers += archive.answer_headers(state)
    out_headers += await capacity_stage.after_answer(svc, state, resp, data)  # the money is closed by now
    err_head = None if ok else (data[:evidence.RESPONSE_HEAD_MAX], len(data) > evidence.RESPONSE_HEAD_MAX)

    async def body() -> AsyncIterator[bytes]:
        if spooled is not None:
            async for chunk in spooled.stream():
                yield chunk
        elif data:
            yield data

    finish = finisher(svc, state, resp, err_head)
    names = {k.lower() for k, _ in resp.headers}
    return CallOutcome(status=resp.status, reason=resp.reason, headers=out_headers, body=body(),
                       close=(spooled.close if spooled is not None else (lambda: None)), finish=finish,
                       content_length=length, has_content_type="content-type" in names, has_server="server" in names,
                       raw_headers=resp.raw_headers)


def _treg_locations(svc: Services, state: CallState, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A client following a relayed redirect must come back through treg (treg/call/redirects.py)."""
    assert state.ident is not None and state.target is not None
    return redirects.rewrite_locations(svc, state.ident, state.inp, state.target, headers, state.masked)


async def _streamed_outcome(svc: Services, state: CallState, resp: UpstreamResponse) -> CallOutcome:
    # the archive, the tier and the breaker see catalog calls only (an own tool's answer skips them)
    catalog = state.target is not None and state.target.catalog is not None
    # resp.body, unless the archive reads it first
    body = await archive.read_for_archive(svc, state, resp) if catalog else resp.body
    err_head: tuple[bytes, bool] | None = None
    if resp.status >= 400 and resp.whole is not None:
        err_head = (resp.whole[:evidence.RESPONSE_HEAD_MAX], len(resp.whole) > evidence.RESPONSE_HEAD_MAX)
    elif resp.status >= 400:
        # keep the head of a failed answer for evidence; the caller still gets every byte (the upstream
        # breaking, or the caller leaving, before any byte went out is the call's exit like any failure)
        head, more, body = await evidence.peek_head(body)
        err_head = (head, more)
    out_headers = hdr.response_headers(resp.headers)
    if "location" in resp.index or "content-location" in resp.index:
        out_headers = _treg_locations(svc, state, out_headers)
    if catalog:
        assert state.target is not None
        out_headers += list(catalog_stage.tier_headers(state.target).items())
        out_headers += archive.answer_headers(state)
        out_headers += await capacity_stage.after_answer(svc, state, resp, err_head[0] if err_head else b"")
    index = resp.index
    cl = index.get("content-length")
    return CallOutcome(resp.status, resp.reason, out_headers, body, resp.close, finisher(svc, state, resp, err_head),
                       int(cl) if cl and cl.strip().isdigit() else None, "content-type" in index, "server" in index,
                       resp.whole, resp.raw_headers)
