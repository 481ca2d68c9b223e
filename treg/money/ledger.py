"""The org's account: credits granted by the operator (audited), the trial allowance, the balance.

Every amount is an integer number of micro-USD (1 USD = 1 000 000). One ``org_balances`` row per org
carries the running totals (granted, settled, held) and is updated in the same transaction as every
grant, hold, settlement and release; its row lock (``SELECT … FOR UPDATE``) serialises all money
writes of one org. Derived: ``balance = granted − settled``, ``available = balance − held``.

The trial allowance (``TREG_TRIAL_MICRO``) is granted once per org, as a ledger row of kind ``trial``,
when the account row is first created (the first time anything touches the org's money). Settled
charges consume the trial part of ``granted`` first: ``trial_remaining = max(0, trial − settled)``.
"""

from __future__ import annotations

import datetime
import decimal
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Date, and_, cast, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from treg.context import Services
from treg.errors import BadRequest, IntegrityError, NotFound
from treg.ids import new_id
from treg.infra.db import Tx
from treg.infra.schema import credit_grants, money_daily, org_balances, orgs

MICRO_PER_USD = 1_000_000
#: scope of the org-wide row in ``money_daily`` (other rows are member ids)
ORG_SCOPE = "*"


#: the largest single grant accepted (a typo guard: 1 000 000 USD)
MAX_GRANT_MICRO = 1_000_000 * MICRO_PER_USD

#: the current UTC day, computed by the database so every process agrees on it
TODAY = cast(func.timezone("UTC", func.now()), Date)


@dataclass(frozen=True)
class Balance:
    org_id: str
    granted_micro: int
    settled_micro: int
    held_micro: int
    trial_micro: int
    daily_cap_micro: int | None
    spent_today_micro: int
    held_today_micro: int
    day: datetime.date

    @property
    def balance_micro(self) -> int:
        return self.granted_micro - self.settled_micro

    @property
    def available_micro(self) -> int:
        return self.balance_micro - self.held_micro

    @property
    def trial_remaining_micro(self) -> int:
        return max(0, self.trial_micro - self.settled_micro)

    def as_dict(self) -> dict[str, Any]:
        return {
            "balance_micro": self.balance_micro,
            "held_micro": self.held_micro,
            "available_micro": self.available_micro,
            "granted_micro": self.granted_micro,
            "settled_micro": self.settled_micro,
            "trial_micro": self.trial_micro,
            "trial_remaining_micro": self.trial_remaining_micro,
            "daily_cap_micro": self.daily_cap_micro,
            "spent_today_micro": self.spent_today_micro,
            "held_today_micro": self.held_today_micro,
            "day": self.day.isoformat(),
        }


def check_amount(value: Any, name: str = "amount_micro") -> int:
    """A non-negative integer micro-USD amount from the pipeline (a programming error otherwise)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int of micro-USD, got {value!r}")
    return value


def usd_to_micro(text: str) -> int:
    """``"12.5"`` → 12 500 000; at most 6 decimals (a micro-dollar is the smallest unit)."""
    try:
        value = decimal.Decimal(str(text).strip())
    except decimal.InvalidOperation as exc:
        raise BadRequest(f"{text!r} is not a dollar amount such as 12.50", code="invalid_amount") from exc
    micro = value * MICRO_PER_USD
    if not value.is_finite() or micro != micro.to_integral_value():
        raise BadRequest(f"{text!r}: dollar amounts have at most 6 decimals", code="invalid_amount")
    return int(micro)


async def ensure_account(tx: Tx, org_id: str, trial_micro: int) -> bool:
    """Create the org's account row (and its one trial grant) if it does not exist yet; True if created."""
    trial = max(0, int(trial_micro))
    try:
        created = await tx.fetch_one(
            pg_insert(org_balances).values(org_id=org_id, granted_micro=trial, trial_micro=trial)
            .on_conflict_do_nothing(index_elements=[org_balances.c.org_id]).returning(org_balances.c.org_id))
    except IntegrityError as exc:  # the foreign key: no such org
        raise NotFound("no such org", code="org_not_found") from exc
    if created is not None and trial > 0:
        await tx.execute(insert(credit_grants).values(
            id=new_id("crd"), org_id=org_id, kind="trial", amount_micro=trial, actor="treg",
            note="trial allowance (TREG_TRIAL_MICRO)"))
    return created is not None


async def lock_account(tx: Tx, svc: Services, org_id: str, *, lock: bool = True) -> dict[str, Any]:
    """The org's account row (created if new) with ``today`` (the UTC day, from SQL); ``lock``: held
    ``FOR UPDATE`` until the transaction ends, which serialises the org's money writes."""
    stmt = select(org_balances, TODAY.label("today")).where(org_balances.c.org_id == org_id)
    if lock:
        stmt = stmt.with_for_update(of=org_balances)
    row = await tx.fetch_one(stmt)
    if row is None:
        await ensure_account(tx, org_id, svc.settings.trial_micro)
        row = await tx.fetch_one(stmt)
    assert row is not None
    return row


async def _today_usage(tx: Tx, org_id: str, day: datetime.date) -> tuple[int, int]:
    row = await tx.fetch_one(select(money_daily.c.spent_micro, money_daily.c.held_micro).where(and_(
        money_daily.c.org_id == org_id, money_daily.c.day == day, money_daily.c.scope == ORG_SCOPE)))
    return (row["spent_micro"], row["held_micro"]) if row else (0, 0)


async def balance(svc: Services, org_id: str) -> Balance:
    """The org's balance, held amount, availability and today's spend (creating the account if new)."""
    await svc.settler.drain()  # this process's answered calls' closes written first (treg/money/settler.py)
    async with svc.db.tx() as tx:
        row = await lock_account(tx, svc, org_id, lock=False)
        spent, held_today = await _today_usage(tx, org_id, row["today"])
    return _balance_of(row, spent, held_today)


def _balance_of(row: dict[str, Any], spent_today: int, held_today: int) -> Balance:
    return Balance(org_id=row["org_id"], granted_micro=row["granted_micro"], settled_micro=row["settled_micro"],
                   held_micro=row["held_micro"], trial_micro=row["trial_micro"],
                   daily_cap_micro=row["daily_cap_micro"], spent_today_micro=spent_today,
                   held_today_micro=held_today, day=row["today"])


async def grant(svc: Services, *, org_id: str, amount_micro: int, actor: str, note: str | None = None) -> Balance:
    """Add operator credits to an org (one audited ``credit_grants`` row) and return the new balance."""
    if isinstance(amount_micro, bool) or not isinstance(amount_micro, int) or amount_micro <= 0:
        raise BadRequest("a grant is a positive number of micro-USD", code="invalid_amount")
    if amount_micro > MAX_GRANT_MICRO:
        raise BadRequest(f"a single grant is at most {MAX_GRANT_MICRO} micro-USD (1 000 000 USD)",
                         code="invalid_amount")
    async with svc.db.tx() as tx:
        await lock_account(tx, svc, org_id)
        await tx.execute(insert(credit_grants).values(id=new_id("crd"), org_id=org_id, kind="grant",
                                                      amount_micro=amount_micro, actor=actor[:200], note=note))
        row = await tx.fetch_one(
            update(org_balances).where(org_balances.c.org_id == org_id)
            .values(granted_micro=org_balances.c.granted_micro + amount_micro, updated_at=func.now())
            .returning(*org_balances.c, TODAY.label("today")))
        assert row is not None
        spent, held_today = await _today_usage(tx, org_id, row["today"])
    return _balance_of(row, spent, held_today)


async def grant_by_slug(svc: Services, *, slug: str, amount_micro: int, actor: str,
                        note: str | None = None) -> dict[str, Any]:
    """The operator CLI's grant: ``{org, granted_micro, balance_micro}``; unknown slug → 404."""
    async with svc.db.tx() as tx:
        org_id = await tx.scalar(select(orgs.c.id).where(orgs.c.slug == slug))
    if org_id is None:
        raise NotFound(f"no org with slug {slug!r}", code="org_not_found")
    after = await grant(svc, org_id=org_id, amount_micro=amount_micro, actor=actor, note=note)
    return {"org": slug, "granted_micro": amount_micro, "balance_micro": after.balance_micro}


async def list_grants(svc: Services, org_id: str, *, limit: int = 100) -> list[dict[str, Any]]:
    async with svc.db.tx() as tx:
        return await tx.fetch_all(
            select(credit_grants.c.id, credit_grants.c.kind, credit_grants.c.amount_micro, credit_grants.c.actor,
                   credit_grants.c.note, credit_grants.c.created_at)
            .where(credit_grants.c.org_id == org_id)
            .order_by(credit_grants.c.created_at.desc(), credit_grants.c.id).limit(limit))
