"""Process bookkeeping: CPU and memory figures from /proc, starting and stopping the servers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

_CLK_TCK = os.sysconf("SC_CLK_TCK")
#: the folder holding ``bench/`` (the checkout)
BENCH_ROOT = str(Path(__file__).resolve().parent.parent)


def proc_cpu_s(pid: int) -> float:
    """The CPU time of a process (all its threads), seconds, to the nanosecond: its CPU-time clock
    (``clock_getcpuclockid``'s id, built as the kernel builds it: the process clock of ``pid``, ``SCHED``
    kind). ``/proc/<pid>/stat`` counts in ticks of 10 ms, so a phase of a few dozen calls on a fast
    machine read 0 or 10 ms, and a CPU figure per call of nothing. Ticks only where the clock is refused."""
    try:
        return time.clock_gettime((~pid << 3) | 2)
    except OSError:
        return sum(proc_cpu_split(pid))


def proc_cpu_split(pid: int) -> tuple[float, float]:
    """(utime, stime) of a process, seconds."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / _CLK_TCK, int(fields[12]) / _CLK_TCK


def proc_mem_kib(pid: int) -> dict[str, int]:
    """VmHWM (peak RSS) and VmRSS of a process, KiB."""
    out = {}
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                out[key] = int(value.split()[0])
    return out


def machine_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs together, from /proc/stat."""
    with open("/proc/stat") as fh:
        parts = [int(x) for x in fh.readline().split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    return sum(parts) - idle, sum(parts)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    name: str
    proc: asyncio.subprocess.Process
    port: int

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def stop(self, timeout: float = 30.0) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()


async def start_helper(kind: str, upstream: str | None = None) -> Server:
    args = [sys.executable, "-m", "bench", "--serve", kind]
    if upstream:
        args += ["--upstream", upstream]
    # ``bench`` is not installed: the helper finds it where this process found it, whatever its cwd
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [BENCH_ROOT, env.get("PYTHONPATH")]))
    proc = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE, env=env)
    assert proc.stdout is not None
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"the {kind} server did not start in 30 s") from None
    if not line.startswith(b"READY "):
        await proc.wait()
        raise RuntimeError(f"the {kind} server failed to start (exit {proc.returncode})")
    return Server(kind, proc, int(line.split()[1]))


async def run_cli(env: dict[str, str], *args: str, timeout: float = 120.0) -> bytes:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "treg", *args, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"treg {' '.join(args)} failed: {err.decode(errors='replace')[-2000:]}")
    return out


async def start_treg(env: dict[str, str], log_path: Path, wrapper: str | None = None) -> Server:
    import aiohttp

    port = int(env["TREG_PORT"])
    log = open(log_path, "ab")
    # a wrapper script (profiling aid) runs in place of ``python -m treg`` and gets the same arguments
    cmd = [sys.executable, wrapper] if wrapper else [sys.executable, "-m", "treg"]
    try:
        proc = await asyncio.create_subprocess_exec(*cmd, "serve", env=env,
                                                    stdout=asyncio.subprocess.DEVNULL, stderr=log)
    finally:
        log.close()
    server = Server("treg", proc, port)
    deadline = time.monotonic() + 90
    async with aiohttp.ClientSession() as s:
        while time.monotonic() < deadline:
            if proc.returncode is not None:
                break
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with s.get(f"http://127.0.0.1:{port}/healthz") as r:
                    if r.status == 200:
                        return server
            await asyncio.sleep(0.2)
    await server.stop()
    tail = log_path.read_text(errors="replace")[-3000:] if log_path.exists() else ""
    raise RuntimeError(f"treg serve did not become healthy (exit {proc.returncode}); log tail:\n{tail}")
