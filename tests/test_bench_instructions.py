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


def test_a_tiny_count_of_both_processes():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(CHECKOUT), os.environ.get("PYTHONPATH")]))}
    env.pop("TREG_DATABASE_URL", None)
    done = subprocess.run([sys.executable, "-m", "bench.instructions", "--calls", "50", "--warmup", "20"],
                          capture_output=True, text=True, timeout=900, cwd=CHECKOUT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    for name in ("baseline", "treg"):
        assert out[name]["calls"] == 50 and out[name]["errors"] == 0 and out[name]["statuses"] == {"200": 50}
        assert out[name]["ir_per_call"] > 10_000  # a real count (an HTTP call is hundreds of thousands)
    assert isinstance(out["ir_treg_over_baseline"], float)
    assert "treg / bare relay" in done.stdout
