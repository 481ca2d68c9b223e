"""Holds: a billed call reserves its estimate before any upstream I/O and closes it exactly once after.

**One statement to place a hold, one to close any number of them** (docs/money.md). Both are SQL
functions installed by migration 0015 (``treg_place_hold``, ``treg_close_holds``); treg sends each as
SQL text fixed at import, with bound parameters: one database round trip, no statement built,
compiled or keyed per call (a speed trick: docs/performance.md, round 7). The org's ``org_balances``
row lock, which serialises its money writes, is held for that one statement, never across a round
trip to Python, so one org's calls do not queue behind each other's Python.

``place_hold`` checks the limits (balance, daily cap, an extra day cap the caller may add, tag budget,
member cap: treg.money.limits) and writes the hold with the day's, the tag's and the account's
``held`` totals, so two concurrent calls can never both spend the last credit.

``close`` closes holds with the conditional ``UPDATE … WHERE state = 'held'`` inside the function: the
first close wins, any later one (a retry, the reaper, a cancellation path) changes nothing. A hold
with a ``credit_org_id`` (a hub tool's publisher) credits that org with what was charged in the same
statement.

Settlement is capped at the estimate: a hold is the most a call can cost. ``Hold.charge_for(observed)``
is what a settle will charge (``min(observed, estimate)``), for ``X-Treg-Cost-Micro``.

Lock order (no deadlocks): every writer takes the org's ``org_balances`` row lock first (a close of
several holds takes all their orgs' locks first, in org id order), then touches that org's holds, day
rows and tag rows.
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Iterable, Sequence

from sqlalchemy import select

from treg.cache import CHANNEL
from treg.context import Services
from treg.errors import Conflict, DataRefused, IntegrityError, NotFound, TregError
from treg.hold import HELD, RELEASED, SETTLED, Close, Closed, Hold  # noqa: F401 (HELD: the money API's)
from treg.ids import PLAIN_ID, new_id
from treg.infra.db import Database, Tx
from treg.infra.schema import BIGINT_MAX, holds
from treg.money.ledger import check_amount
from treg.money.limits import check_tag, hold_refusal

#: the statements of the hot money path, as text with bound parameters (built once, at import)
PLACE_SQL = ("SELECT refused, needed_micro, available_micro, limit_micro, hold_expires_at, hold_day "
             "FROM treg_place_hold(%(call)s, %(org)s, %(member)s, %(tag)s, %(amount)s, %(ttl)s, %(trial)s, "
             "%(trial_id)s, %(extra_cap)s, %(credit_org)s, %(headroom)s, %(lease)s)")
CLOSE_SQL = ("SELECT closed_id, closed_org, closed_state, closed_amount, closed_charged "
             "FROM treg_close_holds(%(calls)s::text[], %(states)s::text[], %(observed)s::bigint[])")
#: an org's credit leases open now (the open-holds partial index): read only after a limit refused a hold
PARKED_SQL = "SELECT EXISTS (SELECT 1 FROM holds WHERE org_id = %(org)s AND state = 'held' AND lease)"
NOTIFY_SQL = "SELECT pg_notify(%(channel)s, %(payload)s)"
#: the change listener's payload kind asking every process for an org's leases back (treg/call/runtime.py)
LEASES_WANTED = "leases"
#: seconds between the tries after the leases were asked back: a lease comes back once the settler of its
#: process wrote its calls' closes and its return (a statement or two); at most ~0.5 s on a 402's path
LEASE_RETURN_WAITS_S = (0.05, 0.15, 0.3)
#: closes of holds taken from credit leases (treg/money/leases.py): each call's row written closed, its
#: amount moved out of its lease, one statement for any number (migration 0020)
CLOSE_LEASED_SQL = ("SELECT closed_id, closed_org, closed_state, closed_amount, closed_charged "
                    "FROM treg_close_leased(%(leases)s::text[], %(calls)s::text[], %(states)s::text[], "
                    "%(amounts)s::bigint[], %(observed)s::bigint[])")


async def place_hold(svc: Services, *, org_id: str, member_id: str | None, call_id: str, amount_micro: int,
                     tag: str | None = None, extra_cap_micro: int | None = None,
                     extra_refusal: Callable[[int, int], TregError] | None = None,
                     credit_org_id: str | None = None, leasable: bool = False) -> Hold | None:
    """Reserve ``amount_micro`` for call ``call_id``; None when the amount is 0 (nothing to hold).

    ``extra_cap_micro``: one more cap on the org's spend of the day (held and settled), refused with
    ``extra_refusal(needed, available)`` (the public demo's daily budget). ``credit_org_id``: the org
    the charge is credited to when the hold settles (a hub tool's publisher). ``leasable``: the hold is
    closed in this process (not handed to an async job), so it may be taken from a credit lease
    (``Services.settler``, treg/money/leases.py) without a round trip; when no lease serves it, it is
    placed by its own statement as any other.

    Raises PaymentRequired (402) naming the limit that refused it, NotFound for an unknown org,
    Conflict if the call id already has a hold.
    """
    amount = check_amount(amount_micro)
    if tag is not None:
        tag = check_tag(tag)
    if amount == 0:
        return None
    if leasable and extra_cap_micro is None and credit_org_id is None:
        leased = await svc.settler.take_leased(svc, org_id=org_id, member_id=member_id, tag=tag, call_id=call_id,
                                               amount_micro=amount)
        if leased is not None:
            return leased
    placed = await _place(svc, call_id, org_id, member_id, tag, amount, extra_cap_micro, credit_org_id)
    if placed[0] not in (None, "extra_cap") and await _ask_leases_back(svc, org_id):
        # a limit refused it while some of the org's credit is parked in credit leases: each process
        # returns them (its calls on them keep what they hold), and the hold is tried again
        for wait_s in LEASE_RETURN_WAITS_S:
            await asyncio.sleep(wait_s)
            placed = await _place(svc, call_id, org_id, member_id, tag, amount, extra_cap_micro, credit_org_id)
            if placed[0] is None or not await _leases_parked(svc, org_id):
                break
    refused, needed, available, limit, expires_at, day = placed
    if refused == "extra_cap":
        assert extra_refusal is not None
        raise extra_refusal(needed, available)
    if refused is not None:
        raise hold_refusal(refused, needed, available, limit, tag=tag, member_id=member_id)
    return Hold(call_id=call_id, org_id=org_id, member_id=member_id, tag=tag, amount_micro=amount, day=day,
                expires_at=expires_at)


async def _leases_parked(svc: Services, org_id: str) -> bool:
    (row,) = await svc.db.run(PARKED_SQL, {"org": org_id}, path="money")
    return bool(row[0])


async def _ask_leases_back(svc: Services, org_id: str) -> bool:
    """Are credit leases of ``org_id`` open (in any process)? Then this process returns its own, and a
    NOTIFY asks the others (each returns a lease once its open calls are closed)."""
    if not await _leases_parked(svc, org_id):
        return False
    svc.settler.return_leases(org_id)
    await svc.db.run(NOTIFY_SQL, {"channel": CHANNEL, "payload": f"{LEASES_WANTED}:{org_id}"}, path="money")
    return True


async def place_lease(svc: Services, *, lease_id: str, org_id: str, member_id: str | None, tag: str | None,
                      amount_micro: int, headroom_micro: int) -> Hold | None:
    """Place a credit lease of ``amount_micro`` (treg/money/leases.py) when every limit leaves
    ``headroom_micro`` beside it; None when one does not (the calls then place their own holds, and
    meet the limit's own refusal)."""
    refused, _, _, _, expires_at, day = await _place(svc, lease_id, org_id, member_id, tag, amount_micro, None, None,
                                                     headroom=headroom_micro, lease=True)
    if refused is not None:
        return None
    return Hold(call_id=lease_id, org_id=org_id, member_id=member_id, tag=tag, amount_micro=amount_micro, day=day,
                expires_at=expires_at)


async def _place(svc: Services, call_id: str, org_id: str, member_id: str | None, tag: str | None, amount: int,
                 extra_cap_micro: int | None, credit_org_id: str | None, *, headroom: int = 0,
                 lease: bool = False) -> tuple[Any, ...]:
    trial = max(0, int(svc.settings.trial_micro))
    params = {"call": call_id, "org": org_id, "member": member_id, "tag": tag, "amount": amount,
              "ttl": float(svc.settings.hold_ttl_s), "trial": trial, "trial_id": new_id("crd") if trial else None,
              "extra_cap": extra_cap_micro, "credit_org": credit_org_id, "headroom": headroom, "lease": lease}
    statement = asyncio.ensure_future(svc.db.run(PLACE_SQL, params, path="money"))
    try:
        (row,) = await asyncio.shield(statement)
        return tuple(row)
    except asyncio.CancelledError:
        # the caller went away while the statement ran: the hold it may have placed is nobody's now, so
        # it is released as soon as the statement answers, not left to the reaper (its TTL parks the credit)
        statement.add_done_callback(lambda done: _release_if_placed(svc, done, call_id))
        raise
    except IntegrityError as exc:
        if exc.constraint == "pk_holds":
            raise Conflict(f"call {call_id} already has a hold", code="hold_exists") from exc
        if exc.constraint and exc.constraint.startswith("fk_org_balances_org_id"):
            raise NotFound("no such org", code="org_not_found") from exc
        raise


def _release_if_placed(svc: Services, statement: "asyncio.Future[Any]", call_id: str) -> None:
    if statement.cancelled() or statement.exception() is not None:
        return  # nothing placed (or nothing known: the reaper's, as before)
    (row,) = statement.result()
    if row[0] is None:
        svc.settler.release_orphan(call_id)


def checked_close(c: Close) -> Close:
    """``c`` when it is a close the statement can write (settled with a non-negative int amount, or
    released); a programming error raises here, in the caller, not in a batch of other calls' closes."""
    if c.state not in (SETTLED, RELEASED):
        raise ValueError(f"a hold closes settled or released, not {c.state!r}")
    if c.state == SETTLED:
        check_amount(c.observed_micro, "observed_micro")
    return c


#: an observed price is a vendor's usage figure times its rate, so it can be any size. The statement
#: settles ``least(observed, amount)``, the hold's amount at most, so one beyond bigint is cut to its
#: bound here: sent as it is, it failed the cast, and with it the batch of every other call's close
#: beside it (left to the reaper: released, uncharged)
OBSERVED_MAX = BIGINT_MAX


def _close_params(closes: Sequence[Close]) -> dict[str, Any]:
    for c in closes:
        assert c.state in (SETTLED, RELEASED), c.state
    return {"calls": [c.call_id for c in closes], "states": [c.state for c in closes],
            "observed": [min(check_amount(c.observed_micro), OBSERVED_MAX) if c.state == SETTLED else 0
                         for c in closes]}


def _array_literals(params: dict[str, list[Any]]) -> dict[str, Any]:
    """``params`` with each array bound as one text value, PostgreSQL's array literal (``{"a","b"}``,
    ``{1,2}``), which the statement casts; or as they were when an id is not one of treg's own.

    Speed trick, named: **a batch of closes' arrays as one literal each**. Bound as Python lists, psycopg2
    adapted every element on its own (an adapter, a failed look for ``__conform__`` that formats and clears
    an AttributeError, a quoting call): ~2.9 µs a close, in the settler's batches (docs/performance.md,
    round 14). The statement's text stays the one built at import, its values bound. Ids of ``[A-Za-z0-9_]``
    (treg's ``new_id``) are written double-quoted (so ``NULL`` stays an id) and need no escape; states come
    from a fixed set and amounts are ``int``s."""
    out: dict[str, Any] = {}
    for name, values in params.items():
        if not values:
            out[name] = "{}"
        elif isinstance(values[0], int):
            out[name] = "{" + ",".join(map(str, map(int, values))) + "}"
        elif all(map(PLAIN_ID.fullmatch, values)):  # each on its own: "a,b" is one id, and not plain
            out[name] = '{"' + '","'.join(values) + '"}'
        else:
            return params
    return out


def _closed(rows: Iterable[Sequence[Any]]) -> list[Closed]:
    return [Closed(*row) for row in rows]


async def close_on(db: Database, closes: Sequence[Close]) -> list[Closed]:
    """Close holds in one statement (one round trip); what comes back is what this call closed."""
    if not closes:
        return []
    return _closed(await db.run(CLOSE_SQL, _array_literals(_close_params(closes)), path="money"))


async def close_leased_on(db: Database, closes: Sequence[Close]) -> list[Closed]:
    """Close holds taken from credit leases (each ``Close`` names its lease and amount) in one
    statement: each call's row is written closed and its amount moved out of its lease; what comes back
    is what this call closed (a call closed before is not among it)."""
    if not closes:
        return []
    params = _close_params(closes)
    params["leases"] = [c.lease_id for c in closes]
    params["amounts"] = [check_amount(c.amount_micro, "amount_micro") for c in closes]
    return _closed(await db.run(CLOSE_LEASED_SQL, _array_literals(params), path="money"))


#: what the database refuses for what a statement carries: sent again it is refused again
REFUSED = (DataRefused, IntegrityError)


async def by_halves(write: Callable[[list[Close]], Awaitable[list[Closed]]], closes: list[Close],
                    refused: Callable[[Close, TregError], None]) -> list[Closed]:
    """``write(closes)``, and when the database refuses it for what it carries (:data:`REFUSED`), each half
    written the same way, until a refused close is alone: it goes to ``refused`` and the closes beside it
    are written (the settler's batches, the reaper's). Any other failure is ``write``'s to raise."""
    try:
        return await write(closes)
    except REFUSED as exc:
        if len(closes) == 1:
            refused(closes[0], exc)
            return []
        half = len(closes) // 2  # in order: a lease's return stays after its calls' closes
        return await by_halves(write, closes[:half], refused) + await by_halves(write, closes[half:], refused)


async def close(svc: Services, closes: Sequence[Close]) -> list[Closed]:
    """:func:`close_on` the services' database."""
    return await close_on(svc.db, closes)


async def close_in(tx: Tx, closes: Sequence[Close]) -> list[Closed]:
    """:func:`close` inside a transaction of the caller's (an async job's hold closed with its job row)."""
    if not closes:
        return []
    rows = await tx.fetch_all(CLOSE_SQL, _close_params(closes))
    return [Closed(r["closed_id"], r["closed_org"], r["closed_state"], r["closed_amount"], r["closed_charged"])
            for r in rows]


async def settle(svc: Services, call_id: str, amount_micro: int) -> bool:
    """Charge the call (capped at its hold) and close the hold; False if it was already closed or absent."""
    return bool(await close(svc, [Close(call_id, SETTLED, check_amount(amount_micro))]))


async def release(svc: Services, call_id: str) -> bool:
    """Close the hold charging nothing; False if it was already closed or absent (safe to call twice)."""
    return bool(await close(svc, [Close(call_id, RELEASED)]))


async def get_hold(svc: Services, call_id: str) -> dict[str, Any] | None:
    """The hold of a call as stored (state, amount_micro, settled_micro, …), or None."""
    async with svc.db.tx() as tx:
        return await tx.fetch_one(select(holds).where(holds.c.id == call_id))


async def hold_state(svc: Services, call_id: str) -> str | None:
    """``held``, ``settled`` or ``released`` (the call detail's ``hold_state``); None: no hold."""
    async with svc.db.tx() as tx:
        return await tx.scalar(select(holds.c.state).where(holds.c.id == call_id))
