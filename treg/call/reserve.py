"""Reserve stage (platform-tier catalog calls only): treg's idempotency claim, then the money hold, both
before any upstream I/O. The hold is closed exactly once afterwards (``CallState.close_money``): by the
settle stage, or by the one exit (``treg/call/record.py``) on any failure or cancellation."""

from __future__ import annotations

from treg import idempotency, money
from treg.call import demo, headers as hdr, overflow_stage
from treg.call.record import answered
from treg.call.resources import call_pin
from treg.call.state import CallOutcome, CallState
from treg.context import Services

#: a stored answer's headers that are the original call's, not the replay's
_NOT_REPLAYED = frozenset({"x-treg-call-id", "x-treg-cost-micro", "x-treg-idempotent-replay", "content-length",
                           "x-treg-credential-tier"})


async def reserve(svc: Services, state: CallState) -> CallOutcome | None:
    """Claim the caller's ``Idempotency-Key`` (a stored answer comes back as a replay outcome), then
    place the hold. None: the call goes on to the relay."""
    target, inp, ident = state.target, state.inp, state.ident
    assert target is not None and ident is not None
    cat = target.catalog
    if cat is None or not target.billed:
        return None
    if inp.idempotency_key and inp.deferred is None:  # a routed call's child: the key is the routed call's
        body = await state.read_body(svc.settings.json_body_max_bytes) or b""  # the digest hashes it
        if await claim_key(svc, state, target.endpoint_id or "", body):
            return replay_outcome(svc, state)
    if (overflowed := await overflow_stage.instead_of_direct(svc, state)) is not None:  # a locked key
        return overflowed
    # a hold this process closes itself may come from a credit lease (treg/money/leases.py); an async
    # submission's is handed to its job (closed by a poll, in any process), a routed child's settles
    # with its routed call: each places its own
    leasable = cat.endpoint.async_job is None and inp.deferred is None
    state.hold = await money.place_hold(svc, org_id=ident.org_id, member_id=ident.member_id, call_id=inp.call_id,
                                        amount_micro=cat.hold_micro, tag=inp.tag, leasable=leasable,
                                        **demo.hold_cap(ident, svc))  # a demo call: its daily budget too
    return None


async def claim_key(svc: Services, state: CallState, endpoint_id: str, body: bytes) -> bool:
    """Claim the caller's ``Idempotency-Key`` for this request (``state.claim``); True: a stored answer
    is to be replayed (``state.claim`` holds it). A label in use or reused for another request raises
    its refusal. The pin (the call's tag) gets its own replay namespace."""
    inp, ident = state.inp, state.ident
    assert ident is not None and inp.idempotency_key
    digest = idempotency.request_digest(inp.method, endpoint_id, inp.raw_query, body)
    state.claim = await idempotency.claim(svc, ident.org_id, inp.idempotency_key, digest, call_id=inp.call_id,
                                         pin=call_pin(inp))
    if state.claim.outcome is idempotency.ClaimOutcome.REPLAY:
        return True
    refusal = state.claim.refusal()
    if refusal is not None:
        state.claim = None  # not ours to abandon
        raise refusal
    return False


def replay_outcome(svc: Services, state: CallState) -> CallOutcome:
    """The stored answer of ``state.claim`` (a REPLAY), not charged again (a hub call's too,
    treg/call/hub_stage.py)."""
    c = state.claim
    assert c is not None and c.status is not None
    body = c.body or b""
    headers = hdr.replayed(c.headers, _NOT_REPLAYED)
    headers += [("Content-Length", str(len(body))), ("X-Treg-Idempotent-Replay", "true")]
    headers += state.catalog_headers(0)  # a replay is not charged again
    state.claim = None
    return CallOutcome.whole_answer(c.status, headers, body, answered(svc, state, c.status, replayed=True))
