"""The member's call cap on the call path (treg/member_limits.py holds the rule and its statements).

* :func:`count` (authorize stage, after the ACL and the deny rules, before any hold): a member with a
  cap has this call counted against today's, or is refused 429 ``member_call_cap``; a member without one
  costs nothing (the cap travels with the cached identity: no query). Every call that gets here counts,
  whatever its tier, billed or not, an own tool's too, whatever surface it came in by. A routed
  ``treg.<capability>`` counts once, as itself: its children are parts of it, not calls of their own.
* :func:`give_back` (the one exit, treg/call/record.py): a call refused after it was counted (a later
  gate, a 402, an idempotency conflict, anything said no before the upstream answered) hands its count
  back: refused calls do not count.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from treg import member_limits
from treg.context import Services
from treg.errors import TregError

if TYPE_CHECKING:
    from treg.call.state import CallState

log = logging.getLogger(__name__)


async def count(svc: Services, state: "CallState") -> None:
    ident = state.ident
    if ident is None or ident.calls_per_day is None:
        return  # no cap: no query
    if state.inp.deferred is not None:
        return  # a routed call's child: the routed call counted itself
    state.call_counted = await member_limits.count_call(svc, org_id=ident.org_id, member_id=ident.member_id,
                                                        cap=ident.calls_per_day)


def _refused(state: "CallState", exc: BaseException) -> bool:
    """The call was refused by treg before any upstream answered it (what the audit row calls refused)."""
    if not isinstance(exc, TregError) or state.resp is not None:
        return False
    return exc.is_refusal


async def give_back(svc: Services, state: "CallState", exc: BaseException) -> None:
    counted = state.call_counted
    if counted is None or not _refused(state, exc):
        return
    state.call_counted = None
    try:
        await asyncio.shield(member_limits.give_back(svc, counted))
    except Exception:  # noqa: BLE001 - a lost give-back costs the member one call of the day, never a 500
        log.warning("call %s: its count against the member's call cap could not be given back",
                    state.inp.call_id, exc_info=True)
