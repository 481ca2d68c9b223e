"""The benchmark script runs end to end in a tiny bounded mode and prints its figures.

Not a timed test: nothing here asserts on speed, only that every phase ran, every request was
answered, the streamed bytes arrived whole and the audit recorded each call treg relayed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TARGETS = {"direct", "baseline", "treg"}
CHECKOUT = Path(__file__).resolve().parent.parent  # bench/ is not installed: run it from here


def test_bench_tiny_run_prints_every_figure(dsn: str, tmp_path):
    args = [sys.executable, "-m", "bench", "--dsn", dsn, "--requests", "50", "--requests-c1", "50",
            "--warmup", "5", "--concurrency", "1,4", "--rounds", "1", "--time-cap", "60",
            "--stream-mib", "2", "--stream-timeout", "120", "--stream-rounds", "1",
            "--slow-streams", "20", "--slow-events", "5", "--slow-short-cap", "10",
            "--archive-calls", "20", "--archive-vendor-ms", "20", "--platform-requests", "50", "--quiet"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(CHECKOUT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    result = json.loads(lines[-1])  # the figures as one JSON object, last

    rows = {(f["target"], f["concurrency"]): f for f in result["throughput"]}
    assert set(rows) == {(t, c) for t in TARGETS for c in (1, 4)}
    for f in rows.values():
        assert f["requests"] == 50 and f["errors"] == 0 and f["statuses"] == {"200": 50}
        assert f["rps"] > 0 and 0 < f["p50_ms"] <= f["p99_ms"] <= f["p999_ms"] <= f["max_ms"]
    for c in (1, 4):
        assert isinstance(result["ratios"][f"rps_treg_over_baseline_c{c}"], float)
        assert isinstance(result["ratios"][f"added_p50_ms_vs_baseline_c{c}"], float)
        assert isinstance(result["ratios"][f"p99_treg_over_baseline_c{c}"], float)
        assert len(result["ratios"][f"p99_treg_over_baseline_c{c}_per_round"]) == 1

    stream = result["streaming"]
    assert stream["ok"] is True
    assert stream["upload_received"] == stream["download_received"] == 2 * 1024 * 1024
    assert stream["rss_kib_before"]["VmHWM"] > 0 and stream["rss_kib_after"]["VmHWM"] > 0
    # the same transfers through the bare relay, with each relay's CPU per GiB read from /proc
    for relay in ("baseline", "treg"):
        figures = stream["relays"][relay]
        assert figures["ok"] is True and figures["rounds"] == 1
        assert figures["download_mib_s"] > 0 and figures["download_cpu_s_per_gib"] >= 0
    assert isinstance(stream["ratios"]["download_mib_s_treg_over_baseline"], float)

    # the slow streams were all held open while the short calls ran, and each ended whole
    slow = result["slow_streams"]
    assert slow["ok"] is True and slow["completed"] == 20 and slow["events"] == 20 * 5
    assert slow["short_with_streams"]["requests"] > 0 and slow["rss_kib_peak"] >= slow["rss_kib_before"] > 0

    # with two CPUs or more, each relay ran alone on one (the report says where everything ran); the
    # session's PostgreSQL was given with --dsn, so the run left it where it was (tests/test_bench_pinning.py)
    assert result["pinning"] == "off" or (result["pinning"].startswith("relay under test on CPU")
                                          and result["pinning"].endswith("PostgreSQL not moved (a server given "
                                                                         "to the run may be shared)"))

    # the archive case: every hit answered by treg alone (the vendor counted none of them)
    arch = result["archive"]
    assert arch["ok"] is True and arch["hit_calls"] == arch["vendor_calls"] == 20
    assert arch["vendor_lookups_during_hits"] == 0 and arch["hit_states"] == {"hit": 20}
    assert arch["vendor_p50_ms"] >= 20 and arch["hit_p50_ms"] > 0

    # the platform case: the platform-tier catalog call beside an own tool's call through the same treg, at
    # each concurrency, with treg's own count of database round trips; every platform call held and closed
    # once, the org charged exactly those calls
    plat = result["platform"]
    prow = {(f["target"], f["concurrency"]): f for f in plat["throughput"]}
    assert set(prow) == {(t, c) for t in ("own", "platform") for c in (1, 4)}
    for f in prow.values():
        assert f["requests"] == 50 and f["errors"] == 0 and f["statuses"] == {"200": 50}
        assert f["db_round_trips_per_call_all"] is not None
    for c in (1, 4):
        assert prow[("platform", c)]["db_round_trips_per_call_money"] > 0 == prow[("own", c)]["db_round_trips_per_call_money"]
        assert isinstance(plat["ratios"][f"rps_platform_over_own_c{c}"], float)
        assert isinstance(plat["ratios"][f"cpu_per_call_platform_over_own_c{c}"], float)
    money = plat["money"]
    assert money["ok"] is True and money["holds_open"] == 0 and money["holds_released"] == 0
    assert money["settled_holds_micro"] == money["balance_settled_micro"] == money["holds_settled"] * plat["price_micro"]
    assert result["targets_met"]["platform_money_exact"] is True

    # auditing was on: a clean shutdown wrote one row per call treg relayed (warm-ups included)
    assert result["audit"]["calls_recorded"] == result["audit"]["calls_sent_to_treg"] > 0

    # the human-readable table came first, with every target and the ratios
    text = "\n".join(lines[:-1])
    for word in ("direct", "baseline", "treg", "req/s", "p50 ms", "p99 ms", "rps_treg_over_baseline_c4",
                 "VmHWM", "p99.9 ms", "down CPU s/GiB", "slow streams:", "archive hits", "platform tier",
                 "rps_platform_over_own_c4", "rps_baseline_c4_over_c1", "rps_treg_c4_over_c1",
                 "rps_platform_c4_over_c1", "rps_own_c4_over_c1"):
        assert word in text
