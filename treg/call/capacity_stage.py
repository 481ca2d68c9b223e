"""Capacity stage: the platform tier's breaker and burst smoothing wired into a call (docs/resilience.md).

Only calls on treg's own vendor key (``credential_tier == "platform"``) pass through here; for the own,
team and anonymous tiers every function returns at its first line (a team's own key running dry is
the team's own answer), and :func:`send` is not called at all (``service.execute`` sends every other call
with the relay's plain send). Where each part runs in :func:`treg.call.service.execute`:

* :func:`check_lock`, after authorize and before reserve: a call whose provider (``balance``) or
  endpoint (``quota``) is locked is refused with 503 ``provider_capacity`` before any idempotency
  claim or hold, unless it takes the lock's probe slot. The lock is read from the process's in-memory
  :class:`~treg.capacity.breaker.LockView`: an unlocked provider costs no query;
* :func:`send`, in place of the relay's send on the platform tier only: the spacer's wait (the hold is
  already placed, no database connection is held while waiting), then the send, then at most one re-send
  of a short ``burst`` 429 on a body-less GET/HEAD;
* :func:`after_answer`, from the settle stage once the hold was settled or released: the answer
  classified, a ``balance``/``quota`` strike or a 2xx (a probe's 2xx clears its lock) written on the
  breaker's own short transaction, never while the upstream is awaited. The answer's
  ``X-Treg-Capacity-Probe`` / ``X-Treg-Smoothed`` are among the catalog's headers
  (``CallState.catalog_headers``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from treg.call import encodings, evidence, relay
from treg.capacity.classify import BODY_HEAD_BYTES, Signal, Unrecorded, classify
from treg.capacity.errors import ProviderCapacity
from treg.catalog.alternatives import alternatives
from treg.catalog.model import Endpoint
from treg.catalog.tiers import OrgCredentials
from treg.context import Services
from treg.errors import TregError
from treg.infra.upstream import UpstreamResponse
from treg.org_data import load_org_credentials

if TYPE_CHECKING:
    from treg.call.state import CallState

log = logging.getLogger(__name__)

#: the most app shutdown waits for the lock view's listener to stop
STOP_TIMEOUT_S = 5.0
#: the methods whose burst 429 is re-sent once (nothing they carry can be applied twice)
_RESENDABLE = ("GET", "HEAD")


def _platform(state: "CallState") -> bool:
    t = state.target
    return t is not None and t.catalog is not None and t.credential_tier == "platform"


# -- before reserve: refuse a locked key -----------------------------------------------------------

async def check_lock(svc: Services, state: "CallState",
                     overflows: Callable[[Services, "CallState"], bool] | None = None) -> None:
    """Raise :class:`ProviderCapacity` when a lock covers this platform-tier call and its probe slot is
    taken; a call that takes the slot goes on as the lock's probe (``state.capacity_probe``). A call
    ``overflows`` says may go to an aggregator goes on with ``state.capacity_lock`` set instead: the
    reserve stage then skips its direct attempt (treg/call/overflow_stage.py)."""
    if not _platform(state):
        return
    t = state.target
    assert t is not None and state.ident is not None
    view = svc.lock_view
    # while its listener is connected the view is exact (every write NOTIFYs, an expiry is a clock
    # comparison): answered from memory, never a query on the call path; without the listener it
    # reloads at least every second (the contract's 2 s)
    provider = t.provider or ""
    endpoint = t.endpoint_id
    lock = view.cached(provider, endpoint) if view.connected.is_set() else await view.lookup(provider, endpoint)
    if lock is None:
        return
    if view.take_probe(lock):
        state.capacity_probe = lock
        log.info("capacity probe of %s (%s) by call %s", lock.key, lock.kind, state.inp.call_id)
        return
    if overflows is not None and overflows(svc, state):
        state.capacity_lock = lock  # the reserve stage skips the direct attempt for an aggregator
        return
    # refused: the caller's other options, with the tier each would get (cache reads, as the ladder's)
    creds = await load_org_credentials(svc, state.ident)
    raise ProviderCapacity(provider=lock.provider, endpoint=endpoint, kind=lock.kind,
                           resets_at=lock.until if lock.reset_stated else None,
                           alternatives=open_alternatives(svc, t.catalog.endpoint, creds))


def open_alternatives(svc: Services, endpoint: Endpoint, creds: OrgCredentials) -> list[dict[str, Any]]:
    """The catalog's alternatives, less those the same lock (or another) would refuse on the platform
    tier: naming a sibling endpoint of an empty account as an option would send the caller to a 503."""
    out = []
    for alt in alternatives(svc.catalog, endpoint, svc.settings, creds):
        other = svc.catalog.get(alt["id"])
        if alt["tier"] == "platform" and other is not None and svc.lock_view.cached(other.provider, other.id):
            continue
        out.append(alt)
    return out


# -- the send: spacer, then at most one re-send ----------------------------------------------------

async def send(svc: Services, state: "CallState") -> UpstreamResponse:
    """The relay's send of a platform-tier call, spaced per provider, and a short burst 429 re-sent once."""
    t = state.target
    assert t is not None
    waited = await svc.spacer.wait(t.provider or "", t.catalog.rate_limit)
    if waited > 0:
        state.smoothed += (f"wait={waited}",)
    resp = state.resp = await relay.send(svc, state)  # an exit from here on closes it
    if resp.status != 429 or not _resendable(state):
        return resp
    # the 429's head decides; the caller gets every byte of it when it is not re-sent
    head, _, body = await evidence.peek_head(resp.body, BODY_HEAD_BYTES)
    first = replace(resp, body=body)
    sig = classify(svc.capacity_signatures, t.provider or "", t.endpoint_id, resp.status, resp.headers,
                   _decoded(head, resp.headers))
    delay = sig.retry_after_s if isinstance(sig, Signal) and sig.kind == "burst" else None
    if delay is None or delay > svc.settings.smoothing_retry_max_s:
        return first  # a quota 429, an unknown one or a long Retry-After is the caller's to read
    first.close()  # an exit while sleeping closes it again (a no-op) and releases the hold
    await asyncio.sleep(delay)
    resp = await relay.send(svc, state)
    state.smoothed += ("retry=1",)
    return resp  # a second 429 is relayed as it is


def _resendable(state: "CallState") -> bool:
    prepared = state.prepared
    if prepared is None or prepared.request.method.upper() not in _RESENDABLE:
        return False
    body = prepared.request.body
    return body is None or body == b""


def _decoded(head: bytes, headers: Any) -> bytes:
    """An answer's head as a signature reads it: decompressed when a vendor compressed its error."""
    applied = encodings.codings(headers)
    if not applied or not head:
        return head
    whole = encodings.decode(head, applied, BODY_HEAD_BYTES)  # the whole (small) error body
    if whole:
        return whole
    start = encodings.decode_head(head, applied, BODY_HEAD_BYTES)  # or only its start (gzip, deflate)
    return start[0] if start is not None else head


# -- after settle: classify, strike, clear ---------------------------------------------------------

def classify_answer(svc: Services, state: "CallState", resp: UpstreamResponse, body_head: bytes) -> Any:
    """The answer's capacity classification, once per answer (overflow reads it before the hold
    closes, the breaker after): kept on ``state.capacity_signal``."""
    if state.capacity_signal is None:
        t = state.target
        assert t is not None
        state.capacity_signal = classify(svc.capacity_signatures, t.provider or "", t.endpoint_id, resp.status,
                                         resp.headers, _decoded(body_head[:BODY_HEAD_BYTES], resp.headers))
    return state.capacity_signal


async def after_answer(svc: Services, state: "CallState", resp: UpstreamResponse, body_head: bytes) -> None:
    """After the hold was settled or released: the breaker learns from the answer."""
    if not _platform(state):
        return
    t = state.target
    assert t is not None
    provider, endpoint = t.provider or "", t.endpoint_id
    status = resp.status
    probe = state.capacity_probe
    if 200 <= status < 300:
        if probe is not None:
            await _written("probe_succeeded", lambda: svc.breaker.probe_succeeded(probe.key))
        await _written("succeeded", lambda: svc.breaker.succeeded(provider, endpoint))
    elif status >= 400:
        sig = classify_answer(svc, state, resp, body_head)
        if isinstance(sig, Unrecorded):
            log.warning(*sig.log_args())
        elif isinstance(sig, Signal) and sig.strikes:
            # while locked this is "already_locked": a failure never extends a lock
            await _written("strike", lambda: svc.breaker.strike(sig.kind, provider, endpoint, sig.resets_at))


async def _written(what: str, write: Callable[[], Awaitable[Any]]) -> None:
    """A breaker write that fails (the database is away) costs the next caller the protection, never
    this caller its answer: the vendor's answer is already settled and goes out."""
    try:
        await write()
    except TregError as exc:
        log.warning("capacity %s not recorded (%s)", what, exc.code)


# -- the process's part: the lock view's listener, the gauge ----------------------------------------

async def setup(app: Any, svc: Services) -> Callable[[], Awaitable[None]]:
    """An app component: the lock view LISTENs (a lock written by any process is honoured here within
    2 s) and the ``treg_capacity_locks`` gauge reads it."""
    await svc.lock_view.start()
    svc.metrics.capacity_locks.set_function(svc.lock_view.lock_count)

    async def close() -> None:
        # bounded: a listener cancelled inside its connect must not hold up the app's shutdown
        stopping = asyncio.ensure_future(svc.lock_view.stop())
        await asyncio.wait({stopping}, timeout=STOP_TIMEOUT_S)
        if stopping.done() and not stopping.cancelled() and stopping.exception() is not None:
            log.warning("capacity lock view stopped with %r", stopping.exception())

    return close
