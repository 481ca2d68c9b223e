"""What the run does through treg's management API and its call surface."""

from __future__ import annotations

import json
import secrets as pysecrets
import time
from typing import Any, AsyncIterator

from bench.servers import MiB, STREAM_CHUNK


async def stream_through(port: int, token: str, total: int, timeout: float) -> dict[str, Any]:
    """512 MiB (or ``total``) up and down through treg; returns seconds and byte counts."""
    import aiohttp

    block = b"u" * STREAM_CHUNK

    async def gen() -> AsyncIterator[bytes]:
        left = total
        while left > 0:
            n = min(left, STREAM_CHUNK)
            yield block if n == STREAM_CHUNK else block[:n]
            left -= n

    out: dict[str, Any] = {"bytes": total}
    headers = {"X-Treg-Token": token}
    timeout_cfg = aiohttp.ClientTimeout(total=timeout)
    async with aiohttp.ClientSession(timeout=timeout_cfg, auto_decompress=False) as s:
        t0 = time.perf_counter()
        async with s.post(f"http://127.0.0.1:{port}/call/bench/sink", data=gen(),
                          headers={**headers, "Content-Length": str(total),
                                   "Content-Type": "application/octet-stream"}) as r:
            body = await r.read()
            out["upload_status"] = r.status
            try:
                out["upload_received"] = json.loads(body).get("received")
            except ValueError:
                out["upload_received"] = None
        out["upload_s"] = round(time.perf_counter() - t0, 3)
        t0 = time.perf_counter()
        got = 0
        async with s.get(f"http://127.0.0.1:{port}/call/bench/stream?bytes={total}", headers=headers) as r:
            out["download_status"] = r.status
            async for chunk in r.content.iter_chunked(STREAM_CHUNK):
                got += len(chunk)
        out["download_received"] = got
        out["download_s"] = round(time.perf_counter() - t0, 3)
    for way in ("upload", "download"):
        secs = out[f"{way}_s"] or 1e-9
        out[f"{way}_mib_s"] = round(total / MiB / secs, 1)
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
