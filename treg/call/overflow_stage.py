"""Overflow stage: a platform-tier call served through an aggregator (treg's other account at a reseller of
the same vendor endpoint), contract § "Overflow to aggregators", docs/resilience.md.

Two entry points, each called with one line from a stage file:

* :func:`instead_of_direct` (reserve stage, after the idempotency claim, before the direct hold): the
  call's lock key is locked, so the direct attempt is skipped (no direct hold, no vendor call) and the
  call overflows; when it cannot, the caller gets 503 ``provider_capacity`` with alternatives.
* :func:`after_direct` (settle stage, the metered direct answer read whole, before its hold closes): the
  answer says treg's account is out (``balance``/``quota``) or is a burst 429: the direct hold is
  released (0) and the overflow attempt's answer is the caller's.

Every rule is checked before any aggregator is contacted (:func:`_eligible`). One aggregator at most per
call. Money: the overflow attempt's own hold ``<call_id>:overflow`` goes through the ordinary limits and
is settled at the aggregator's reported price; it is closed exactly once, here or by the call's one exit
(``treg/call/record.py`` calls :meth:`Attempt.close`). Audit: the direct attempt's row (id ``call_id``,
its real status, cost 0, no event) and the overflow attempt's row (id ``<call_id>:overflow``, tier
``platform-overflow``, ``served_via``), which carries the call's one ``tool_called`` event.

No database connection is held while the aggregator is awaited: each store read/write is its own short
transaction, and the aggregator's run happens between them.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable
from urllib.parse import unquote, unquote_plus

from sqlalchemy import select

from treg import json_text, money
from treg.call import capacity_stage, demo, evidence
from treg.call.record import answered, audit
from treg.call.state import CallOutcome, CallState
from treg.capacity.classify import Signal
from treg.capacity.errors import ProviderCapacity
from treg.catalog.enforce import check_request
from treg.call_record import CallRecord
from treg.context import Services
from treg.infra.schema import orgs
from treg.redaction import NO_SECRETS, Redactor
from treg.infra.upstream import NotServing
from treg.overflow import aggregator as agg
from treg.overflow.aggregator import OverflowInput, OverflowResult, OverflowRoute
from treg.call.overflow_outcome import Verdict, judge
from treg.org_data import load_org_credentials
from treg.overflow.store import OverflowStore
from treg.query import split_query

if TYPE_CHECKING:
    from treg.capacity.breaker import Lock
    from treg.infra.upstream import UpstreamResponse

log = logging.getLogger(__name__)

TIER = "platform-overflow"
HOLD_SUFFIX = ":overflow"
#: never overflowed: a repeat elsewhere of a write that may have happened is not the same call
_NEVER_METHODS = frozenset({"PUT", "PATCH", "DELETE"})
#: never overflowed whatever a signature says: treg's key refused (401), a timeout (408/504)
_NEVER_STATUSES = frozenset({401, 408, 504})
_OVERFLOW_KINDS = ("balance", "quota")


@dataclass
class Attempt:
    """The overflow attempt of one call (``CallState.overflow``), filled in as it goes.

    Until :attr:`took_over` the call's rows are the direct attempt's; from then on (the direct row is
    queued) every further row of the call (its finish, or its one exit) is this attempt's, retargeted by
    :meth:`retarget`."""

    call_id: str
    route: OverflowRoute
    base_url: str
    hold: money.Hold | None = None
    hold_state: str | None = None
    cost_micro: int = 0
    #: the direct attempt's row, queued (without an event) when this attempt takes the answer over
    direct_row: CallRecord | None = field(default=None, repr=False)
    took_over: bool = False

    @property
    def aggregator(self) -> str:
        return self.route.aggregator

    @property
    def hold_id(self) -> str:
        return self.call_id + HOLD_SUFFIX

    @property
    def served_via(self) -> str:
        return f"overflow:{self.aggregator}"

    async def close(self, svc: Services, *, settle_micro: int | None = None) -> None:
        """Close the overflow hold exactly once: settle at ``settle_micro``, else release. A second call
        (the call's exit after this stage closed it) finds it closed."""
        if self.hold is None or self.hold_state is not None:
            return
        if settle_micro is not None and await money.settle(svc, self.hold_id, settle_micro):
            self.cost_micro = self.hold.charge_for(settle_micro)
            self.hold_state = money.SETTLED
        else:
            await money.release(svc, self.hold_id)
            self.cost_micro = 0
            self.hold_state = money.RELEASED

    def take_over(self, svc: Services) -> None:
        """From here on the answer is this attempt's: the direct row goes out (no event: the call has
        one, for its final answer)."""
        if self.took_over:
            return
        self.took_over = True
        if self.direct_row is not None:
            audit(svc, self.direct_row, event=False)

    def retarget(self, rec: CallRecord) -> CallRecord:
        """A row of the call as this attempt's once it took over (``CallState.record`` calls this)."""
        return self.row(rec) if self.took_over else rec

    def row(self, rec: CallRecord) -> CallRecord:
        return rec._replace(id=self.hold_id, credential_tier=TIER, cost_micro=self.cost_micro,
                            hold_state=self.hold_state, parent_call_id=self.call_id, served_via=self.served_via,
                            upstream_url=self.base_url)


# -- eligibility (before any aggregator is contacted) ------------------------------------------------
def _statically_eligible(svc: Services, state: "CallState") -> bool:
    """What the call alone says: mode not off, platform tier, a route declared, not PUT/PATCH/DELETE."""
    t = state.target
    return (svc.settings.overflow_mode != "off" and t is not None and t.catalog is not None and t.billed
            and t.credential_tier == "platform" and bool(t.catalog.endpoint.overflow)
            and state.inp.method.upper() not in _NEVER_METHODS)


def may_overflow(svc: Services, state: "CallState") -> bool:
    """Before reserve: a locked key's call that overflow may serve instead of the breaker's 503 (the
    org's opt-out is read later, before any aggregator is contacted, and answers the same 503)."""
    return _statically_eligible(svc, state)


def _signal_overflows(signal: Any, status: int) -> bool:
    """``balance``/``quota`` (treg's account is out), or a burst 429 smoothing did not absorb."""
    if status in _NEVER_STATUSES or not isinstance(signal, Signal):
        return False
    return signal.kind in _OVERFLOW_KINDS or (signal.kind == "burst" and status == 429)


def _overflow_input(state: "CallState") -> OverflowInput | None:
    """The caller's request as the aggregator's envelope carries it; None when it cannot (a body not in
    hand or not JSON: an envelope wraps JSON)."""
    t, inp = state.target, state.inp
    assert t is not None and t.catalog is not None
    raw = inp.body
    if raw is not None and not isinstance(raw, bytes):
        return None
    body: Any = None
    if raw:
        try:
            body = json_text.parse(raw)
        except ValueError:  # not JSON, or nested too deeply (treg/json_text.py)
            return None
    # the same checks the call already passed: they give the slots and the query without the slots
    checked = check_request(t.catalog.endpoint, method=inp.method, query=split_query(inp.raw_query), body=raw)
    path = {k: unquote(v) for k, v in checked.path_values.items()}
    query = {unquote_plus(k): unquote_plus(v or "") for k, v in checked.query}
    return OverflowInput(method=inp.method.upper(), path_params=path, query=query, body=body)


async def org_allows(svc: Services, org_id: str) -> bool:
    """The org did not opt out (``PATCH /api/v1/org {"platform_overflow": false}``)."""
    async with svc.db.tx() as tx:
        value = await tx.scalar(select(orgs.c.platform_overflow).where(orgs.c.id == org_id))
    return value is not False


async def _eligible(svc: Services, state: "CallState") -> tuple[OverflowRoute, OverflowInput] | None:
    """The route to take and the input to send, or None (the call does not overflow)."""
    call = _overflow_input(state)
    if call is None:
        return None
    assert state.ident is not None and state.target is not None
    if not await org_allows(svc, state.ident.org_id):
        return None
    route = await OverflowStore(svc.db, svc.settings).first_usable(state.target.catalog.endpoint.overflow,
                                                                   state.target.provider)
    return (route, call) if route is not None else None


def _none_usable(route: Any) -> bool:
    return False


async def overflow_usability(svc: Services, ident: Any, endpoints: Any) -> Callable[[str], Callable[[Any], bool]]:
    """For the catalog listing: provider → which of its endpoints' routes a call of this org would take
    now (``Endpoint.summary_json(overflow_usable=…)``). Nothing is usable with overflow not ``on`` or
    the org opted out; the store is read only when a listed endpoint declares a route."""
    if svc.settings.overflow_mode != "on" or not any(ep.overflow for ep in endpoints) \
            or not await org_allows(svc, ident.org_id):
        return lambda provider: _none_usable
    view = await OverflowStore(svc.db, svc.settings).usability()
    return view.predicate


# -- entry points ----------------------------------------------------------------------------------
async def instead_of_direct(svc: Services, state: "CallState") -> "CallOutcome | None":
    """Reserve stage, before the direct hold. None: the direct attempt goes ahead."""
    t = state.target
    if t is None or t.catalog is None or not t.billed:
        return None
    lock = state.capacity_lock  # found by the capacity stage from memory; None: not locked, or this is a probe
    if lock is None:
        if _statically_eligible(svc, state) and state.inp.body is not None and not isinstance(state.inp.body, bytes):
            await _keep_body(svc, state)  # after_direct may have to send it again, wrapped
        return None
    plan = await _eligible(svc, state) if _statically_eligible(svc, state) else None
    if plan is None:
        raise await _capacity_error(svc, state, lock)
    route, call = plan
    if svc.settings.overflow_mode == "shadow":
        # shadow never skips the direct attempt: the lock answers as it would without overflow
        await _shadow(svc, state, route, call)
        raise await _capacity_error(svc, state, lock)
    # the direct attempt was skipped: its row says the breaker refused it (no hold, cost 0)
    direct = state.record(outcome="refused", status=None, refused_by="capacity", error_code=ProviderCapacity.code,
                          blame=ProviderCapacity.blame)
    return await _serve(svc, state, route, call, direct, lock=lock)


async def after_direct(svc: Services, state: "CallState", resp: "UpstreamResponse",
                       data: bytes) -> "CallOutcome | None":
    """Settle stage, a metered direct answer ≥ 400 read whole (``data``), before its hold closes and
    before it is stored for replay. None: the direct answer stands."""
    if not _statically_eligible(svc, state) or resp.status in _NEVER_STATUSES:
        return None
    t = state.target
    assert t is not None
    signal = capacity_stage.classify_answer(svc, state, resp, data)
    if not _signal_overflows(signal, resp.status):
        return None
    plan = await _eligible(svc, state)
    if plan is None:
        return None
    route, call = plan
    if svc.settings.overflow_mode == "shadow":
        await _shadow(svc, state, route, call)
        return None
    await state.close_money(svc)  # the direct hold released (0) before the overflow hold is placed
    # the direct attempt's row keeps its answer's head, as when it is relayed
    head = data[:evidence.RESPONSE_HEAD_MAX]
    direct = state.record(outcome="upstream_error", status=resp.status, blame="upstream",
                          request_bytes=state.inp.content_length, error_request=state.request_evidence(),
                          error_response=evidence.response_evidence(resp.status, resp.headers, head,
                                                                    len(data) > len(head), state.redactor))
    return await _serve(svc, state, route, call, direct, lock=None, signal=signal)


# -- the attempt -----------------------------------------------------------------------------------
def _base_url(svc: Services, route: OverflowRoute) -> str:
    return svc.settings.overflow_url(route.aggregator, svc.aggregators[route.aggregator].default_url)


async def _run(svc: Services, route: OverflowRoute, call: OverflowInput) -> OverflowResult:
    """One aggregator run, no database connection open. Never raises for what the aggregator did."""
    aggregator = svc.aggregators[route.aggregator]
    base_url = _base_url(svc, route)
    key = svc.settings.overflow_key(route.aggregator)
    assert key is not None  # first_usable skips one without a key
    try:
        result = await aggregator.run(svc.aggregator_client, base_url=base_url, key=key, route=route, call=call,
                                      poll_max_s=svc.settings.overflow_poll_max_s)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        # a plugin broke its promise not to raise: what it did is not an answer treg can read
        log.warning("aggregator %s raised %s; treated as not an envelope", route.aggregator, type(exc).__name__)
        result = OverflowResult(agg.NOT_ENVELOPE, message="the aggregator plugin failed")
    if not isinstance(result, OverflowResult):
        result = OverflowResult(agg.NOT_ENVELOPE, message="the aggregator plugin returned no result")
    return result


async def _account(svc: Services, state: "CallState", route: OverflowRoute, result: OverflowResult,
                   *, shadow: bool) -> Verdict:
    """What the attempt means; its spend and health mark written (each its own short transaction)."""
    t = state.target
    assert t is not None
    store = OverflowStore(svc.db, svc.settings)
    verdict = judge(route.aggregator, t.provider or "", t.endpoint_id, result, svc.capacity_signatures)
    if result.price_micro > 0:
        await store.record_spend(route.aggregator, result.price_micro)  # treg pays it, shadow or not
    if verdict.mark is not None:
        until = await store.mark_unhealthy(verdict.mark, verdict.mark_reason or "failed")
        log.warning("overflow: %s marked unhealthy until %s (%s)", verdict.mark, until.isoformat(),
                    verdict.mark_reason)
    if verdict.serve:
        outcome = "served"
    elif verdict.refused:
        outcome = agg.REFUSED
    else:  # a vendor answer through it saying treg's account there is out has no failure of its own
        outcome = result.failure or agg.VENDOR_CAPACITY
    svc.metrics.overflow.labels(aggregator=route.aggregator,
                                result=("shadow_" + outcome) if shadow else outcome).inc()
    return verdict


async def _shadow(svc: Services, state: "CallState", route: OverflowRoute, call: OverflowInput) -> None:
    """Shadow mode: the aggregator called where ``on`` would call it, logged and paid (its budget), the
    caller's answer untouched and uncharged."""
    result = await _run(svc, route, call)
    verdict = await _account(svc, state, route, result, shadow=True)
    shape = type(result.vendor_body).__name__ if result.vendor_body is not None else None
    log.info("overflow shadow: call %s via %s: aggregator status %s, vendor status %s, body %s, cost %d micro, "
             "would %s", state.inp.call_id, route.aggregator, result.aggregator_status, result.vendor_status,
             shape, result.price_micro,
             "serve" if verdict.serve else ("stand aside (refused)" if verdict.refused else "fail"))


async def _serve(svc: Services, state: "CallState", route: OverflowRoute, call: OverflowInput,
                 direct: CallRecord, *, lock: "Lock | None", signal: Signal | None = None) -> "CallOutcome | None":
    """The overflow attempt in ``on`` mode. ``lock``: the direct attempt was skipped for it (None: the
    direct answer is in hand and stands when the aggregator refuses this request)."""
    assert state.ident is not None and state.target is not None
    attempt = Attempt(state.inp.call_id, route, base_url=_base_url(svc, route))
    attempt.direct_row = direct
    state.overflow = attempt
    try:
        attempt.hold = await money.place_hold(svc, org_id=state.ident.org_id, member_id=state.ident.member_id,
                                              call_id=attempt.hold_id, amount_micro=route.price_micro,
                                              tag=state.inp.tag, **demo.hold_cap(state.ident, svc))
    except BaseException:
        attempt.take_over(svc)  # an empty balance is the normal 402, recorded as this attempt's
        raise
    try:
        result = await _run(svc, route, call)
        verdict = await _account(svc, state, route, result, shadow=False)
        if verdict.serve:
            return await _served(svc, state, attempt, result, verdict)
        await attempt.close(svc)  # released: an aggregator failure charges nothing
        if verdict.refused and lock is None:
            # the aggregator refused this request: the vendor's direct answer stands; the refused attempt
            # keeps its own row (no event: the direct answer has the call's one)
            audit(svc, attempt.row(state.record(outcome="refused", status=result.aggregator_status,
                                                refused_by="overflow")), event=False)
            state.overflow = None
            return None
        attempt.take_over(svc)
        raise await _capacity_error(svc, state, lock, signal=signal,
                                    refused=verdict.refused_message if verdict.refused else None)
    except BaseException:
        attempt.take_over(svc)  # whatever ends the call now is this attempt's row (the exit records it)
        raise


async def _served(svc: Services, state: "CallState", attempt: Attempt, result: OverflowResult,
                  verdict: Verdict) -> "CallOutcome":
    status = int(result.vendor_status or 200)
    # the vendor's answer as the aggregator relayed it: its key (treg's account there) never reaches the
    # caller, wherever the aggregator or the vendor echoed it (treg/call/answer_mask.py's masking)
    body = _aggregator_redactor(svc, attempt).data(result.vendor_bytes())
    ctype = "text/plain; charset=utf-8" if isinstance(result.vendor_body, str) else "application/json"
    # stored BEFORE settling (as the settle stage does): a crash between leaves a hold the reaper releases
    await state.store_for_replay(svc, status, [("Content-Type", ctype)], body)
    await attempt.close(svc, settle_micro=verdict.charge_micro)
    attempt.take_over(svc)
    headers = [("Content-Type", ctype), ("Content-Length", str(len(body))),
               ("X-Treg-Served-Via", attempt.served_via), *state.catalog_headers(attempt.cost_micro)]
    return CallOutcome.whole_answer(status, headers, body, answered(svc, state, status), relayed=False)


# -- helpers ---------------------------------------------------------------------------------------

def _aggregator_redactor(svc: Services, attempt: Attempt) -> Redactor:
    key = svc.settings.overflow_key(attempt.aggregator)
    return svc.platform_redactors.redactor((key.reveal(),)) if key is not None else NO_SECRETS

async def _capacity_error(svc: Services, state: "CallState", lock: "Lock | None", *, signal: Signal | None = None,
                          refused: str | None = None) -> ProviderCapacity:
    """The 503 the caller gets when overflow could not serve a call treg's own account cannot."""
    t, ident = state.target, state.ident
    assert t is not None and t.catalog is not None and ident is not None
    endpoint = t.catalog.endpoint
    others = {a.provider for a in svc.catalog.with_capability(endpoint.capability)} if endpoint.capability else set()
    creds = await load_org_credentials(svc, ident, {endpoint.provider} | others)
    # the lock's kind and reset, or what the direct answer said (balance, quota or burst)
    if lock is not None:
        kind, resets = lock.kind, (lock.until if lock.reset_stated else None)
    else:
        kind, resets = (signal.kind, signal.resets_at) if signal is not None else ("balance", None)
    exc = ProviderCapacity(provider=t.provider or endpoint.provider, endpoint=t.endpoint_id, kind=kind,
                           resets_at=resets, alternatives=capacity_stage.open_alternatives(svc, endpoint, creds),
                           overflow_refused=refused)
    return exc  # the call's one exit adds its catalog headers


async def _keep_body(svc: Services, state: "CallState") -> None:
    """Read a streamed body (bounded) so an overflow after the direct answer can send it again."""
    await state.read_body(svc.settings.json_body_max_bytes)


async def setup(app: Any, svc: Services) -> Any:
    """Component (treg.app.COMPONENTS): the session aggregator runs use (the breaker's store and lock view
    are the capacity stage's, treg/call/capacity_stage.py)."""
    import aiohttp

    from treg.infra.dns import VettingConnector, VettingResolver

    # operator-configured hosts, yet vetted like upstreams (api.md "DNS"; TREG_SSRF_ALLOW exempts): an
    # aggregator URL pointed inside (a typo, a poisoned config) must not make treg post its key and the
    # caller's request there. No cookies, no proxy from the environment
    connector = VettingConnector(svc.resolver) if isinstance(svc.resolver, VettingResolver) else None
    session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False,
                                    timeout=aiohttp.ClientTimeout(total=None, connect=10))
    svc.aggregator_client = session

    async def close() -> None:
        svc.aggregator_client = NotServing()
        await session.close()

    return close
