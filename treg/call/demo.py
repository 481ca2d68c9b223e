"""The public demo gate's parts in the call pipeline (docs/sharing.md "The public demo"; the demo itself,
its limits' state in PostgreSQL: treg/public_demo.py). A call made with a ``demo``-scoped token:

* resolve (:func:`screen`, :func:`credentials`): only an endpoint listed in ``TREG_DEMO_ENDPOINTS``, by its
  exact id (never an org tool, a passthrough URL or a routed ``treg.<capability>``), GET only, else 403
  ``demo_not_allowed`` before its ladder is looked at; the ladder skips ``own`` and ``team``: the demo
  spends only the operator's key (``platform``) or none (``anonymous``), never the org's credentials, and an
  endpoint neither offers is ``demo_not_allowed`` too;
* authorize (:func:`gate`, called by ``service.execute`` after ``authorize`` and the member's call cap,
  ``call_caps.count``), after the tool ACL, the deny rules and the member cap, in the seed's order: the
  same checks again on the resolved target (its tier among them), then the client address's sliding hour
  (429 ``demo_rate_limited`` with ``retry_after_s``);
* reserve (:func:`hold_cap`): the hold carries the demo's daily budget (429 ``demo_budget_spent``);
* the exit (:func:`give_back`): a call refused before any vendor contact does not count for its hour;
* every answer (:func:`mark`), refusals too, carries ``X-Treg-Demo: 1``; the audit row says ``demo: true``.
"""

from __future__ import annotations

from typing import Any

from treg import forwarded, public_demo
from treg.authentication import DEMO_HEADER, demo_refusal
from treg.call.state import CallOutcome, CallState
from treg.call.types import CallInput
from treg.catalog.tiers import OrgCredentials
from treg.context import Services
from treg.errors import SsrfRefused, TregError
from treg.identity import Identity

#: the tiers a demo call may run on: treg's key, or none
TIERS = ("platform", "anonymous")


def _allowed(svc: Services, endpoint_id: str | None, method: str) -> None:
    if endpoint_id is None or endpoint_id not in svc.settings.demo_endpoints:
        raise demo_refusal(f"the public demo does not offer {endpoint_id or 'this target'}: it calls only the "
                           "endpoints its operator lists (TREG_DEMO_ENDPOINTS), by their exact id",
                           offered=list(svc.settings.demo_endpoints))
    if method != "GET":
        raise demo_refusal(f"the public demo only reads: {method} is not allowed (GET only)")


def screen(svc: Services, inp: CallInput) -> None:
    """Resolve's half: the target must be a listed endpoint id, read with GET (nothing is looked up)."""
    _allowed(svc, inp.rest, inp.method)


def credentials(ident: Identity) -> OrgCredentials:
    """What the ladder sees of the org for a demo call: nothing (no own tool, no team secret or
    connection), so it offers ``anonymous`` or ``platform`` only."""
    return OrgCredentials(org_id=ident.org_id)


def not_offered(endpoint_id: str) -> TregError:
    """The ladder found no tier a demo call may use (no anonymous row, no platform key)."""
    return demo_refusal(f"the public demo cannot call {endpoint_id}: it runs only on treg's own key (platform) "
                        "or keyless (anonymous), and this endpoint offers neither here")


def routed(endpoint_id: str) -> TregError:
    return demo_refusal(f"{endpoint_id} is a routed capability; the public demo calls endpoints directly: list "
                        "the endpoint it should call in TREG_DEMO_ENDPOINTS")


async def gate(svc: Services, state: CallState) -> None:
    """Authorize's half, its last gate (``service.execute``, after the member's call cap): what may be
    called (again, on the resolved target and its tier), then the client address's hour (counted here, in
    PostgreSQL; given back if a later gate refuses). Any other call: nothing."""
    ident, inp, target = state.ident, state.inp, state.target
    if ident is None or not ident.is_demo or target is None:
        return
    _allowed(svc, target.endpoint_id, inp.method)
    if target.catalog is None or target.credential_tier not in TIERS:
        raise not_offered(target.endpoint_id or inp.rest)
    trusted = forwarded.trusted_networks(svc.settings.trusted_proxies)
    client = forwarded.demo_client(inp.peer, inp.headers, trusted)
    await public_demo.admit(svc, org_id=ident.org_id, client=client, call_id=inp.call_id)


def hold_cap(ident: Identity | None, svc: Services) -> dict[str, Any]:
    """``money.place_hold``'s keywords for the caller: a demo call's hold carries the demo's daily budget."""
    if ident is None or not ident.is_demo:
        return {}
    return {"extra_cap_micro": max(0, int(svc.settings.demo_daily_budget_micro)),
            "extra_refusal": public_demo.budget_refusal}


async def give_back(svc: Services, state: CallState, exc: BaseException) -> None:
    """The exit's part: a demo call treg refused before contacting the vendor leaves its hour as it was
    (refused calls do not count). A call whose request was sent (or may have been) still counts."""
    if state.ident is None or not state.ident.is_demo or not isinstance(exc, TregError):
        return
    if state.resp is None and (state.prepared is None or isinstance(exc, SsrfRefused)):
        await public_demo.give_back(svc, state.inp.call_id)


def mark(state: CallState, outcome: CallOutcome) -> CallOutcome:
    """``X-Treg-Demo: 1`` on a demo call's answer (its refusals get it from the exit and the gates)."""
    if state.ident is not None and state.ident.is_demo:
        outcome.headers.append(DEMO_HEADER)
    return outcome


def refusal_headers(state: CallState) -> dict[str, str]:
    """What the exit adds to a demo call's refusal."""
    return dict([DEMO_HEADER]) if state.ident is not None and state.ident.is_demo else {}
