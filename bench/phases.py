"""One measured phase: one target at one concurrency, with the CPU figures around it."""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from bench.database import db_xacts
from bench.load import Budget, Sample, aiohttp_load, pct, raw_load
from bench.procs import machine_ticks, proc_cpu_s, proc_cpu_split


@dataclass
class Target:
    name: str
    port: int
    path: str
    headers: dict[str, str]
    server_pid: int | None  # the process doing the relaying (None for direct)

    def raw_request(self) -> bytes:
        lines = [f"GET {self.path} HTTP/1.1", f"Host: 127.0.0.1:{self.port}", "Accept: */*"]
        lines += [f"{k}: {v}" for k, v in self.headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode()


@dataclass
class Phase:
    target: str
    concurrency: int
    sample: Sample = field(default_factory=Sample)
    server_cpu_s: float = 0.0
    #: the server's user and system time in /proc's ticks, for the system share only (the clock has no split)
    server_ticked_s: float = 0.0
    server_sys_s: float = 0.0
    upstream_cpu_s: float = 0.0
    loadgen_cpu_s: float = 0.0
    busy_ticks: int = 0
    total_ticks: int = 0
    round_rps: list[float] = field(default_factory=list)
    round_p99: list[float] = field(default_factory=list)
    db_xacts: int = 0
    #: what ``counters`` of :func:`run_phase` counted over the measured requests (summed over rounds)
    counted: dict[str, float] = field(default_factory=dict)

    def figures(self) -> dict[str, Any]:
        lat = sorted(self.sample.latencies)
        n = len(lat)
        secs = self.sample.seconds or 1e-9
        return {
            "target": self.target, "concurrency": self.concurrency, "requests": n, "errors": self.sample.errors,
            "seconds": round(secs, 3), "rps": round(n / secs, 1),
            "p50_ms": round(pct(lat, 50) * 1000, 3), "p99_ms": round(pct(lat, 99) * 1000, 3),
            "p999_ms": round(pct(lat, 99.9) * 1000, 3), "max_ms": round(lat[-1] * 1000, 3) if lat else 0.0,
            "mean_ms": round(sum(lat) / n * 1000, 3) if n else 0.0,
            "server_cpu_us_per_req": round(self.server_cpu_s / n * 1e6, 1) if n and self.server_cpu_s else None,
            "server_cpu_pct": round(self.server_cpu_s / secs * 100, 1),
            "server_sys_share_pct": round(self.server_sys_s / self.server_ticked_s * 100, 1) if self.server_ticked_s else None,
            "upstream_cpu_pct": round(self.upstream_cpu_s / secs * 100, 1),
            "loadgen_cpu_pct": round(self.loadgen_cpu_s / secs * 100, 1),
            "machine_busy_pct": round(self.busy_ticks / self.total_ticks * 100, 1) if self.total_ticks else None,
            "statuses": {str(k): v for k, v in sorted(self.sample.statuses.items())},
            "round_rps": [round(x, 1) for x in self.round_rps],
            "db_transactions": self.db_xacts if self.target == "treg" else None,
        }


async def run_phase(opts: argparse.Namespace, target: Target, concurrency: int, upstream_pid: int,
                    into: Phase, dsn: str | None = None,
                    counters: Callable[[], Awaitable[dict[str, float]]] | None = None) -> int:
    """Warm up, then measure one target at one concurrency into ``into``; returns the number of
    requests sent (warm-up included). With ``dsn``, the database transactions of the measured
    requests are counted too (do calls pay a query, or do the caches answer?); with ``counters`` (a
    read of the server's own counters), their growth over the measured requests (``into.counted``)."""
    async def drive(count: int, cap: float, sample: Sample) -> int:
        budget = Budget(count, cap)
        if opts.client == "aiohttp":
            coro = aiohttp_load(target.port, target.path, target.headers, concurrency, budget, sample)
        else:
            coro = raw_load(target.port, target.raw_request(), concurrency, budget, sample)
        await asyncio.wait_for(coro, cap + 30)
        return budget.taken

    # warm-up (not counted): connections opened, caches filled, code paths hot
    sent = await drive(max(opts.warmup, concurrency), opts.time_cap, Sample())
    count = opts.requests_c1 if concurrency == 1 else opts.requests
    sample = Sample()
    xacts0 = await db_xacts(dsn) if dsn else None
    counted0 = await counters() if counters is not None else None
    t_self, t_up = os.times(), proc_cpu_s(upstream_pid)
    # the total by the process's CPU clock (to the ns); the system share by /proc's ticks (no clock has it)
    srv_cpu = proc_cpu_s(target.server_pid) if target.server_pid else 0.0
    srv_user, srv_sys = proc_cpu_split(target.server_pid) if target.server_pid else (0.0, 0.0)
    busy0, total0 = machine_ticks()
    started = time.perf_counter()
    sent += await drive(count, opts.time_cap, sample)
    sample.seconds = time.perf_counter() - started
    busy1, total1 = machine_ticks()
    t_self2 = os.times()
    into.sample.latencies += sample.latencies
    into.sample.errors += sample.errors
    for k, v in sample.statuses.items():
        into.sample.statuses[k] = into.sample.statuses.get(k, 0) + v
    into.sample.seconds += sample.seconds
    if target.server_pid:
        into.server_cpu_s += proc_cpu_s(target.server_pid) - srv_cpu
        user, system = proc_cpu_split(target.server_pid)
        into.server_ticked_s += (user - srv_user) + (system - srv_sys)
        into.server_sys_s += system - srv_sys
    into.upstream_cpu_s += proc_cpu_s(upstream_pid) - t_up
    into.loadgen_cpu_s += (t_self2.user + t_self2.system) - (t_self.user + t_self.system)
    into.busy_ticks += busy1 - busy0
    into.total_ticks += total1 - total0
    into.round_rps.append(len(sample.latencies) / sample.seconds if sample.seconds else 0.0)
    into.round_p99.append(pct(sorted(sample.latencies), 99))
    if counted0 is not None and counters is not None:
        await asyncio.sleep(0.5)  # the settler's and the audit writer's last statements of the phase
        counted1 = await counters()
        for k, v in counted1.items():
            into.counted[k] = into.counted.get(k, 0.0) + v - counted0.get(k, 0.0)
    if xacts0 is not None and dsn:
        await asyncio.sleep(1.5)  # the audit writer's last batch; backends report their stats within ~1 s
        xacts1 = await db_xacts(dsn)
        if xacts1 is not None:
            into.db_xacts += xacts1 - xacts0 - 1  # minus the probe's own
    return sent
