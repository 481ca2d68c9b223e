"""``python -m bench.bytecodes`` counts the bytecodes each function of the bare relay and of treg runs per
call, in a tiny bounded run, and prints where they go. Nothing here asserts on speed: only that each
process was counted over exactly the calls asked for, and that each count names its own code (treg's
stages in treg's, never in the bare relay's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("platform", [False, True], ids=["own-tool", "platform"])
def test_a_tiny_count_of_both_relays(platform):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(CHECKOUT), os.environ.get("PYTHONPATH")]))}
    env.pop("TREG_DATABASE_URL", None)
    done = subprocess.run([sys.executable, "-m", "bench.bytecodes", "--calls", "40", "--warmup", "30", "--top", "8",
                           *(["--platform"] if platform else [])],
                          capture_output=True, text=True, timeout=600, cwd=CHECKOUT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    base, treg = out["baseline"], out["treg"]
    assert base["calls"] == treg["calls"] == 40
    for figures in (base, treg):
        # an HTTP call through aiohttp runs thousands of bytecodes; the places add up to the total
        assert figures["total"] > 1000 and figures["by_place"]["aiohttp"] > 500
        assert abs(sum(figures["by_place"].values()) - figures["total"]) < 1
    assert "treg/call/relay.py" in treg["by_place"] and not any(p.startswith("treg/") for p in base["by_place"])
    assert any(f.startswith("treg/call/relay.py:") and f.endswith(":prepare") for f in treg["by_function"])
    assert "bench/servers.py" in base["by_place"]  # the bare relay's own handler
    assert not any("tracer" in p for p in (*base["by_place"], *treg["by_place"]))  # the tracer counts not itself
    assert "treg / bare relay" in done.stdout
    # the call counted: the platform case's billed call places holds and queues their closes
    assert out["call"] == ("/catalog/call/benchplat.small" if platform else "/call/bench/small")
    money = [p for p in treg["by_place"] if p.startswith("treg/money/")]
    assert bool(money) == platform, money
