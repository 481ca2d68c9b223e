"""The platform case: a platform-tier catalog call beside an own tool's call, through one treg.

Issue 23's case. One catalog endpoint (``benchplat.small``: the upstream's ``GET /small``, 1 000 µUSD a
call) is called on the platform tier, treg's own key (``TREG_PLATFORM_KEY_BENCHPLAT``) against the org's
credits: every call places a hold and closes it. Beside it, the own tool ``bench`` to the same upstream
path (``/call/bench/small``: no money at all). Both through the same ``treg serve`` process, interleaved
round by round at each concurrency, the process alone on the relay's CPU while measured:

* ``own`` — an own tool's relay, the reference;
* ``platform`` — the billed call: the hold (one statement), the relay, the close (one statement, off
  the answer's path);
* ``platform-without`` (``--platform-reference``, issue 11's check) — the platform call through a
  second treg without issue 11's call-path stages (bench/without_capacity.py).

Reported per target: requests/s, p50/p99, CPU per call, database round trips per call (treg's own
count, ``treg_db_round_trips_total`` on ``/metrics``: all of them, and the money path's and the audit
writer's) and database transactions per call; then the ratios the targets are stated in. After the
run, the money: every hold closed, and the org charged exactly the calls it made (its balance's
settled total equals the settled holds' sum, 1 000 µUSD each). The provider is a plugin file in
``TREG_PLUGINS_DIR``, as an operator would install one.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

from bench.database import db_scalar
from bench.phases import Phase, Target, run_phase

PROVIDER = "benchplat"
ENDPOINT = "benchplat.small"
PRICE_MICRO = 1000
PATH = f"/catalog/call/{ENDPOINT}"
OWN_PATH = "/call/bench/small"
#: the targets, as the report names them; the third only with ``--platform-reference``
TARGETS = ("own", "platform")
REFERENCE = "platform-without"
WRAPPER = str(Path(__file__).resolve().parent / "without_capacity.py")
#: credits for the case: far more than any run spends (a bounded run makes at most a few 100 000 calls)
CREDIT_MICRO = 10**12

PLUGIN = '''
from treg import hookimpl


@hookimpl
def treg_register_providers():
    return [{{"id": "{provider}", "base_url": "{url}",
             "auth": [{{"location": "header", "name": "Authorization", "format": "Bearer {{secret}}"}}],
             "endpoints": [{{"id": "{endpoint}", "method": "GET", "path": "/small",
                            "price": {{"per_call_micro": {price}}}}}]}}]
'''

_TRIPS = re.compile(r'^treg_db_round_trips_total\{path="(\w+)"\} ([0-9.e+]+)$', re.M)


def write_plugin(folder: Path, upstream_url: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "benchplat.py").write_text(PLUGIN.format(provider=PROVIDER, endpoint=ENDPOINT, url=upstream_url,
                                                       price=PRICE_MICRO))
    return folder


def environment(env: dict[str, str]) -> None:
    """treg's settings for the case: the deployment's key for the provider (the platform tier)."""
    env["TREG_PLATFORM_KEY_BENCHPLAT"] = "sk_platform_bench_0123456789abcdef"


def round_trips_reader(port: int) -> Any:
    """A read of treg's ``treg_db_round_trips_total`` by path (``/metrics``, answered to loopback)."""
    import aiohttp

    async def read() -> dict[str, float]:
        async with aiohttp.ClientSession() as s:
            async with s.get(f"http://127.0.0.1:{port}/metrics") as r:
                text = await r.text()
        by_path = {path: float(v) for path, v in _TRIPS.findall(text)}
        by_path["all"] = sum(by_path.values())
        return by_path

    return read


async def measure(opts: argparse.Namespace, ports: dict[str, tuple[int, int]], token: str, concurrencies: list[int],
                  upstream_pid: int, dsn: str, say: Any) -> tuple[dict[str, Any], int]:
    """Every target at each concurrency, ``opts.rounds`` interleaved rounds; returns the figures and the
    number of calls sent (warm-ups included). ``ports``: target name → (port, pid) of its treg."""
    opts = argparse.Namespace(**{**vars(opts), "requests": opts.platform_requests})
    headers = {"X-Treg-Token": token}
    names = tuple(n for n in (*TARGETS, REFERENCE) if n in ports)
    targets = {name: Target(name, port, OWN_PATH if name == "own" else PATH, headers, pid)
               for name, (port, pid) in ports.items()}
    readers = {name: round_trips_reader(port) for name, (port, _) in ports.items()}
    phases = {(t, c): Phase(t, c) for c in concurrencies for t in names}
    sent = 0
    for rnd in range(opts.rounds):
        for c in concurrencies:
            # the order alternates: no target always runs on another's heels
            order = names if rnd % 2 == 0 else tuple(reversed(names))
            for name in order:
                say(f"platform round {rnd + 1}/{opts.rounds}: {name} at concurrency {c} …")
                sent += await run_phase(opts, targets[name], c, upstream_pid, phases[(name, c)], dsn,
                                        counters=readers[name])
    rows = []
    for c in concurrencies:
        for name in names:
            ph = phases[(name, c)]
            fig = ph.figures()
            fig["target"] = name
            n = fig["requests"]
            fig["db_transactions"] = ph.db_xacts
            fig["db_transactions_per_call"] = round(ph.db_xacts / n, 3) if n else None
            for path in ("all", "money", "audit", "other"):
                fig[f"db_round_trips_per_call_{path}"] = round(ph.counted.get(path, 0.0) / n, 3) if n else None
            rows.append(fig)
    by = {(r["target"], r["concurrency"]): r for r in rows}
    ratios: dict[str, Any] = {}

    def ratio(a: float | None, b: float | None, digits: int = 3) -> float | None:
        return round(a / b, digits) if a and b else None

    for c in concurrencies:
        own, plat = by[("own", c)], by[("platform", c)]
        ratios[f"rps_platform_over_own_c{c}"] = ratio(plat["rps"], own["rps"])
        ratios[f"rps_platform_over_own_c{c}_per_round"] = [
            ratio(a, b) for a, b in zip(phases[("platform", c)].round_rps, phases[("own", c)].round_rps)]
        ratios[f"cpu_per_call_platform_over_own_c{c}"] = ratio(plat["server_cpu_us_per_req"],
                                                               own["server_cpu_us_per_req"])
        ratios[f"p99_platform_over_own_c{c}"] = ratio(plat["p99_ms"], own["p99_ms"], 2)
        ratios[f"db_round_trips_per_call_platform_c{c}"] = plat["db_round_trips_per_call_all"]
        ratios[f"db_round_trips_per_call_platform_money_c{c}"] = plat["db_round_trips_per_call_money"]
        if ("platform-without", c) in by:
            ref = by[("platform-without", c)]
            ratios[f"rps_platform_over_without_c{c}"] = ratio(plat["rps"], ref["rps"])
            ratios[f"cpu_per_call_platform_over_without_c{c}"] = ratio(plat["server_cpu_us_per_req"],
                                                                       ref["server_cpu_us_per_req"])
    lo, hi = min(concurrencies), max(concurrencies)
    if lo != hi:
        # how each call scales from the lowest concurrency to the highest (issue 23 asks the platform call
        # for 4x from c=1 to c=32); the own tool's beside it, in the same treg and run, is what the relay
        # under it reaches on this machine
        for name in ("platform", "own"):
            ratios[f"rps_{name}_c{hi}_over_c{lo}"] = ratio(by[(name, hi)]["rps"], by[(name, lo)]["rps"], 2)
    return {"throughput": rows, "ratios": ratios, "price_micro": PRICE_MICRO}, sent


def targets_met(figures: dict[str, Any], concurrencies: list[int]) -> dict[str, bool]:
    """Issue 23's targets for the platform tier, from the case's ratios (and the money afterwards)."""
    r = figures["ratios"]

    def at_least(key: str, floor: float) -> bool:
        return r.get(key) is not None and r[key] >= floor

    def at_most(key: str, ceiling: float) -> bool:
        return r.get(key) is not None and r[key] <= ceiling

    met = {"platform_money_exact": figures["money"]["ok"]}
    if 32 in concurrencies:
        met["platform_over_own_rps_c32_ge_0.5"] = at_least("rps_platform_over_own_c32", 0.5)
        met["platform_p99_c32_le_3x_own"] = at_most("p99_platform_over_own_c32", 3.0)
    if 1 in concurrencies:
        met["platform_over_own_rps_c1_ge_0.6"] = at_least("rps_platform_over_own_c1", 0.6)
    if 1 in concurrencies and 32 in concurrencies:
        met["platform_c32_ge_4x_c1"] = at_least("rps_platform_c32_over_c1", 4.0)
    for c in concurrencies:
        met[f"platform_cpu_per_call_le_2x_own_c{c}"] = at_most(f"cpu_per_call_platform_over_own_c{c}", 2.0)
        met[f"platform_money_round_trips_le_2_c{c}"] = at_most(f"db_round_trips_per_call_platform_money_c{c}", 2.0)
    return met


def money(dsn: str, org_id: str) -> dict[str, Any]:
    """The org's money after the case: open holds, settled holds and their sum, the balance's totals."""
    def one(sql: str) -> int | None:
        return db_scalar(dsn, sql, (org_id,))

    out = {
        "holds_open": one("SELECT count(*) FROM holds WHERE org_id = %s AND state = 'held'"),
        "holds_settled": one("SELECT count(*) FROM holds WHERE org_id = %s AND state = 'settled' AND NOT lease"),
        "holds_released": one("SELECT count(*) FROM holds WHERE org_id = %s AND state = 'released' AND NOT lease"),
        # credit leases (docs/money.md): each released when its process was done with it, never charged
        "leases": one("SELECT count(*) FROM holds WHERE org_id = %s AND lease"),
        "leases_charged_micro": one("SELECT coalesce(sum(settled_micro), 0) FROM holds WHERE org_id = %s AND lease"),
        "settled_holds_micro": one("SELECT coalesce(sum(settled_micro), 0) FROM holds WHERE org_id = %s"),
        "balance_settled_micro": one("SELECT settled_micro FROM org_balances WHERE org_id = %s"),
        "balance_held_micro": one("SELECT held_micro FROM org_balances WHERE org_id = %s"),
        "platform_calls_recorded": one("SELECT count(*) FROM calls WHERE org_id = %s AND credential_tier = 'platform' "
                                       "AND outcome = 'ok'"),
    }
    out["ok"] = (out["holds_open"] == 0 and out["balance_held_micro"] == 0 and out["holds_released"] == 0
                 and out["leases_charged_micro"] == 0
                 and out["settled_holds_micro"] == out["balance_settled_micro"]
                 == (out["holds_settled"] or 0) * PRICE_MICRO
                 and out["platform_calls_recorded"] == out["holds_settled"])
    return out
