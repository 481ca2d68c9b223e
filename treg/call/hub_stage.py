"""A hub call through the pipeline's stages (docs/sharing.md "Hub"): ``/call/<org-slug>.<name>/<path>``
runs another org's published tool with that org's credentials.

* **resolve** (:func:`published`, :func:`target`): after the caller's own tools and the catalog missed
  the name (an own tool or a catalog id always wins), and only for a top-level call — never inside a
  routed call's children nor a followed redirect — the ref names a published tool; the target is the
  publisher's tool, ``credential_tier: hub``. An ``Idempotency-Key`` reaches the publisher's upstream
  as a digest of (caller org, label), as on treg's own key: the upstream account is shared by every
  caller, and two orgs' labels must not collide there.
* **authorize** (treg/call/authorize.py): both orgs' deny rules, no ACL of the publisher's.
* **admit** (:func:`admit`, before any upstream I/O): a priced call's ``Idempotency-Key`` claimed (a
  retry replays, not charged twice); the run's slot (treg/hub_runs.py: 429 ``hub_busy``, never queued);
  the caller's hold for ``price_micro``, credited to the publisher when it settles (one statement:
  treg/money/holds.py). An org calling its own ref is not charged.
* **relay**: the publisher's bindings, its secrets decrypted from its org's rows (:func:`secrets_org`),
  the SSRF guard and dial checks as for any call.
* **settle** (:func:`answer`): the answer read whole (bounded, as a metered one), so no byte of it
  reaches the caller before it was checked: every injected value is masked in its headers and its
  body (decoded first when compressed; an answer treg cannot decode is refused, 502
  ``hub_answer_unreadable``), cookies the publisher's upstream sets are dropped, its status line's reason
  phrase replaced by the standard one, and a ``Location``
  into the publisher's tool becomes ``/call/<ref>/…`` (elsewhere: ``/redirect/…``, with no
  credential). A 2xx settles the hold at the price, anything else releases it.
* **record** (treg/call/hub_views.py): the caller's row and the publisher's, one call id; the slot is
  given back once the answer finished streaming (or on any exit, treg/call/record.py).
"""

from __future__ import annotations

from dataclasses import replace
from urllib.parse import unquote, urlsplit

from treg import idempotency, money
from treg.call import answer_mask, cookies, evidence, headers as hdr, metered, redirects, reserve
from treg.call.record import finisher
from treg.call.resources import call_pin
from treg.call.state import CallOutcome, CallState
from treg.call.types import CallInput, ResolvedTarget
from treg.context import Services
from treg.errors import GatewayFailed
from treg.hub import store
from treg.hub.model import HubTool
from treg.identity import Identity
from treg.infra.upstream import UpstreamResponse
from treg.org_data import ToolRef, cached_org_tools, org_tools
from treg.origin import path_prefix
from treg.redaction import Redactor

#: headers of the publisher's answer a caller of another org never gets: the cookies of its account
_DROPPED = answer_mask.SESSION_HEADERS | {"content-length"}


async def published(svc: Services, inp: CallInput, name: str) -> tuple[HubTool, ToolRef] | None:
    """The published tool ``name`` is the ref of, with the publisher's tool; None: not a ref, not a
    top-level call, or its tool is gone (unpublished with it; the index not told yet)."""
    if inp.deferred is not None or inp.parent_call_id is not None:
        return None  # a routed call's child or a followed redirect: never a hub ref
    hub = await store.lookup(svc, name)
    if hub is None:
        return None
    tools = cached_org_tools(svc, hub.org_id) or await org_tools(svc, hub.org_id)
    tool = next((t for t in tools if t.id == hub.tool_id), None)
    return (hub, tool) if tool is not None else None


def target(ident: Identity, inp: CallInput, hub: HubTool, named: ResolvedTarget) -> ResolvedTarget:
    """The publisher's tool's named target as a hub call's."""
    extra: tuple[tuple[str, str], ...] = ()
    if inp.idempotency_key and hub.org_id != ident.org_id:  # (its own ref: its own account, its own label)
        extra = (("Idempotency-Key", idempotency.shared_key_digest(ident.org_id, inp.idempotency_key,
                                                                    call_pin(inp))),)
    return replace(named, credential_tier="hub", hub=hub, extra_headers=extra)


def secrets_org(ident: Identity, target: ResolvedTarget) -> str:
    """The org whose secrets the relay decrypts: the publisher's on a hub call, else the caller's."""
    return target.hub.org_id if target.hub is not None else ident.org_id


async def admit(svc: Services, state: CallState) -> CallOutcome | None:
    """Before the relay: the key claimed (a stored answer comes back as a replay), the slot taken, the
    hold placed. None: the call goes on to the relay."""
    ident, target, inp = state.ident, state.target, state.inp
    assert ident is not None and target is not None and target.hub is not None
    hub = target.hub
    charged = hub.price_micro > 0 and target.hub_for(ident.org_id) is not None  # its own ref: never charged
    if charged and inp.idempotency_key:
        body = await state.read_body(svc.settings.json_body_max_bytes) or b""  # the digest hashes it
        if await reserve.claim_key(svc, state, hub.ref, body):
            return reserve.replay_outcome(svc, state)
    await svc.hub.take(svc, inp.call_id, hub, ident.org_id)  # given back by the outcome's finish or the exit
    if charged:
        state.hold = await money.place_hold(svc, org_id=ident.org_id, member_id=ident.member_id, call_id=inp.call_id,
                                            amount_micro=hub.price_micro, tag=inp.tag, credit_org_id=hub.org_id)
    return None


def _values(state: CallState) -> tuple[str, ...]:
    """Every value of the publisher's a caller must not read: the injected ones, and a base URL's
    user-info (``user:password@``, sent as the tool's own credential)."""
    tool = state.target.tool if state.target is not None else None
    values = list(state.secret_values)
    if tool is not None:
        parts = urlsplit(tool.base_url)
        for v in (parts.password, parts.username):
            if v:
                values += [v, unquote(v)]
    return tuple(values)


async def answer(svc: Services, state: CallState, resp: UpstreamResponse) -> CallOutcome:
    """The settle stage of a hub call: the answer read whole, checked, settled, made streamable."""
    ident, target = state.ident, state.target
    assert ident is not None and target is not None and target.hub is not None
    hub = target.hub
    ok = 200 <= resp.status < 300
    data = await metered.buffer_answer(resp)
    relayed = hdr.response_headers(resp.headers, length=False)
    reason = resp.reason
    if target.hub_for(ident.org_id) is not None:  # another org's caller: nothing of the publisher's leaves
        relayed = [(k, v) for k, v in relayed if k.lower() not in _DROPPED]
        # the status line's reason phrase is the upstream's free text: another org's caller always gets
        # the status's standard phrase (not only when it held a value: its text is the publisher's)
        reason = ""
        values = _values(state)
        if values:
            redactor = Redactor.for_values(values) if values != state.secret_values else state.redactor
            seen = await answer_mask.checked(redactor, resp, data, relayed)
            if seen is None:
                raise GatewayFailed(answer_mask.unreadable("the publisher's credential"),
                                    code="hub_answer_unreadable", blame="upstream")
            data, relayed = seen.data, seen.headers
    if redirects.names_urls(resp.index):
        relayed = redirects.rewrite_locations(svc, ident, state.inp, target, relayed, state.masked)
    if "set-cookie" in resp.index:  # the publisher's own org calling its ref: kept, scoped to the ref
        relayed = cookies.scope_cookies(state.inp, path_prefix(svc.settings), relayed)
    # stored before the hold closes, as a metered answer is: a crash between leaves an open hold the
    # reaper releases, never a charge a retry would pay again
    await state.store_for_replay(svc, resp.status, relayed, data)
    await state.close_money(svc, settle_micro=hub.price_micro if ok else None)
    out = [*relayed, ("Content-Length", str(len(data))), *state.catalog_headers(state.cost_micro)]
    err_head = None if ok else (data[:evidence.RESPONSE_HEAD_MAX], len(data) > evidence.RESPONSE_HEAD_MAX)
    record_answer = finisher(svc, state, resp, err_head)

    def finish(sent: int, error: BaseException | None) -> None:
        try:
            record_answer(sent, error)
        finally:
            svc.hub.release(svc, state.inp.call_id)  # the answer finished streaming: the slot is free

    return CallOutcome.whole_answer(resp.status, out, data, finish, reason=reason, raw_headers=resp.raw_headers)
