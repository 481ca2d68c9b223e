"""Helpers (no tests here) shared by the money and idempotency tests: domain Services on a real database."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from treg.context import Services
from treg.factory import build_services
from treg.infra.db import Database
from treg.infra.schema import credit_grants, holds, money_daily, org_balances, tag_budgets
from treg.settings import Settings


async def open_services(dsn: str, settings: Settings, *, maxsize: int = 10) -> Services:
    db = await Database(dsn, minsize=1, maxsize=maxsize, timeout=30.0).open()
    return build_services(settings, db)


async def check_books(svc: Services, org_id: str) -> dict[str, Any]:
    """Recompute every aggregate from the holds and grants and compare with the stored totals."""
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
