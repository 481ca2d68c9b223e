"""What the run does through treg's management API and its call surface, and the large transfers."""

from __future__ import annotations

import json
import secrets as pysecrets
import time
from typing import Any, AsyncIterator

from bench.servers import MiB, STREAM_CHUNK


async def stream_through(port: int, prefix: str, headers: dict[str, str], total: int, timeout: float,
                         relay_pid: int | None = None) -> dict[str, Any]:
    """512 MiB (or ``total``) up and down through a relay (``prefix``: ``/call/bench`` for treg, empty for
    the bare relay); seconds, byte counts and, with ``relay_pid``, the CPU seconds that process spent
    on each transfer (utime + stime of ``/proc/<pid>/stat``)."""
    import aiohttp

    from bench.procs import proc_cpu_split

    block = b"u" * STREAM_CHUNK

    async def gen() -> AsyncIterator[bytes]:
        left = total
        while left > 0:
            n = min(left, STREAM_CHUNK)
            yield block if n == STREAM_CHUNK else block[:n]
            left -= n

    def cpu() -> tuple[float, float]:
        return proc_cpu_split(relay_pid) if relay_pid else (0.0, 0.0)

    def spent(way: str, before: tuple[float, float]) -> None:
        after = cpu()
        out[f"{way}_cpu_s"] = round(after[0] - before[0] + after[1] - before[1], 3)
        out[f"{way}_sys_s"] = round(after[1] - before[1], 3)  # the kernel's share (socket copies)

    out: dict[str, Any] = {"bytes": total}
    timeout_cfg = aiohttp.ClientTimeout(total=timeout)
    async with aiohttp.ClientSession(timeout=timeout_cfg, auto_decompress=False) as s:
        c0, t0 = cpu(), time.perf_counter()
        async with s.post(f"http://127.0.0.1:{port}{prefix}/sink", data=gen(),
                          headers={**headers, "Content-Length": str(total),
                                   "Content-Type": "application/octet-stream"}) as r:
            body = await r.read()
            out["upload_status"] = r.status
            try:
                out["upload_received"] = json.loads(body).get("received")
            except ValueError:
                out["upload_received"] = None
        out["upload_s"] = round(time.perf_counter() - t0, 3)
        spent("upload", c0)
        c0, t0 = cpu(), time.perf_counter()
        got = 0
        async with s.get(f"http://127.0.0.1:{port}{prefix}/stream?bytes={total}", headers=headers) as r:
            out["download_status"] = r.status
            async for chunk in r.content.iter_chunked(STREAM_CHUNK):
                got += len(chunk)
        out["download_received"] = got
        out["download_s"] = round(time.perf_counter() - t0, 3)
        spent("download", c0)
    gib = total / (1024 * MiB)
    for way in ("upload", "download"):
        secs = out[f"{way}_s"] or 1e-9
        out[f"{way}_mib_s"] = round(total / MiB / secs, 1)
        out[f"{way}_cpu_s_per_gib"] = round(out[f"{way}_cpu_s"] / gib, 3) if relay_pid else None
    out["ok"] = (out["upload_status"] == 200 and out["download_status"] == 200
                 and out["upload_received"] == total and out["download_received"] == total)
    return out


async def setup_treg_data(port: int, token: str, upstream_url: str) -> None:
    import aiohttp

    h = {"X-Treg-Token": token}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        async with s.post(f"http://127.0.0.1:{port}/api/v1/secrets", headers=h,
                          json={"name": "bench-key", "value": "sk_bench_" + pysecrets.token_hex(16)}) as r:
            if r.status != 201:
                raise RuntimeError(f"creating the secret failed: {r.status} {await r.text()}")
            secret_id = (await r.json())["id"]
        tool = {"name": "bench", "base_url": upstream_url,
                "bindings": [{"location": "header", "name": "Authorization", "format": "Bearer {secret}",
                              "secret_id": secret_id}]}
        async with s.post(f"http://127.0.0.1:{port}/api/v1/tools", headers=h, json=tool) as r:
            if r.status != 201:
                raise RuntimeError(f"creating the tool failed: {r.status} {await r.text()}")
