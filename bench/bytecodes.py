"""``python -m bench.bytecodes``: the bytecodes each Python function runs per call, in treg and in the
bare relay, side by side.

``python -m bench.instructions`` says how much more treg costs than the bare relay; this says where. Each
relay runs under a tracer (``sys.settrace`` with ``f_trace_opcodes``, started after ``--warmup`` requests,
stopped after ``--calls`` more) that counts the bytecodes every code object executes; the counts are
divided by the calls and grouped by function and by package (treg's modules, aiohttp, asyncio, ...). The
same upstream, load generator and call as ``bench.instructions`` (``GET /call/bench/small``, a header
binding, auditing and the access log on), at concurrency 32; ``--platform``: the platform case's billed
call instead (``GET /catalog/call/benchplat.small``, a hold and its close each call).

What it cannot show: the work of C code (a dict lookup, a regex search, psycopg2) is not a bytecode,
and one bytecode can cost ten instructions or a thousand. So it points at the Python functions that
run per call, and how much of each, and ``bench.instructions`` decides whether removing one paid
(docs/performance.md, round 13, where it found ``ClientSession._request`` as the largest function of a
call). Tracing slows each process down about twentyfold, which changes nothing it counts.

Bounded: a fixed number of calls, every wait with a deadline, everything on 127.0.0.1, every process
stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.instructions import wait_http
from bench.load import Budget, Sample, raw_load
from bench import platform_case
from bench.one_call import one_call
from bench.procs import BENCH_ROOT
from bench.through_treg import setup_treg_data

#: run as ``python <this file's TRACER> <the program's argv>``: counts between two request numbers
TRACER = '''
import collections, json, os, runpy, sys
counts = collections.Counter()
start, stop, out = int(os.environ["BYTECODES_START"]), int(os.environ["BYTECODES_STOP"]), os.environ["BYTECODES_OUT"]
def local(frame, event, arg):
    if event == "opcode":
        counts[frame.f_code] += 1
    return local
def traced(frame, event, arg):
    frame.f_trace_opcodes = True
    frame.f_trace_lines = False
    return local
from aiohttp import web_app
seen = [0]
handle = web_app.Application._handle
async def _handle(self, request):
    seen[0] += 1
    if seen[0] == start:
        sys.settrace(traced)
    elif seen[0] == stop:
        sys.settrace(None)
        found = collections.Counter()
        for code, n in counts.items():
            if code.co_filename == __file__:
                continue  # this tracer's own _handle
            name = code.co_qualname
            if code.co_filename.startswith("<"):  # a generated __init__ or __new__: named by its fields
                name += "(" + ", ".join(code.co_varnames[1:4]) + ", ...)"
            found[f"{code.co_filename}:{code.co_firstlineno}:{name}"] += n
        with open(out, "w") as fh:
            json.dump(found, fh)
    return await handle(self, request)
web_app.Application._handle = _handle
sys.argv = sys.argv[1:]
if sys.argv[0] == "-m":
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    runpy.run_path(sys.argv[0], run_name="__main__")
'''
#: the longest a traced process may take to start or to answer its calls
WAIT_S = 300.0
#: the functions kept in the JSON, largest first (the rest are a long tail of a bytecode or less)
FUNCTIONS_KEPT = 300


def where(path: str) -> str:
    """A code object's file as a short place: ``treg/call/relay.py``, a package's name, ``asyncio``…"""
    if "/site-packages/" in path:
        return path.split("/site-packages/", 1)[1].split("/", 1)[0]
    for top in ("treg", "plugins", "bench"):
        marker = f"{os.sep}{top}{os.sep}"
        if marker in path and path.startswith(BENCH_ROOT):
            return top + "/" + path.split(marker, 1)[1]
    if path.startswith("<"):
        return "generated (dataclasses, namedtuples)"
    return Path(path).parent.name if Path(path).parent.name == "asyncio" else Path(path).name


def per_call(counts: dict[str, int], calls: int) -> dict[str, Any]:
    """The counts per call: in all, by place (file or package), by function (``place:line:name``)."""
    by_place: collections.Counter[str] = collections.Counter()
    by_function: collections.Counter[str] = collections.Counter()
    for key, n in counts.items():
        path, line, name = key.rsplit(":", 2)
        by_place[where(path)] += n
        by_function[f"{where(path)}:{line}:{name}"] += n
    return {"calls": calls, "total": round(sum(counts.values()) / calls, 1),
            "by_place": {k: round(v / calls, 1) for k, v in by_place.most_common()},
            "by_function": {k: round(v / calls, 1) for k, v in by_function.most_common(FUNCTIONS_KEPT)}}


async def count(cmd: list[str], env: dict[str, str], port: int, health: str, request: bytes, out: Path, *,
                warmup: int, calls: int, before: Any = None) -> dict[str, Any]:
    env = dict(env, BYTECODES_START=str(warmup + 1), BYTECODES_STOP=str(warmup + calls + 1), BYTECODES_OUT=str(out))
    tracer = out.with_suffix(".tracer.py")
    tracer.write_text(TRACER)
    proc = subprocess.Popen([sys.executable, str(tracer), *cmd], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        await wait_http(port, health, proc)
        if before is not None:
            await before()
        done = Sample()
        # the health check and the set-up were requests too: the warm-up tops them up to ``warmup``
        await raw_load(port, request, 32, Budget(warmup + calls + 1, WAIT_S), done)
        for _ in range(int(WAIT_S / 0.1)):
            if out.exists():
                break
            await asyncio.sleep(0.1)
        else:
            raise RuntimeError(f"{cmd[-1]}: no counts written within {WAIT_S:.0f} s")
        return per_call(json.loads(out.read_text()), calls)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def measure(opts: argparse.Namespace) -> dict[str, Any]:
    async with one_call("treg-bench-bytecodes-") as call:
        out: dict[str, Any] = {"warmup": opts.warmup, "concurrency": 32,
                               "call": platform_case.PATH if opts.platform else "/call/bench/small"}
        out["baseline"] = await count(call.baseline_cmd, call.env, call.baseline_port, "/small", call.baseline_request,
                                      call.tmp / "baseline.json", warmup=opts.warmup, calls=opts.calls)
        env, token, request = await call.treg_case("bench-bc", platform=opts.platform)

        async def data() -> None:
            await setup_treg_data(call.treg_port, token, call.upstream)

        out["treg"] = await count(["-m", "treg", "serve"], env, call.treg_port, "/healthz", request,
                                  call.tmp / "treg.json", warmup=opts.warmup, calls=opts.calls, before=data)
        return out


def report(out: dict[str, Any], top: int) -> str:
    b, t = out["baseline"], out["treg"]
    lines = [f"bytecodes per call of {out['call']} at concurrency 32: bare relay {b['total']:,.0f}, treg {t['total']:,.0f} "
             f"(treg / bare relay {t['total'] / b['total']:.2f})", "", f"{'place':58s} {'bare':>8s} {'treg':>8s}"]
    places = sorted(set(b["by_place"]) | set(t["by_place"]), key=lambda p: -t["by_place"].get(p, 0))
    for place in places[:top]:
        lines.append(f"{place[:58]:58s} {b['by_place'].get(place, 0):8.0f} {t['by_place'].get(place, 0):8.0f}")
    lines += ["", f"treg's {top} largest functions (bytecodes per call; the bare relay's figure where it runs it)"]
    for fn, n in list(t["by_function"].items())[:top]:
        lines.append(f"{n:8.0f} {b['by_function'].get(fn, 0):8.0f}  {fn}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bytecodes", description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=500, help="calls counted per relay (default 500)")
    p.add_argument("--warmup", type=int, default=400, help="calls before counting (default 400)")
    p.add_argument("--top", type=int, default=40, help="rows of each table (default 40)")
    p.add_argument("--platform", action="store_true",
                   help="count the platform case's billed call (bench/platform_case.py) instead of the own tool's")
    opts = p.parse_args(argv)
    out = asyncio.run(measure(opts))
    print(report(out, opts.top))
    with contextlib.suppress(BrokenPipeError):
        print(json.dumps(out, separators=(",", ":")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
