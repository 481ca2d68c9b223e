"""Routed calls: ``treg.<capability>`` runs its children, cheapest first, as child calls of one call
(lifecycle.md "Routed endpoints"; the children's order is treg/catalog/routed.py's).

A routed endpoint has no credential ladder of its own: the resolve stage hands its plan here
(``ResolvedTarget.routed``), and each child is a whole call through :func:`treg.call.service.execute`
(ladder, deny rules, capacity, money, relay, audit), with the routed call's id as ``parent_call_id``.

* a child the caller has no credential tier for is skipped without a call (attempt error
  ``no_credential``); a child that fails (a non-2xx answer, a 2xx failing the child's declared success
  rule: ``vendor_error``, or a treg refusal such as ``provider_capacity`` or ``insufficient_balance``)
  passes to the next; the first 2xx that is a success stops;
* money: a child's settle stage does not close its hold but leaves it in :class:`DeferredCloses`
  (``CallInput.deferred``). When the routed call ends, the answering child is settled at its price and
  every other child released, each exactly once; a routed call that fails charges nothing. A child
  whose call raised closed its own hold already (the pipeline's one exit). A crash before the close
  leaves the holds open for the reaper (treg/reaper.py), which releases them: no charge;
* the ``Idempotency-Key`` is the routed call's: claimed here, stored with the routed answer, never
  claimed by a child (on the platform tier a child's upstream still gets the (org, label) digest);
* the answer is treg's own JSON, ``{"output", "_treg": {endpoint, credential_tier, cost_micro,
  attempts}}``, so each child's answer is read whole (at most the 8 MiB of a metered answer) and its
  request asks for identity encoding.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import replace
from typing import Any, Awaitable, Callable

from treg.call import call_caps, headers as hdr, metered, reserve
from treg.call.bodies import read_bounded
from treg.call.record import answered
from treg.call.state import CallOutcome, CallState
from treg.call.types import CallInput
from treg.catalog.routed import RoutedPlan
from treg.catalog.tiers import offer_tier
from treg.context import Services
from treg.errors import GatewayFailed, TregError
from treg.frozen import frozen_value
from treg.identity import Identity
from treg.ids import new_call_id
from treg.org_data import load_org_credentials

log = logging.getLogger(__name__)

#: the pipeline's entry point, handed in by treg/call/service.py (which imports this module)
Execute = Callable[[Services, CallInput], Awaitable[CallOutcome]]

ROUTED_TO = "X-Treg-Routed-To"
#: the caller's headers a child does not send: treg reads the child's answer itself, so it asks for
#: the identity encoding (the caller's Accept-Encoding is about treg's own answer)
_NOT_FOR_CHILDREN = frozenset({"accept-encoding"})
IDENTITY = ("Accept-Encoding", "identity")
#: a stored routed answer's headers that belong to the original call, not to its replay
_NOT_REPLAYED = frozenset({"x-treg-call-id", "x-treg-cost-micro", "x-treg-idempotent-replay", "content-length"})


@frozen_value
class Attempt:
    """One child of a routed call, as the answer's ``attempts`` lists it (``blame`` and ``detail``: why
    it failed, for ``route_exhausted``'s ``reasons``)."""

    endpoint: str
    status: int | None  # the child's HTTP status (a refusal's too); None: skipped, never called
    error: str | None  # None: the answer; else a treg error code, or upstream_error for a non-2xx
    blame: str | None = None  # who must act on the failure: a refusal's blame; upstream for a non-2xx
    detail: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "status": self.status, "error": self.error}

    def reason_json(self) -> dict[str, Any]:
        return {"endpoint": self.endpoint, "error": self.error, "blame": self.blame, "detail": self.detail}

    @classmethod
    def refused(cls, endpoint: str, exc: TregError) -> "Attempt":
        return cls(endpoint, exc.status, exc.code, exc.blame, exc.detail)


class DeferredCloses:
    """The holds a routed call's children left open: the settle stage of each billed child
    :meth:`add` s its state and the amount it would have settled (None: it would have released), and
    the routed call closes them all once it knows which child answered."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[CallState, int | None]] = {}

    def add(self, state: CallState, settle_micro: int | None) -> None:
        self._open[state.inp.call_id] = (state, settle_micro)

    def charge_of(self, call_id: str) -> int:
        """What settling ``call_id`` will charge (0: it holds nothing, or would not be charged)."""
        state, amount = self._open.get(call_id, (None, None))
        if state is None or state.hold is None or amount is None:
            return 0
        return state.hold.charge_for(amount)

    async def close(self, svc: Services, winner: str | None) -> CallState | None:
        """Release every child but ``winner``, then settle ``winner`` at its price; the winner's state
        (None: it held nothing). Each hold is closed once (``CallState.close_money`` is idempotent)."""
        for call_id, (state, _) in self._open.items():
            if call_id != winner:
                await state.close_money(svc)
        won = self._open.get(winner or "")
        if won is None:
            return None
        state, amount = won
        await state.close_money(svc, settle_micro=amount)
        return state

    async def release_all(self, svc: Services) -> None:
        """The routed call failed or was cancelled: release what is still open (shielded, as the
        pipeline's own unwind; what cannot be released now is the reaper's)."""
        async def work() -> None:
            for state, _ in self._open.values():
                with contextlib.suppress(Exception):
                    await state.close_money(svc)
        with contextlib.suppress(Exception):
            await asyncio.shield(work())


def child_input(inp: CallInput, endpoint_id: str, closes: DeferredCloses) -> CallInput:
    """The routed call's request as a call of one child: the same method, query, body, caller and tag,
    resolved as ``/catalog/call/<child>``, its hold left to ``closes``."""
    return replace(inp, call_id=new_call_id(), rest=endpoint_id, form="catalog", parent_call_id=inp.call_id,
                   headers=(*((k, v) for k, v in inp.headers if k.lower() not in _NOT_FOR_CHILDREN), IDENTITY),
                   deferred=closes)


class _Finishes:
    """The children's outcomes whose audit rows wait until their holds are closed (so each row shows
    its final cost and hold state)."""

    def __init__(self) -> None:
        self._pending: list[tuple[CallOutcome, int, BaseException | None]] = []

    def later(self, outcome: CallOutcome, sent: int, error: BaseException | None) -> None:
        outcome.close()
        self._pending.append((outcome, sent, error))

    def run(self) -> None:
        for outcome, sent, error in self._pending:
            outcome.finish(sent, error)
        self._pending.clear()


async def _read_whole(outcome: CallOutcome) -> bytes:
    """A child's 2xx answer, whole: the metered one is already in hand; a streamed one is read here,
    bounded like a metered answer (larger: the child fails with response_buffer_limit)."""
    if outcome.whole is not None:
        return outcome.whole
    return await read_bounded(outcome.body, metered.BUFFER_MAX, lambda: GatewayFailed(
        f"the answer is larger than {metered.BUFFER_MAX} bytes, the most a routed call reads from a child",
        code="response_buffer_limit", blame="treg"))


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    lname = name.lower()
    return next((v for k, v in headers if k.lower() == lname), None)


async def _output(data: bytes, headers: list[tuple[str, str]]) -> Any:
    """The child's answer as the routed answer's ``output``: its JSON; an answer that is not JSON as
    text; an empty one as null."""
    answer = await metered.answer_evidence(data, headers)
    if answer is not None or not data:
        return answer
    return data.decode("utf-8", "replace")


class _Won:
    """The child that answered 2xx: its call id, endpoint, outcome and whole answer."""

    def __init__(self, call_id: str, endpoint: str, outcome: CallOutcome, data: bytes) -> None:
        self.call_id, self.endpoint, self.outcome, self.data = call_id, endpoint, outcome, data
        self.tier = _header(outcome.headers, "X-Treg-Credential-Tier")


async def _try_child(svc: Services, execute: Execute, inp: CallInput, endpoint_id: str, closes: DeferredCloses,
                     finishes: _Finishes) -> tuple[Attempt, _Won | None]:
    child = child_input(inp, endpoint_id, closes)
    try:
        outcome = await execute(svc, child)
    except TregError as exc:  # refused or failed: the child's own exit recorded it and closed its hold
        return Attempt.refused(endpoint_id, exc), None
    except Exception:  # noqa: BLE001 (a bug in one child must not stop the route; recorded as the child's)
        log.exception("routed call %s: child %s failed unexpectedly", inp.call_id, endpoint_id)
        return Attempt(endpoint_id, 500, "internal_error", "treg", "treg failed on this child"), None
    if not 200 <= outcome.status < 300:
        finishes.later(outcome, 0, None)  # not read: the caller never gets it
        return Attempt(endpoint_id, outcome.status, "upstream_error", "upstream",
                       f"the upstream answered {outcome.status}"), None
    try:
        data = await _read_whole(outcome)
    except TregError as exc:
        finishes.later(outcome, 0, exc)
        return Attempt.refused(endpoint_id, exc), None
    finishes.later(outcome, len(data), None)
    endpoint = svc.catalog.get(endpoint_id)
    rule = endpoint.success if endpoint is not None else None
    if rule is not None and not rule.holds(outcome.status, await metered.answer_evidence(data, outcome.headers)):
        # a 2xx with an error inside (the child's declared success rule): no answer, the next child is tried
        return Attempt(endpoint_id, outcome.status, "vendor_error", "upstream",
                       "the answer failed the endpoint's success rule"), None
    return Attempt(endpoint_id, outcome.status, None), _Won(child.call_id, endpoint_id, outcome, data)


async def _claim(svc: Services, state: CallState, endpoint_id: str) -> CallOutcome | None:
    """The routed call's Idempotency-Key: a stored routed answer comes back as a replay outcome."""
    body = state.inp.body if isinstance(state.inp.body, bytes) else b""
    return _replay(svc, state) if await reserve.claim_key(svc, state, endpoint_id, body) else None


def _replay(svc: Services, state: CallState) -> CallOutcome:
    c = state.claim
    assert c is not None and c.status is not None
    state.claim = None
    body = c.body or b""
    headers = hdr.replayed(c.headers, _NOT_REPLAYED)
    headers += [("Content-Length", str(len(body))), ("X-Treg-Idempotent-Replay", "true"),
                ("X-Treg-Cost-Micro", "0")]  # a replay is not charged again
    return CallOutcome.whole_answer(c.status, headers, body, answered(svc, state, c.status, replayed=True),
                                    relayed=False)


def _answer(won: _Won, output: Any, cost: int, attempts: list[Attempt]) -> tuple[bytes, list[tuple[str, str]]]:
    body = json.dumps({"output": output, "_treg": {
        "endpoint": won.endpoint, "credential_tier": won.tier, "cost_micro": cost,
        "attempts": [a.to_json() for a in attempts]}}, ensure_ascii=False, separators=(",", ":")).encode()
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body))), hdr.NOSNIFF,
               (ROUTED_TO, won.endpoint), ("X-Treg-Credential-Tier", str(won.tier)), ("X-Treg-Cost-Micro", str(cost))]
    return body, headers


async def _route(svc: Services, execute: Execute, inp: CallInput, ident: Identity, plan: RoutedPlan,
                 closes: DeferredCloses, finishes: _Finishes, attempts: list[Attempt]) -> _Won | None:
    """The children in order until one answers 2xx (None: none did); each appended to ``attempts``."""
    creds = await load_org_credentials(svc, ident, plan.provider_ids)
    for ep, provider in plan.children:
        if offer_tier(provider, ep, creds, svc.settings) is None:
            attempts.append(Attempt(ep.id, None, "no_credential", "caller",
                                    f"no credential tier of yours can call {ep.id}"))
            continue
        attempt, won = await _try_child(svc, execute, inp, ep.id, closes, finishes)
        attempts.append(attempt)
        if won is not None:
            return won
    return None


def exhausted_blame(attempts: list[Attempt]) -> str:
    """Who must act when no child answered: the caller when every child refused for a caller reason
    (its own input, such as a missing required parameter; a credential it lacks), else the upstream."""
    return "caller" if attempts and all(a.blame == "caller" for a in attempts) else "upstream"


def _exhausted(endpoint_id: str, attempts: list[Attempt]) -> GatewayFailed:
    blame = exhausted_blame(attempts)
    if blame == "caller":
        why = "; ".join(f"{a.endpoint}: {a.error}: {a.detail}" for a in attempts)
        detail = f"every child of {endpoint_id} refused your request; nothing was charged ({why})"
    else:
        tried = "; ".join(f"{a.endpoint}: {a.error} ({a.status if a.status is not None else 'skipped'})"
                          for a in attempts)
        detail = f"every child of {endpoint_id} failed; nothing was charged ({tried})"
    return GatewayFailed(detail, code="route_exhausted", blame=blame, attempts=[a.to_json() for a in attempts],
                         reasons=[a.reason_json() for a in attempts], headers={"X-Treg-Cost-Micro": "0"})


async def run(svc: Services, state: CallState, execute: Execute) -> CallOutcome:
    """The routed call of ``state`` (resolved, identified): its children in order, then one answer.
    A failure raises (the pipeline's one exit records it and gives the label back)."""
    target, ident = state.target, state.ident
    assert target is not None and ident is not None
    plan: RoutedPlan = target.routed
    endpoint_id = target.endpoint_id or ""
    await call_caps.count(svc, state)  # one call of the member's cap, whatever its children (they count not)
    await state.read_body(svc.settings.json_body_max_bytes)  # every child may send it: read once
    inp = state.inp
    if inp.idempotency_key and (replay := await _claim(svc, state, endpoint_id)) is not None:
        return replay
    closes, finishes = DeferredCloses(), _Finishes()
    attempts: list[Attempt] = []
    try:
        won = await _route(svc, execute, inp, ident, plan, closes, finishes, attempts)
        if won is None:
            await closes.close(svc, None)
            raise _exhausted(endpoint_id, attempts)
        output = await _output(won.data, won.outcome.headers)
        expected = closes.charge_of(won.call_id)
        body, headers = _answer(won, output, expected, attempts)
        # stored BEFORE settling, as the settle stage does: a crash in between leaves open holds the
        # reaper releases (a free call), never a charge a retry would pay again
        await state.store_for_replay(svc, 200, headers, body)
        settled = await closes.close(svc, won.call_id)
        cost = settled.cost_micro if settled is not None else 0
        if cost != expected:  # the reaper closed the hold first: nothing was charged
            body, headers = _answer(won, output, cost, attempts)
    except BaseException:
        await closes.release_all(svc)
        raise
    finally:
        finishes.run()  # the children's rows, now that their holds are closed
    state.target = replace(target, credential_tier=won.tier)
    state.cost_micro = cost
    state.hold_state = settled.hold_state if settled is not None else None
    return CallOutcome.whole_answer(200, headers, body, answered(svc, state, 200), relayed=False)
