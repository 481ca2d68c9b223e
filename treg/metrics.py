"""Prometheus metrics of one treg process (``GET /metrics``, docs/operations.md "Metrics").

One :class:`Metrics` per app, on its own ``CollectorRegistry`` (never prometheus-client's global one:
two apps in one process, as in the tests, must not share or collide). What it costs a call: the audit
record already carries every figure, so :meth:`Metrics.observe_call` (called where the record is queued)
adds to two plain dicts (a count per label tuple, a bucket per latency); nothing on the call path asks
the database. What lives in the database (money) or in the pool is read when Prometheus scrapes:
:meth:`Metrics.refresh` runs one short query per scrape, :meth:`Metrics.collect` turns it into samples.

Labels carry only bounded values: the call surface, outcome, credential tier and refusal gate, each
mapped to ``other`` past a few dozen distinct values (a plugin's gate names are not known here), never
an org, a token, a path or an id.
"""

from __future__ import annotations

import asyncio
import logging
import re
from bisect import bisect_left
from itertools import accumulate
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from treg.call_record import CallRecord
    from treg.infra.db import Database

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

#: seconds to the upstream's first byte; past 10 s are the slow models and streams
UPSTREAM_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)

#: distinct values one label may take before new ones are counted as ``other``
LABEL_VALUES_MAX = 32
_LABEL = re.compile(r"\A[a-z][a-z0-9_]{0,31}\Z")
#: distinct label tuples kept as recorded; past it, new ones are recorded already bounded
_RAW_KEYS_MAX = 4096

#: the money query's own limit: a scrape answers without money figures rather than wait on a slow database
MONEY_TIMEOUT_S = 2.0

# one scan of holds, aided by the open-holds partial index for the first two figures: every micro-USD
# ever held is open, charged (settled_micro) or released (the rest of a closed hold)
_MONEY_SQL = (
    "SELECT count(*) FILTER (WHERE state = 'held') AS holds_open, "
    "coalesce(sum(amount_micro) FILTER (WHERE state = 'held'), 0) AS held_micro, "
    "coalesce(sum(settled_micro) FILTER (WHERE state <> 'held'), 0) AS charged_micro, "
    "coalesce(sum(amount_micro - settled_micro) FILTER (WHERE state <> 'held'), 0) AS released_micro "
    "FROM holds")


class LeaseCounts(Protocol):
    """What :meth:`Metrics.collect` reads of a process's credit leases (treg/money/leases.py ``Leases``)."""

    placed: int
    refused: int
    returned: int

    @property
    def live(self) -> int: ...


@dataclass(frozen=True)
class MoneyFigures:
    holds_open: int
    held_micro: int
    charged_micro: int
    released_micro: int


class _Bounded:
    """One label's values as exported: itself while fewer than LABEL_VALUES_MAX were seen, else ``other``."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def __call__(self, value: str | None) -> str:
        if value is None:
            return ""
        if value in self._seen:
            return value
        if not _LABEL.fullmatch(value) or len(self._seen) >= LABEL_VALUES_MAX:
            return "other"
        self._seen.add(value)
        return value


class _Latency:
    """One surface's histogram: a count per bucket (the last one past the largest bound) and the sum."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(UPSTREAM_BUCKETS) + 1)
        self.total = 0.0


class Metrics(Collector):
    """The figures of one app, its registry, and the collector of what is read at scrape time.

    The per-call figures are plain integers, not prometheus-client children: ``Counter.inc`` and
    ``Histogram.observe`` take a lock per update (the histogram one per bucket walk), about 10× the cost
    of a dict update, for thread safety treg does not need (every call is recorded on the event loop,
    which also serves the scrape). :meth:`collect` turns them into samples when scraped."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        #: capacity locks in force (read from the lock view when scraped, treg/call/capacity_stage.py) and
        #: overflow decisions
        self.capacity_locks = Gauge("treg_capacity_locks", "Capacity locks held now", registry=r)
        self.overflow = Counter("treg_overflow", "Overflow decisions, by aggregator and result",
                                ("aggregator", "result"), registry=r)
        #: OAuth connections' refreshes by outcome (ok, invalid_grant, failed: docs/oauth.md)
        self.oauth_refreshes = Counter("treg_oauth_refresh", "OAuth token refreshes, by outcome", ("outcome",),
                                       registry=r)
        for outcome in ("ok", "invalid_grant", "failed"):
            self.oauth_refreshes.labels(outcome=outcome)  # every outcome exported from the start, at 0
        #: (surface, outcome, credential_tier, refused_by) as recorded -> calls; bounded when exported
        self.calls: dict[tuple[Any, ...], int] = {}
        self.upstream: dict[str, _Latency] = {}
        self._bounds = (_Bounded(), _Bounded(), _Bounded(), _Bounded())
        self._db: Database | None = None
        self._leases: LeaseCounts | None = None
        self._money: MoneyFigures | None = None
        r.register(self)

    def bind(self, db: "Database") -> None:
        """The database whose pool and money figures the scrape reports."""
        self._db = db

    def bind_leases(self, leases: LeaseCounts) -> None:
        """The serving process's credit leases (its settler's), reported per process."""
        self._leases = leases

    def oauth_refresh(self, outcome: str) -> None:
        self.oauth_refreshes.labels(outcome=outcome).inc()

    # -- the call path ---------------------------------------------------------------------------
    def observe_call(self, rec: "CallRecord") -> None:
        key = (rec.surface, rec.outcome, rec.credential_tier, rec.refused_by)
        calls = self.calls
        if key not in calls and len(calls) >= _RAW_KEYS_MAX:
            key = self._bounded(key)  # what is recorded must stay bounded too, not only what is exported
        calls[key] = calls.get(key, 0) + 1
        if rec.ttfb_ms is not None:
            latency = self.upstream.get(rec.surface)
            if latency is None:
                latency = self._latency_for(rec.surface)
            seconds = rec.ttfb_ms / 1000
            latency.counts[bisect_left(UPSTREAM_BUCKETS, seconds)] += 1  # first bound >= seconds: its "le"
            latency.total += seconds

    def _latency_for(self, surface: str) -> _Latency:
        if len(self.upstream) >= _RAW_KEYS_MAX:
            surface = self._bounds[0](surface)
        return self.upstream.setdefault(surface, _Latency())

    def _bounded(self, key: tuple[Any, ...]) -> tuple[str, ...]:
        return tuple(bound(v) for bound, v in zip(self._bounds, key))

    # -- the scrape ------------------------------------------------------------------------------
    async def refresh(self) -> None:
        """Read the money figures for this scrape (one query, bounded in time); on failure the scrape
        goes without them and ``treg_metrics_money_ok`` says so."""
        self._money = None
        if self._db is None:
            return
        try:
            async with asyncio.timeout(MONEY_TIMEOUT_S):
                async with self._db.tx() as tx:
                    await tx.execute(f"SET LOCAL statement_timeout = {int(MONEY_TIMEOUT_S * 1000)}")
                    row = await tx.fetch_one(_MONEY_SQL)
        except Exception as exc:  # noqa: BLE001 (a scrape must answer; the failure is a figure of its own)
            log.warning("metrics: money figures unavailable (%s)", type(exc).__name__)
            return
        assert row is not None
        self._money = MoneyFigures(*(int(row[k]) for k in ("holds_open", "held_micro", "charged_micro",
                                                            "released_micro")))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def describe(self) -> list[Any]:
        return []  # collected at scrape time only: nothing to check for name clashes at registration

    def collect(self) -> Iterator[Any]:
        """The pool, the per-call figures (bounded labels) and the money figures :meth:`refresh` read."""
        calls = CounterMetricFamily("treg_calls", "Calls audited, by surface, outcome, credential tier and "
                                    "refusing gate", labels=("surface", "outcome", "credential_tier", "refused_by"))
        merged: dict[tuple[str, ...], int] = {}
        for key, n in list(self.calls.items()):
            labels = self._bounded(key)
            merged[labels] = merged.get(labels, 0) + n
        for labels, n in merged.items():
            calls.add_metric(labels, n)
        yield calls
        upstream = HistogramMetricFamily("treg_upstream_seconds", "Seconds from sending a call upstream to its "
                                         "first answer byte", labels=("surface",))
        by_surface: dict[str, tuple[list[int], float]] = {}
        for surface, latency in list(self.upstream.items()):
            label = self._bounds[0](surface)
            counts, total = by_surface.get(label, ([0] * len(latency.counts), 0.0))
            by_surface[label] = ([a + b for a, b in zip(counts, latency.counts)], total + latency.total)
        for label, (counts, total) in by_surface.items():
            cumulative = list(accumulate(counts))
            buckets = [(floatToGoString(le), c) for le, c in zip(UPSTREAM_BUCKETS, cumulative)]
            buckets.append(("+Inf", cumulative[-1]))
            upstream.add_metric((label,), buckets, total)
        yield upstream
        trips = CounterMetricFamily("treg_db_round_trips", "Statements this process sent to the database (one "
                                    "round trip each; a transaction's BEGIN and COMMIT count), by what they were for",
                                    labels=("path",))
        total = self._db.round_trips if self._db is not None else 0
        by_path = dict(self._db.round_trips_of) if self._db is not None else {}
        for path in ("money", "audit"):
            trips.add_metric((path,), by_path.get(path, 0))
        trips.add_metric(("other",), total - sum(by_path.get(p, 0) for p in ("money", "audit")))
        yield trips
        pool = GaugeMetricFamily("treg_db_pool_connections", "Database pool connections, by state",
                                 labels=("state",))
        in_use, idle = self._db.pool_use() if self._db is not None else (0, 0)
        pool.add_metric(("in_use",), in_use)
        pool.add_metric(("idle",), idle)
        yield pool
        # this process's credit leases (docs/money.md "Credit leases"); all 0 outside a serving process
        leases = self._leases
        events = CounterMetricFamily("treg_credit_leases", "Credit leases this process placed, was refused "
                                     "(no headroom under a limit, or the placement failed) and returned",
                                     labels=("event",))
        for event in ("placed", "refused", "returned"):
            events.add_metric((event,), getattr(leases, event) if leases is not None else 0)
        yield events
        yield GaugeMetricFamily("treg_credit_leases_live", "Credit leases this process holds now (serving calls, "
                                "or waiting for their calls' closes before they are returned)",
                                value=leases.live if leases is not None else 0)
        money = self._money
        yield GaugeMetricFamily("treg_metrics_money_ok", "1 when this scrape read the money figures",
                                value=1 if money is not None else 0)
        if money is None:
            return
        yield GaugeMetricFamily("treg_holds_open", "Money holds open now (all processes on this database)",
                                value=money.holds_open)
        yield GaugeMetricFamily("treg_holds_open_micro", "Micro-USD held by open holds now", value=money.held_micro)
        yield CounterMetricFamily("treg_charged_micro", "Micro-USD charged by settled holds (this database)",
                                  value=money.charged_micro)
        yield CounterMetricFamily("treg_released_micro", "Micro-USD held and given back when a hold closed "
                                  "(released, or settled below its estimate)", value=money.released_micro)
