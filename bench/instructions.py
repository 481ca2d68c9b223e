"""``python -m bench.instructions``: instructions per call of treg and of the bare relay, counted by valgrind.

The throughput figures of ``python -m bench`` move ±15 % from round to round on a shared machine (other
load, the CPU's clock); this instrument does not: it runs the bare relay (bench/servers.py
``baseline_app``) and ``treg serve`` each under callgrind (``--instr-atstart=no``: startup runs
uninstrumented), warms each up with ``--warmup`` calls at concurrency 32, then counts the instructions
(Ir) the process executes for ``--calls`` calls (``callgrind_control -i on``, the calls, a dump) and
divides. Same upstream, same load generator, same call as the benchmark's tail part
(``GET /call/bench/small``, a header binding, auditing and the access log on; ``--platform``: the platform
case's billed call instead, ``GET /catalog/call/benchplat.small``). The ratio of the two is
treg's cost per call against the bare relay's, repeatable to about ±0.5 % (docs/performance.md, round
6). It leaves out what instructions cannot show: system calls' time in the kernel and the CPU's cache
misses (round 3), so it complements the benchmark's CPU figures, never replaces them.
``--functions N`` lists each process's N largest functions by their own instructions per call
(``callgrind_annotate``): where the C work goes (a Python function shows as the interpreter's C
functions it ran in; ``python -m bench.bytecodes`` names those).

Needs ``valgrind`` (Debian: ``apt-get install valgrind``). Bounded: every wait has a deadline, the load
is a fixed number of calls, everything runs on 127.0.0.1 and is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.load import Budget, Sample, raw_load
from bench.one_call import one_call
from bench.through_treg import setup_treg_data

CALLGRIND = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--dump-instr=no"]
#: the longest a process may take to start under valgrind
START_S = 300.0
def total_ir(dump: Path) -> int:
    for line in dump.read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no instruction total in {dump}")


async def wait_http(port: int, path: str, proc: subprocess.Popen[bytes]) -> None:
    import aiohttp

    deadline = time.monotonic() + START_S
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the process exited ({proc.returncode}) before it served")
            with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError):
                async with s.get(f"http://127.0.0.1:{port}{path}") as r:
                    await r.read()
                    return
            await asyncio.sleep(0.5)
    raise RuntimeError(f"nothing served on port {port} within {START_S:.0f} s")


def by_function(dump: Path, top: int) -> list[tuple[int, str]]:
    """The ``top`` functions of a dump by their own instructions (``callgrind_annotate``: C functions by
    name, Python's by the interpreter's C function they ran in), largest first, as (Ir, function)."""
    done = subprocess.run(["callgrind_annotate", "--inclusive=no", "--threshold=100", str(dump)],
                          capture_output=True, text=True, timeout=300, check=True)
    rows: list[tuple[int, str]] = []
    for line in done.stdout.splitlines():
        parts = line.strip().split(None, 1)
        if len(parts) == 2 and parts[0].replace(",", "").isdigit() and not parts[1].startswith("PROGRAM"):
            rows.append((int(parts[0].replace(",", "")), parts[1].split(" [", 1)[0].strip()))
    return sorted(rows, reverse=True)[:top]


async def count(proc: subprocess.Popen[bytes], port: int, request: bytes, outdir: Path, *, warmup: int,
                calls: int, functions: int = 0) -> dict[str, Any]:
    """Instructions of ``proc`` per call for ``calls`` calls at concurrency 32, after ``warmup`` calls
    (``functions``: also the largest that many functions, per call)."""
    warm = Sample()
    await raw_load(port, request, 32, Budget(warmup, START_S), warm)
    subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], check=True, capture_output=True, timeout=60)
    sample = Sample()
    await raw_load(port, request, 32, Budget(calls, START_S), sample)
    await asyncio.sleep(0.5)  # treg's audit writer writes these calls' batch (a part of their cost)
    subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True, timeout=120)
    subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], check=True, capture_output=True, timeout=60)
    dumps = sorted(outdir.glob(f"cg.{proc.pid}.*"), key=lambda p: p.stat().st_mtime)
    if not dumps:
        raise RuntimeError("callgrind wrote no dump")
    done = len(sample.latencies)
    out = {"calls": done, "errors": sample.errors, "statuses": {str(k): v for k, v in sample.statuses.items()},
           "ir_per_call": round(total_ir(dumps[-1]) / done) if done else None}
    if functions and done:
        out["functions"] = [[round(ir / done), name] for ir, name in by_function(dumps[-1], functions)]
    out["dump"] = str(dumps[-1])
    return out


async def measure(opts: argparse.Namespace) -> dict[str, Any]:
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("bench.instructions needs valgrind (Debian: apt-get install valgrind)")
    procs: list[subprocess.Popen[bytes]] = []
    async with one_call("treg-bench-ir-") as call:
        outdir = call.tmp / "callgrind"
        outdir.mkdir()
        try:
            base = subprocess.Popen([*CALLGRIND, f"--callgrind-out-file={outdir}/cg.%p", sys.executable,
                                     *call.baseline_cmd], env=call.env, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            procs.append(base)
            env, token, request = await call.treg_case("bench-ir", platform=opts.platform)
            log = open(call.tmp / "treg.log", "wb")
            try:
                treg = subprocess.Popen([*CALLGRIND, f"--callgrind-out-file={outdir}/cg.%p", sys.executable, "-m",
                                         "treg", "serve"], env=env, stdout=subprocess.DEVNULL, stderr=log)
            finally:
                log.close()
            procs.append(treg)
            await wait_http(call.baseline_port, "/small", base)
            await wait_http(call.treg_port, "/healthz", treg)
            await setup_treg_data(call.treg_port, token, call.upstream)
            out: dict[str, Any] = {"calls": opts.calls, "warmup": opts.warmup, "concurrency": 32,
                                   "call": request.split(b" ", 2)[1].decode()}
            out["baseline"] = await count(base, call.baseline_port, call.baseline_request, outdir, warmup=opts.warmup,
                                          calls=opts.calls, functions=opts.functions)
            out["treg"] = await count(treg, call.treg_port, request, outdir, warmup=opts.warmup, calls=opts.calls,
                                      functions=opts.functions)
            b, t = out["baseline"]["ir_per_call"], out["treg"]["ir_per_call"]
            out["ir_treg_over_baseline"] = round(t / b, 3) if b and t else None
            if opts.keep_dumps:  # for callgrind_annotate --tree=caller, or kcachegrind
                keep = Path(opts.keep_dumps)
                keep.mkdir(parents=True, exist_ok=True)
                for who in ("baseline", "treg"):
                    out[who]["dump"] = str(shutil.copy(out[who]["dump"], keep / f"{who}.callgrind"))
            else:
                for who in ("baseline", "treg"):
                    del out[who]["dump"]  # gone with the run's folder
            return out
        finally:
            for p in procs:
                with contextlib.suppress(ProcessLookupError):
                    p.terminate()
            for p in procs:
                try:
                    p.wait(60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=1000, help="calls counted per process (default 1000)")
    p.add_argument("--warmup", type=int, default=400, help="calls before counting (default 400)")
    p.add_argument("--platform", action="store_true",
                   help="count the platform case's billed call (bench/platform_case.py) instead of the own tool's")
    p.add_argument("--functions", type=int, default=0, metavar="N",
                   help="also list each process's N largest functions by their own instructions per call")
    p.add_argument("--keep-dumps", metavar="DIR",
                   help="copy the two callgrind dumps (baseline.callgrind, treg.callgrind) into DIR")
    opts = p.parse_args(argv)
    out = asyncio.run(measure(opts))
    print(f"instructions per call of {out['call']} at concurrency 32 ({out['calls']} calls after {out['warmup']}): "
          f"bare relay {out['baseline']['ir_per_call']:,}, treg {out['treg']['ir_per_call']:,}; "
          f"treg / bare relay {out['ir_treg_over_baseline']}")
    for who in ("baseline", "treg") if opts.functions else ():
        print(f"\n{who}'s {opts.functions} largest functions (own instructions per call):")
        for ir, name in out[who]["functions"]:
            print(f"{ir:9,} {name}")
    print(json.dumps(out, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
