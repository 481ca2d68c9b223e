"""The call use case, as its table of contents: one line per stage (``treg/call/__init__.py`` lists them,
with the table of which stage each catalog feature acts in).

Plain Python: the web edge hands in a :class:`CallInput` and gets back a :class:`CallOutcome` to
stream, or a :class:`TregError` (already audited). No database connection is held while the upstream
is being waited on: each stage opens and closes its own short transaction (most reads are cache hits),
and the audit row is queued, not written, on the hot path.

Money (catalog calls on the platform tier): the hold is placed before any upstream I/O and closed
exactly once after: settled at the observed price when the answer is 2xx, released otherwise, on a
treg-side failure, and on cancellation.
"""

from __future__ import annotations

from treg.call import (archive, call_caps, capacity_stage, demo, hub_stage, intake, jobs, overflow_stage, record,
                       reserve, resolve, resources, routed, settle, table)
from treg.call.authorize import authorize
from treg.call.relay import prepare, send
from treg.call.state import CallOutcome, CallState
from treg.call.types import CallInput, PendingBody
from treg.context import Services

__all__ = ["CallOutcome", "CallState", "execute"]


async def execute(svc: Services, inp: CallInput) -> CallOutcome:
    state = CallState(inp)
    ident = await intake.identify(svc, state)  # 1 intake: who calls (unknown: a 401, not recorded)
    try:
        intake.check_scope(state)  # ... a scoped token only where its scope reaches (a table token: GET /table/)
        table.intake(state)  # ... /table/: its format and Accept are treg's, never the vendor's
        if isinstance(state.inp.body, PendingBody):  # ... then the body the edge left pending (or its refusal)
            await intake.load_body(state)
        intake.check_tag(state)  # ... and an X-Treg-Tag every limit and the audit row can hold
        state.target = target = await resolve.resolve_target(svc, ident, state)  # 2 resolve: tool or catalog endpoint
        if target.routed is not None:  # treg.<capability>: its children run through execute
            return await routed.run(svc, state, execute)
        state.inp = await authorize(svc, ident, state.inp, target)  # 3 authorize: ACL, deny rules
        if ident.calls_per_day is not None:  # ... then the member's call cap (every call that passes counts)
            await call_caps.count(svc, state)
        if ident.is_demo:  # ... then a public demo call's gate: its endpoints, its hour per address
            await demo.gate(svc, state)
        if target.catalog is not None:  # the catalog's features (an own tool's call has none of them)
            await resources.check_owned(svc, state)  # ... and, on treg's key, the object's owner
            await jobs.guard(svc, state)  # ... a platform-tier poll/fetch reads only the org's own async jobs
            # ... and a locked platform key refuses before any hold (unless an aggregator may serve the call)
            await capacity_stage.check_lock(svc, state, overflow_stage.may_overflow)
            if target.billed and (replay := await reserve.reserve(svc, state)) is not None:  # 4 reserve: claim, hold
                return await answer(svc, state, replay) if state.reshaped else replay
            if (stored := await archive.lookup(svc, state)) is not None:  # ... or the archive's answer, no vendor
                return await answer(svc, state, stored) if state.reshaped else stored
        elif target.hub is not None:  # another org's published tool: its slot, the caller's hold (or a replay)
            if (replay := await hub_stage.admit(svc, state)) is not None:
                return replay
        # 5 relay: the exact request (a hub call's with its publisher's credentials),
        state.prepared = await prepare(svc, hub_stage.secrets_org(ident, target), state.inp, target)
        if target.credential_tier == "platform":  # ... on treg's own key spaced, a burst 429 re-sent once
            state.resp = await capacity_stage.send(svc, state)
        else:
            state.resp = await send(svc, state)  # ... vetted and sent
        outcome = await settle.settle(svc, state)  # 6 settle; 7 record: the outcome's finish() queues the row
        return await answer(svc, state, outcome) if state.reshaped else outcome  # ... /table/, a demo's mark
    except BaseException as exc:  # identified: recorded once, cancelled or not
        await record.exit_call(svc, state, exc)
        raise


async def answer(svc: Services, state: CallState, outcome: CallOutcome) -> CallOutcome:
    """The call's answer as its surface gives it: ``/table/`` made into a table (treg/call/table.py), and a
    public demo call's marked ``X-Treg-Demo: 1`` (treg/call/demo.py); any other call's as it is."""
    return demo.mark(state, await table.finish(svc, state, outcome))
