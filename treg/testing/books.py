"""The money books checked from outside: every stored total recomputed from the holds and grants
(``check_books``), every effective close of a hold counted (``count_hold_closes``), an org's holds
(``org_holds``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from treg.context import Services
from treg.infra.schema import credit_grants, holds, money_daily, org_balances, tag_budgets
from treg.money import holds as hold_closes


async def check_books(svc: Services, org_id: str) -> dict[str, Any]:
    """Recompute every aggregate from the holds and grants and compare with the stored totals."""
    await svc.settler.drain()  # the closes this process queued (treg/money/settler.py) written first
    async with svc.db.tx() as tx:
        account = await tx.fetch_one(select(org_balances).where(org_balances.c.org_id == org_id))
        granted = await tx.scalar(select(func.coalesce(func.sum(credit_grants.c.amount_micro), 0))
                                  .where(credit_grants.c.org_id == org_id))
        rows = await tx.fetch_all(select(holds).where(holds.c.org_id == org_id))
        daily = await tx.fetch_all(select(money_daily).where(money_daily.c.org_id == org_id))
        tags = await tx.fetch_all(select(tag_budgets).where(tag_budgets.c.org_id == org_id))
    assert account is not None
    open_ = [r for r in rows if r["state"] == "held"]
    settled = sum(r["settled_micro"] for r in rows)
    assert all(r["settled_micro"] == 0 for r in rows if r["state"] != "settled")
    assert all(r["closed_at"] is not None for r in rows if r["state"] != "held")
    assert account["granted_micro"] == granted
    assert account["settled_micro"] == settled
    assert account["held_micro"] == sum(r["amount_micro"] for r in open_)
    for d in daily:
        mine = [r for r in rows if r["day"] == d["day"] and (d["scope"] == "*" or r["member_id"] == d["scope"])]
        assert d["spent_micro"] == sum(r["settled_micro"] for r in mine), d
        assert d["held_micro"] == sum(r["amount_micro"] for r in mine if r["state"] == "held"), d
    for t in tags:
        mine = [r for r in rows if r["tag"] == t["tag"]]
        assert t["spent_micro"] == sum(r["settled_micro"] for r in mine), t
        assert t["held_micro"] == sum(r["amount_micro"] for r in mine if r["state"] == "held"), t
    return {"granted": granted, "settled": settled, "open": len(open_), "holds": rows,
            "balance": account["granted_micro"] - account["settled_micro"]}


def count_hold_closes(monkeypatch: Any) -> list[tuple[str, str]]:
    """Every effective close of a hold (a settle or release that changed it), as (kind, call id), by
    whichever path closed it: the settler (off the answer's path) or inline, the reaper, an async job's
    poll — every close is one call of ``treg_close_holds`` or ``treg_close_leased`` through these three
    functions. A credit lease's own release is counted too (its id is no call's)."""
    seen: list[tuple[str, str]] = []
    close_on, close_in, close_leased_on = hold_closes.close_on, hold_closes.close_in, hold_closes.close_leased_on
    kind = {hold_closes.SETTLED: "settle", hold_closes.RELEASED: "release"}

    async def counted_on(db: Any, closes: Any) -> Any:
        closed = await close_on(db, closes)
        seen.extend((kind[c.state], c.call_id) for c in closed)
        return closed

    async def counted_in(tx: Any, closes: Any) -> Any:
        closed = await close_in(tx, closes)
        seen.extend((kind[c.state], c.call_id) for c in closed)
        return closed

    async def counted_leased_on(db: Any, closes: Any) -> Any:
        closed = await close_leased_on(db, closes)
        seen.extend((kind[c.state], c.call_id) for c in closed)
        return closed

    monkeypatch.setattr(hold_closes, "close_leased_on", counted_leased_on)
    monkeypatch.setattr(hold_closes, "close_on", counted_on)
    monkeypatch.setattr(hold_closes, "close_in", counted_in)
    return seen


async def hold_row(svc: Any, call_id: str) -> dict[str, Any] | None:
    """The call's hold (its state and settled amount), None when it has none (this process's queued
    closes written first)."""
    await svc.settler.drain()
    async with svc.db.tx() as tx:
        row = await tx.fetch_one(select(holds.c.state, holds.c.settled_micro).where(holds.c.id == call_id))
    return dict(row) if row is not None else None


async def org_holds(svc: Any, org_id: str) -> list[dict[str, Any]]:
    """The org's holds (id, state, amount, settled), oldest first (this process's queued closes written
    first)."""
    await svc.settler.drain()
    async with svc.db.tx() as tx:
        return await tx.fetch_all(select(holds.c.id, holds.c.state, holds.c.amount_micro, holds.c.settled_micro)
                                  .where(holds.c.org_id == org_id).order_by(holds.c.created_at))
