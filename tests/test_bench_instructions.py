"""``python -m bench.instructions`` counts instructions per call of the bare relay and of treg under
valgrind, in a tiny bounded run (50 calls each), and prints both and their ratio. Nothing here asserts
on speed: only that each process answered every call and was counted.

Skipped where valgrind is missing (.ci/run installs it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CHECKOUT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")


@pytest.mark.parametrize("platform", [False, True], ids=["own-tool", "platform"])
def test_a_tiny_count_of_both_processes(platform):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(CHECKOUT), os.environ.get("PYTHONPATH")]))}
    env.pop("TREG_DATABASE_URL", None)
    extra = ["--platform", "--functions", "5"] if platform else []
    done = subprocess.run([sys.executable, "-m", "bench.instructions", "--calls", "50", "--warmup", "20", *extra],
                          capture_output=True, text=True, timeout=900, cwd=CHECKOUT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("baseline", "treg"):
        assert out[name]["calls"] == 50 and out[name]["errors"] == 0 and out[name]["statuses"] == {"200": 50}
        assert out[name]["ir_per_call"] > 10_000  # a real count (an HTTP call is hundreds of thousands)
    assert isinstance(out["ir_treg_over_baseline"], float)
    assert "treg / bare relay" in done.stdout
    assert out["call"] == ("/catalog/call/benchplat.small" if platform else "/call/bench/small")
    if platform:  # each process's largest functions, by their own instructions per call, largest first
        for name in ("baseline", "treg"):
            functions = out[name]["functions"]
            assert len(functions) == 5 and all(isinstance(n, str) and n for _, n in functions)
            assert [ir for ir, _ in functions] == sorted((ir for ir, _ in functions), reverse=True)
        assert "treg's 5 largest functions" in done.stdout
