"""The platform case (issue 11): a platform-tier catalog call whose provider is not locked costs no more
than before that issue.

One catalog endpoint (``benchplat.small``: the upstream's ``GET /small``, 1 000 µUSD a call) is called on
the platform tier, treg's own key (``TREG_PLATFORM_KEY_BENCHPLAT``) against the org's credits: every call
places a hold and settles it. It is called through two treg processes on the same database, interleaved
round by round at each concurrency, each alone on the relay's CPU while measured:

* ``treg`` — this checkout as shipped: the lock view read before the hold, the spacer, the answer
  classified after it;
* ``treg-without`` — the same checkout with exactly those call-path stages taken out
  (bench/without_capacity.py): the pipeline as it was before issue 11.

Reported per target: requests/s, CPU per call and database transactions per call; then the ratios of
``treg`` over ``treg-without``. After the run, the money: every hold closed, and the org charged exactly
the calls it made (its balance's settled total equals the settled holds' sum, 1 000 µUSD each). The
provider is a plugin file in ``TREG_PLUGINS_DIR``, as an operator would install one.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.database import db_scalar
from bench.phases import Phase, Target, run_phase

PROVIDER = "benchplat"
ENDPOINT = "benchplat.small"
PRICE_MICRO = 1000
PATH = f"/catalog/call/{ENDPOINT}"
#: the two processes, as the report names them
TARGETS = ("treg", "treg-without")
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


def write_plugin(folder: Path, upstream_url: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "benchplat.py").write_text(PLUGIN.format(provider=PROVIDER, endpoint=ENDPOINT, url=upstream_url,
                                                       price=PRICE_MICRO))
    return folder


def environment(env: dict[str, str]) -> None:
    """treg's settings for the case: the deployment's key for the provider (the platform tier)."""
    env["TREG_PLATFORM_KEY_BENCHPLAT"] = "sk_platform_bench_0123456789abcdef"


async def measure(opts: argparse.Namespace, ports: dict[str, tuple[int, int]], token: str, concurrencies: list[int],
                  upstream_pid: int, dsn: str, say: Any) -> tuple[dict[str, Any], int]:
    """Both targets at each concurrency, ``opts.rounds`` interleaved rounds; returns the figures and the
    number of calls sent (warm-ups included)."""
    opts = argparse.Namespace(**{**vars(opts), "requests": opts.platform_requests})
    headers = {"X-Treg-Token": token}
    targets = {name: Target(name, port, PATH, headers, pid) for name, (port, pid) in ports.items()}
    phases = {(t, c): Phase(t, c) for c in concurrencies for t in TARGETS}
    sent = 0
    for rnd in range(opts.rounds):
        for c in concurrencies:
            # the order alternates: neither process always runs on the other's heels
            order = TARGETS if rnd % 2 == 0 else tuple(reversed(TARGETS))
            for name in order:
                say(f"platform round {rnd + 1}/{opts.rounds}: {name} at concurrency {c} …")
                sent += await run_phase(opts, targets[name], c, upstream_pid, phases[(name, c)], dsn)
    rows = []
    ratios: dict[str, Any] = {}
    for c in concurrencies:
        for name in TARGETS:
            fig = phases[(name, c)].figures()
            fig["target"] = name
            n = fig["requests"]
            xacts = phases[(name, c)].db_xacts
            fig["db_transactions"] = xacts
            fig["db_transactions_per_call"] = round(xacts / n, 3) if n else None
            rows.append(fig)
        with_, without = (next(r for r in rows if r["target"] == t and r["concurrency"] == c) for t in TARGETS)
        ratios[f"rps_with_over_without_c{c}"] = round(with_["rps"] / without["rps"], 3) if without["rps"] else None
        ratios[f"rps_with_over_without_c{c}_per_round"] = [
            round(a / b, 3) if b else None
            for a, b in zip(phases[("treg", c)].round_rps, phases[("treg-without", c)].round_rps)]
        cw, co = with_["server_cpu_us_per_req"], without["server_cpu_us_per_req"]
        ratios[f"cpu_per_call_with_over_without_c{c}"] = round(cw / co, 3) if cw and co else None
        ratios[f"db_transactions_per_call_with_minus_without_c{c}"] = (
            round(with_["db_transactions_per_call"] - without["db_transactions_per_call"], 3)
            if with_["db_transactions_per_call"] is not None and without["db_transactions_per_call"] is not None
            else None)
    return {"throughput": rows, "ratios": ratios, "price_micro": PRICE_MICRO}, sent


def money(dsn: str, org_id: str) -> dict[str, Any]:
    """The org's money after the case: open holds, settled holds and their sum, the balance's totals."""
    def one(sql: str) -> int | None:
        return db_scalar(dsn, sql, (org_id,))

    out = {
        "holds_open": one("SELECT count(*) FROM holds WHERE org_id = %s AND state = 'held'"),
        "holds_settled": one("SELECT count(*) FROM holds WHERE org_id = %s AND state = 'settled'"),
        "holds_released": one("SELECT count(*) FROM holds WHERE org_id = %s AND state = 'released'"),
        "settled_holds_micro": one("SELECT coalesce(sum(settled_micro), 0) FROM holds WHERE org_id = %s"),
        "balance_settled_micro": one("SELECT settled_micro FROM org_balances WHERE org_id = %s"),
        "balance_held_micro": one("SELECT held_micro FROM org_balances WHERE org_id = %s"),
        "platform_calls_recorded": one("SELECT count(*) FROM calls WHERE org_id = %s AND credential_tier = 'platform' "
                                       "AND outcome = 'ok'"),
    }
    out["ok"] = (out["holds_open"] == 0 and out["balance_held_micro"] == 0 and out["holds_released"] == 0
                 and out["settled_holds_micro"] == out["balance_settled_micro"]
                 == (out["holds_settled"] or 0) * PRICE_MICRO
                 and out["platform_calls_recorded"] == out["holds_settled"])
    return out
