"""Overflow's shared state in PostgreSQL: each aggregator's spend per UTC day (its daily budget) and
health marks (``overflow:<name>`` for the whole aggregator, ``overflow:<name>:<provider>`` for one
vendor through it). Each write is its own short transaction; these are read only on the (rare) overflow
path, so they are not cached."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Mapping

from sqlalchemy import and_, select
from sqlalchemy.dialects.postgresql import insert

from treg.infra.db import Database
from treg.infra.schema import overflow_health as oh, overflow_spend as osp
from treg.settings import Settings


def aggregator_mark(name: str) -> str:
    return f"overflow:{name}"


def vendor_mark(name: str, provider: str) -> str:
    return f"overflow:{name}:{provider}"


class OverflowStore:
    def __init__(self, db: Database, settings: Settings, *,
                 clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc)) -> None:
        self.db = db
        self.settings = settings
        self.clock = clock

    # -- budget --------------------------------------------------------------------------------
    async def spent_today(self, aggregator: str) -> int:
        day = self.clock().date()
        async with self.db.tx() as tx:
            return int(await tx.scalar(select(osp.c.spent_micro).where(
                and_(osp.c.aggregator == aggregator, osp.c.day == day))) or 0)

    async def within_budget(self, aggregator: str, price_micro: int) -> bool:
        """Whether one more call at ``price_micro`` stays within today's budget (UTC day)."""
        return await self.spent_today(aggregator) + price_micro <= self.settings.overflow_budget_micro(aggregator)

    async def record_spend(self, aggregator: str, micro: int) -> int:
        """Add what the aggregator reported (shadow mode too: treg pays); returns today's total."""
        day = self.clock().date()
        stmt = insert(osp).values(aggregator=aggregator, day=day, spent_micro=micro)
        stmt = stmt.on_conflict_do_update(index_elements=["aggregator", "day"],
                                          set_={"spent_micro": osp.c.spent_micro + stmt.excluded.spent_micro})
        async with self.db.tx() as tx:
            await tx.execute(stmt)
            return int(await tx.scalar(select(osp.c.spent_micro).where(
                and_(osp.c.aggregator == aggregator, osp.c.day == day))))

    # -- health --------------------------------------------------------------------------------
    async def mark_unhealthy(self, mark: str, reason: str) -> datetime:
        """Mark ``mark`` unhealthy for ``TREG_OVERFLOW_UNHEALTHY_S`` from now (a later mark extends it)."""
        until = self.clock() + timedelta(seconds=self.settings.overflow_unhealthy_s)
        stmt = insert(oh).values(mark=mark, until=until, reason=reason[:64], updated_at=self.clock())
        stmt = stmt.on_conflict_do_update(index_elements=["mark"], set_={
            "until": stmt.excluded.until, "reason": stmt.excluded.reason, "updated_at": stmt.excluded.updated_at})
        async with self.db.tx() as tx:
            await tx.execute(stmt)
        return until

    async def healthy(self, aggregator: str, provider: str) -> bool:
        """Neither the aggregator nor this vendor through it is marked unhealthy now."""
        marks = [aggregator_mark(aggregator), vendor_mark(aggregator, provider)]
        async with self.db.tx() as tx:
            hit = await tx.scalar(select(oh.c.mark).where(and_(oh.c.mark.in_(marks), oh.c.until > self.clock()))
                                  .limit(1))
        return hit is None

    async def marks(self) -> list[dict[str, object]]:
        async with self.db.tx() as tx:
            rows = await tx.fetch_all(select(oh).where(oh.c.until > self.clock()).order_by(oh.c.mark))
        return [{"mark": r["mark"], "until": r["until"].isoformat().replace("+00:00", "Z"), "reason": r["reason"]}
                for r in rows]

    async def usable(self, route, provider: str) -> bool:
        """The route's aggregator has a key, is healthy for this provider and within today's budget."""
        if not self.settings.overflow_key(route.aggregator):
            return False
        return await self.healthy(route.aggregator, provider) and \
            await self.within_budget(route.aggregator, route.price_micro)

    async def first_usable(self, routes, provider: str):
        """The first usable route of an endpoint's ``overflow`` list (at most one aggregator per call)."""
        for route in routes:
            if await self.usable(route, provider):
                return route
        return None

    async def usability(self) -> "Usability":
        """Every mark and today's spend in two reads, for answering usability of many routes at once
        (the catalog listing)."""
        now = self.clock()
        async with self.db.tx() as tx:
            marks = frozenset(r["mark"] for r in await tx.fetch_all(select(oh.c.mark).where(oh.c.until > now)))
            spent = {r["aggregator"]: int(r["spent_micro"]) for r in await tx.fetch_all(
                select(osp.c.aggregator, osp.c.spent_micro).where(osp.c.day == now.date()))}
        return Usability(self.settings, marks, spent)


@dataclass(frozen=True)
class Usability:
    """:meth:`OverflowStore.usable` as of one moment, synchronous (``Endpoint.summary_json(overflow_usable=…)``)."""

    settings: Settings
    marks: frozenset[str]
    spent: Mapping[str, int]

    def usable(self, route: Any, provider: str) -> bool:
        name = route.aggregator
        return (self.settings.overflow_key(name) is not None
                and aggregator_mark(name) not in self.marks and vendor_mark(name, provider) not in self.marks
                and self.spent.get(name, 0) + route.price_micro <= self.settings.overflow_budget_micro(name))

    def predicate(self, provider: str) -> Callable[[Any], bool]:
        return lambda route: self.usable(route, provider)
