"""Holds: a billed call reserves its estimate before any upstream I/O and closes it exactly once after.

``place_hold`` runs one short transaction under the org's account lock: the limits are checked
(treg.money.limits) and the hold, the day's spend rows, the tag's row and the account's ``held``
total are written together, so two concurrent calls can never both spend the last credit.

``settle`` and ``release`` close a hold with a conditional ``UPDATE … WHERE state = 'held'``: the first
close wins, any later one (a retry, the reaper, a cancellation path) is a no-op returning False.

Settlement is capped at the estimate: a hold is the most a call can cost. ``Hold.charge_for(observed)``
is what ``settle`` will charge (``min(observed, estimate)``), for ``X-Treg-Cost-Micro``.

Lock order (no deadlocks): every writer takes the org's ``org_balances`` row lock first, then touches
that org's holds, day rows and tag rows.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, insert, literal, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from treg.context import Services
from treg.errors import Conflict, IntegrityError
from treg.infra.db import Tx
from treg.infra.schema import holds, money_daily, org_balances, tag_budgets
from treg.money.ledger import add_daily_held, check_amount, in_scopes, lock_account, scopes_of
from treg.money.limits import check_hold, check_tag

HELD, SETTLED, RELEASED = "held", "settled", "released"


@dataclass(frozen=True)
class Hold:
    call_id: str
    org_id: str
    member_id: str | None
    tag: str | None
    amount_micro: int
    day: datetime.date
    expires_at: datetime.datetime

    def charge_for(self, observed_micro: int) -> int:
        """What ``settle(observed_micro)`` charges: the observed price, never more than the estimate."""
        return max(0, min(int(observed_micro), self.amount_micro))


async def place_hold(svc: Services, *, org_id: str, member_id: str | None, call_id: str, amount_micro: int,
                     tag: str | None = None) -> Hold | None:
    """Reserve ``amount_micro`` for call ``call_id``; None when the amount is 0 (nothing to hold).

    Raises PaymentRequired (402) naming the limit that refused it, NotFound for an unknown org,
    Conflict if the call id already has a hold.
    """
    amount = check_amount(amount_micro)
    if tag is not None:
        tag = check_tag(tag)
    if amount == 0:
        return None
    try:
        async with svc.db.tx() as tx:
            account = await lock_account(tx, svc, org_id)
            await check_hold(tx, account, member_id=member_id, tag=tag, amount=amount)
            day = account["today"]
            row = await tx.fetch_one(insert(holds).values(
                id=call_id, org_id=org_id, member_id=member_id, tag=tag, day=day, amount_micro=amount,
                state=HELD, expires_at=func.now() + text(f"interval '{int(svc.settings.hold_ttl_s)} seconds'"))
                .returning(holds.c.expires_at))
            assert row is not None
            await tx.execute(add_daily_held(org_id, day, scopes_of(member_id), amount))
            if tag is not None:
                tstmt = pg_insert(tag_budgets).values(org_id=org_id, tag=tag, held_micro=amount)
                await tx.execute(tstmt.on_conflict_do_update(
                    index_elements=[tag_budgets.c.org_id, tag_budgets.c.tag],
                    set_={"held_micro": tag_budgets.c.held_micro + tstmt.excluded.held_micro}))
            await tx.execute(update(org_balances).where(org_balances.c.org_id == org_id)
                             .values(held_micro=org_balances.c.held_micro + amount, updated_at=func.now()))
    except IntegrityError as exc:
        if exc.constraint == "pk_holds":
            raise Conflict(f"call {call_id} already has a hold", code="hold_exists") from exc
        raise
    return Hold(call_id=call_id, org_id=org_id, member_id=member_id, tag=tag, amount_micro=amount, day=day,
                expires_at=row["expires_at"])


async def _close(tx: Tx, call_id: str, state: str, observed: int) -> dict[str, Any] | None:
    """Close one open hold inside ``tx`` (taking the org lock first); None if it was not open."""
    org_id = await tx.scalar(select(holds.c.org_id).where(holds.c.id == call_id))
    if org_id is None:
        return None
    await tx.execute(select(org_balances.c.org_id).where(org_balances.c.org_id == org_id).with_for_update())
    closed = await tx.fetch_one(
        update(holds).where(and_(holds.c.id == call_id, holds.c.state == HELD))
        .values(state=state, settled_micro=func.least(literal(observed), holds.c.amount_micro), closed_at=func.now())
        .returning(holds.c.org_id, holds.c.member_id, holds.c.tag, holds.c.day, holds.c.amount_micro,
                   holds.c.settled_micro))
    if closed is None:
        return None
    amount, charged = closed["amount_micro"], closed["settled_micro"]
    await tx.execute(update(org_balances).where(org_balances.c.org_id == org_id).values(
        held_micro=org_balances.c.held_micro - amount, settled_micro=org_balances.c.settled_micro + charged,
        updated_at=func.now()))
    await tx.execute(update(money_daily).where(and_(
        money_daily.c.org_id == org_id, money_daily.c.day == closed["day"], in_scopes(scopes_of(closed["member_id"]))))
        .values(held_micro=money_daily.c.held_micro - amount, spent_micro=money_daily.c.spent_micro + charged))
    if closed["tag"] is not None:
        await tx.execute(update(tag_budgets).where(and_(tag_budgets.c.org_id == org_id,
                                                        tag_budgets.c.tag == closed["tag"]))
                         .values(held_micro=tag_budgets.c.held_micro - amount,
                                 spent_micro=tag_budgets.c.spent_micro + charged))
    return closed


async def settle(svc: Services, call_id: str, amount_micro: int) -> bool:
    """Charge the call (capped at its hold) and close the hold; False if it was already closed or absent."""
    observed = check_amount(amount_micro)
    async with svc.db.tx() as tx:
        return await _close(tx, call_id, SETTLED, observed) is not None


async def release(svc: Services, call_id: str) -> bool:
    """Close the hold charging nothing; False if it was already closed or absent (safe to call twice)."""
    async with svc.db.tx() as tx:
        return await _close(tx, call_id, RELEASED, 0) is not None


async def get_hold(svc: Services, call_id: str) -> dict[str, Any] | None:
    """The hold of a call as stored (state, amount_micro, settled_micro, …), or None."""
    async with svc.db.tx() as tx:
        return await tx.fetch_one(select(holds).where(holds.c.id == call_id))


async def hold_state(svc: Services, call_id: str) -> str | None:
    """``held``, ``settled`` or ``released`` (the call detail's ``hold_state``); None: no hold."""
    async with svc.db.tx() as tx:
        return await tx.scalar(select(holds.c.state).where(holds.c.id == call_id))
