"""Settle stage: the upstream's answer made into the :class:`CallOutcome` the edge streams.

* **streamed** (an own tool's answer, and a catalog answer with no hold to settle): relayed as it
  arrives; only the head of a failed answer is peeked and kept as evidence;
* **a hub call's** (a published tool of an org, ``/call/<org-slug>.<name>/…``): ``hub_stage.answer``, read
  whole, checked for the publisher's credential, stored for a replay, then its hold settled or released;
* **metered** (a hold is open, or an owned object's or async job's answer): read whole (buffered, or
  spooled to disk for a large one), judged by the endpoint's declared success rule
  (:func:`vendor_success`, ``treg/catalog/success.py``: a 2xx failing it is a ``vendor_error``, relayed
  unchanged and charged nothing), then each catalog feature's part runs, one named function each, in
  this order (``treg/call/__init__.py`` draws the whole table):

  1. overflow (:func:`_overflow`): a failed direct answer saying treg's account is out is served
     through an aggregator instead, the direct hold released first;
  then, on the platform tier, the answer as its caller may read it (``treg/call/answer_mask.py``:
  treg's own key masked wherever the vendor echoed it; every part below sees that answer);
  2. owned resources (``resources.observe_answer``): a created object recorded as the org's before its
     id leaves;
  3. async jobs (``jobs.after_answer``): a submission's job recorded, its hold left open to its polls;
  4. money, the replay (``CallState.store_for_replay``): the answer stored for the idempotency key
     BEFORE the hold is settled, so a crash between the two leaves a free call, never a charge a retry
     would pay again;
  5. ``/table/`` (``table.settles``): a 2xx of which no table can be made (no rows where the endpoint's
     ``table`` says) is not a success for money; the table is made here, once, so what is charged and
     what is answered agree (any other call: the success rule decides);
  6. money, the hold (:func:`_close_hold`): settled at the observed price (a success) or released; a
     routed call's child leaves it to the routed call;
  7. archive (``archive.observe``): the answer classified and stored;
  8. capacity (``capacity_stage.after_answer``): the breaker learns from the answer, once its money is
     closed;

  and only then do its headers go out, so ``X-Treg-Cost-Micro`` is exact.

Both rewrite ``Location``/``Content-Location`` back into treg (``treg/call/redirects.py``) and end with
treg's own catalog headers (``CallState.catalog_headers``). A failure here is the caller's
(``service.execute``) one exit, like any stage's.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from multidict import CIMultiDict, CIMultiDictProxy

from treg import idempotency
from treg.call import answer_mask, archive, capacity_stage, catalog_stage, cookies, encodings, evidence, headers as hdr
from treg.call import hub_stage, jobs, metered, overflow_stage, redirects, resources, table
from treg.call.record import finisher
from treg.call.state import CallOutcome, CallState
from treg.catalog.success import succeeded
from treg.context import Services
from treg.errors import GatewayFailed
from treg.infra.upstream import InHand, UpstreamResponse
from treg.origin import path_prefix
from treg.plugins import spool_evidence_paths


async def settle(svc: Services, state: CallState) -> CallOutcome:
    resp = state.resp
    assert resp is not None and state.target is not None
    if state.target.catalog is None:  # an own tool's (or a redirect's) answer: none of the catalog's parts
        if state.target.hub is not None:  # a hub call's answer: read whole, checked, settled (hub_stage.py)
            return await hub_stage.answer(svc, state, resp)
        return await _streamed_outcome(svc, state, resp, False)
    # read whole too: an owned object's answer, an async submission or owned poll, a /table/ call's
    if (state.hold is not None or resources.read_whole(state) or jobs.read_whole(state)
            or table.read_whole(state)):
        return await _metered_outcome(svc, state, resp)
    if state.claim is not None:
        # a free streamed read is not stored for replay: the label goes back so a retry fetches again
        await idempotency.abandon(svc, state.claim)
        state.claim = None
    return await _streamed_outcome(svc, state, resp, True)


async def _metered_outcome(svc: Services, state: CallState, resp: UpstreamResponse) -> CallOutcome:
    ok = 200 <= resp.status < 300
    # the upstream's headers the caller gets; the length is set below from what was actually read
    relayed = hdr.response_headers(resp.headers, length=False)
    spooled: metered.Spooled | None = None
    reason = resp.reason
    try:
        if redirects.names_urls(resp.index):
            relayed = _treg_locations(svc, state, relayed)
        if "set-cookie" in resp.index:
            relayed = _scoped_cookies(svc, state, relayed)
        data, spooled, answer = await _read_answer(svc, state, resp, ok)
        if not ok and (overflowed := await _overflow(svc, state, resp, data)) is not None:  # 1 overflow
            return overflowed
        if _not_the_callers_key(state):  # treg's own key: never echoed to its caller
            data, relayed, reason = await _checked(state, resp, data, spooled, relayed)
        # the endpoint's declared success rule: a 2xx with an error inside is no success for money
        success = vendor_success(state, resp.status, answer)
        await resources.observe_answer(svc, state, resp.status, answer)  # 2 owned resources
        relayed += await jobs.after_answer(svc, state, resp.status, answer, success=success)  # 3 async jobs
        await state.store_for_replay(svc, resp.status, relayed, data if spooled is None else None)  # 4 money
        charged = table.settles(svc, state, success, data, resp.headers)  # 5 /table/: no rows, no charge
        await _close_hold(svc, state, charged, answer)  # 6 money
        await archive.observe(svc, state, resp, data if spooled is None else None, answer if ok else None)  # 7
    except BaseException:
        if spooled is not None:
            spooled.close()  # the spool file; the call's own unwind is the caller's
        raise
    await capacity_stage.after_answer(svc, state, resp, data)  # 8 capacity: the money is closed by now
    length = spooled.size if spooled is not None else len(data)
    headers = [*relayed, ("Content-Length", str(length)),
               *state.catalog_headers(None if jobs.deferred(state) else state.cost_micro)]
    # a failed answer's head is kept as evidence (a vendor_error's too: the error is inside its 2xx)
    err_head = None if success else (data[:evidence.RESPONSE_HEAD_MAX], len(data) > evidence.RESPONSE_HEAD_MAX)
    finish = finisher(svc, state, resp, err_head)
    if spooled is None:
        return CallOutcome.whole_answer(resp.status, headers, data, finish, reason=reason,
                                        raw_headers=resp.raw_headers)
    index = resp.index
    return CallOutcome(resp.status, resp.reason, headers, spooled.stream(), spooled.close, finish, length,
                       "content-type" in index, "server" in index, None, resp.raw_headers)


async def _read_answer(svc: Services, state: CallState, resp: UpstreamResponse,
                       ok: bool) -> tuple[bytes, metered.Spooled | None, Any]:
    """The answer read whole: (its bytes, or the spool that holds them; its JSON evidence for settlement,
    None for a failed answer). A 2xx of an endpoint declaring ``spooled_response`` is spooled to disk
    (unless a routed parent reads it), only the values settlement and classifiers read kept."""
    target = state.target
    assert target is not None and target.catalog is not None
    if ok and target.catalog.spooled_response and state.inp.deferred is None:
        spooled = await metered.spool_answer(resp, svc.spool_budget)
        answer = await metered.spool_evidence(
            spooled, (*target.catalog.endpoint.price.evidence_paths,
                      *spool_evidence_paths(svc.pm, target.catalog.endpoint),
                      *archive.classifier_paths(svc, target.endpoint_id), *success_paths(target)),
            encodings.answer_codings(resp))
        return b"", spooled, answer
    data = await metered.buffer_answer(resp)
    # the usage is read from the decoded copy; the caller gets ``data`` as the upstream sent it
    return data, None, (await metered.answer_evidence(data, applied=encodings.answer_codings(resp)) if ok else None)


async def _overflow(svc: Services, state: CallState, resp: UpstreamResponse, data: bytes) -> CallOutcome | None:
    """1: treg's account is out: served through an aggregator (``overflow_stage.after_direct``); the direct
    hold is released by then, so the breaker learns from the direct answer now (its strike locks the key
    for the next call). None: the direct answer stands."""
    overflowed = await overflow_stage.after_direct(svc, state, resp, data)
    if overflowed is not None:
        await capacity_stage.after_answer(svc, state, resp, data)
    return overflowed


def success_paths(target: Any) -> tuple[str, ...]:
    """The paths of the answer the endpoint's success rule reads (a spooled answer keeps them)."""
    rule = target.catalog.endpoint.success
    return rule.paths if rule is not None else ()


def vendor_success(state: CallState, status: int, answer: Any) -> bool:
    """Whether a metered answer is a success for money (treg/catalog/success.py: the endpoint's rule, else
    any 2xx); a 2xx that fails it is the call's ``vendor_error``: its hold released, its bytes relayed."""
    assert state.target is not None and state.target.catalog is not None
    ok = succeeded(state.target.catalog.endpoint.success, status, answer)
    state.vendor_error = 200 <= status < 300 and not ok
    return ok


async def _checked(state: CallState, resp: UpstreamResponse, data: bytes, spooled: metered.Spooled | None,
                   relayed: list[tuple[str, str]]) -> tuple[bytes, list[tuple[str, str]], str]:
    """The answer as a platform-tier caller may read it (treg/call/answer_mask.py): treg's key masked in
    its headers, reason phrase and body; a spooled body is scanned on disk (it holds the key: withheld).
    An answer that cannot be checked is refused, its hold released by the exit. The vendor's session
    cookies never go out (a session of treg's account is as much a credential as its key)."""
    relayed = answer_mask.without_sessions(relayed, resp.index)
    if spooled is not None:
        relayed, reason = answer_mask.checked_head(state.redactor, resp, relayed)
        if await asyncio.to_thread(answer_mask.clean_spool, state.redactor, spooled.file,
                                   encodings.answer_codings(resp)):
            return data, relayed, reason
        seen = None
    else:
        seen = await answer_mask.checked(state.redactor, resp, data, relayed)
    if seen is None:
        raise GatewayFailed(answer_mask.unreadable("treg's own key"), code="platform_answer_unreadable",
                            blame="upstream")
    return seen.data, seen.headers, seen.reason


async def _guarded(state: CallState, resp: UpstreamResponse) -> UpstreamResponse:
    """A streamed platform-tier answer as its caller may read it: its headers and reason phrase masked, its
    body checked as it streams (treg/call/answer_mask.py ``guarded``), or checked whole when it came with
    its head; an answer in a coding treg cannot check as it streams is refused before any byte."""
    relayed, reason = answer_mask.checked_head(state.redactor, resp,
                                               answer_mask.without_sessions(resp.headers, resp.index))
    if resp.whole is not None:
        seen = await answer_mask.checked(state.redactor, resp, resp.whole, relayed)
        if seen is not None:  # its length as masked (a masked body goes out decoded)
            headers = (*((k, v) for k, v in seen.headers if k.lower() != "content-length"),
                       ("Content-Length", str(len(seen.data))))
            return replace(resp, reason=seen.reason, headers=headers, body=InHand(seen.data), whole=seen.data,
                           index=CIMultiDictProxy(CIMultiDict(headers)))
    applied = encodings.answer_codings(resp)
    if resp.whole is not None or not answer_mask.streamable(applied):
        resp.close()
        raise GatewayFailed(answer_mask.unreadable("treg's own key"), code="platform_answer_unreadable",
                            blame="upstream")
    return replace(resp, reason=reason, headers=tuple(relayed),
                   body=answer_mask.guarded(state.redactor, resp.body, applied))


def _not_the_callers_key(state: CallState) -> bool:
    """The answer was fetched with treg's own vendor key (the platform tier), which no caller may read
    (treg/call/answer_mask.py); an org's own or team key is the org's to see echoed."""
    target = state.target
    return target is not None and target.credential_tier == "platform" and bool(state.secret_values)


async def _close_hold(svc: Services, state: CallState, ok: bool, answer: Any) -> None:
    """6: the hold settled at the answer's observed price (``ok``: a success) or released; a routed
    call's child leaves it, with what it would settle at, to the routed call (treg/call/routed.py)."""
    target = state.target
    assert target is not None
    if state.inp.deferred is not None:
        state.inp.deferred.add(state, catalog_stage.settle_amount(target, answer) if ok else None)
    elif ok:
        await state.close_money(svc, settle_micro=catalog_stage.settle_amount(target, answer))
    else:
        await state.close_money(svc)


def _treg_locations(svc: Services, state: CallState, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A client following a relayed redirect must come back through treg (treg/call/redirects.py)."""
    assert state.ident is not None and state.target is not None
    return redirects.rewrite_locations(svc, state.ident, state.inp, state.target, headers, state.masked)


def _scoped_cookies(svc: Services, state: CallState, headers: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """A client's cookie jar sends an upstream's cookie back on calls of that tool only (treg/call/cookies.py)."""
    return cookies.scope_cookies(state.inp, path_prefix(svc.settings), headers)


async def _streamed_outcome(svc: Services, state: CallState, resp: UpstreamResponse, catalog: bool) -> CallOutcome:
    if catalog and _not_the_callers_key(state):  # treg's own key: checked as it streams
        resp = await _guarded(state, resp)
    # the archive, the tier and the breaker see catalog calls only (an own tool's answer skips them)
    body = await archive.read_for_archive(svc, state, resp) if catalog else resp.body  # unless the archive reads it
    err_head: tuple[bytes, bool] | None = None
    if resp.status >= 400 and resp.whole is not None:
        err_head = (resp.whole[:evidence.RESPONSE_HEAD_MAX], len(resp.whole) > evidence.RESPONSE_HEAD_MAX)
    elif resp.status >= 400:
        # keep the head of a failed answer for evidence; the caller still gets every byte (the upstream
        # breaking, or the caller leaving, before any byte went out is the call's exit like any failure)
        head, more, body = await evidence.peek_head(body)
        err_head = (head, more)
    out_headers = hdr.response_headers(resp.headers)
    if redirects.names_urls(resp.index):
        out_headers = _treg_locations(svc, state, out_headers)
    if "set-cookie" in resp.index:
        out_headers = _scoped_cookies(svc, state, out_headers)
    if catalog:
        await capacity_stage.after_answer(svc, state, resp, err_head[0] if err_head else b"")
        out_headers += state.catalog_headers(0)
    index = resp.index
    cl = index.get("content-length")
    return CallOutcome(resp.status, resp.reason, out_headers, body, resp.close, finisher(svc, state, resp, err_head),
                       int(cl) if cl and cl.strip().isdigit() else None, "content-type" in index, "server" in index,
                       resp.whole, resp.raw_headers)
