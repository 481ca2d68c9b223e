"""Load generation: bounded request budgets and the two load generators."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field


class Budget:
    """Hands out request slots until the count or the time cap is exhausted (every loop stops)."""

    def __init__(self, count: int, seconds: float) -> None:
        self.left = count
        self.taken = 0
        self.deadline = time.monotonic() + seconds

    def take(self) -> bool:
        if self.left <= 0 or time.monotonic() >= self.deadline:
            return False
        self.left -= 1
        self.taken += 1
        return True


@dataclass
class Sample:
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    statuses: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bool]:
    """Read one HTTP/1.1 response (Content-Length or chunked); (status, connection closes)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1])
    length = None
    chunked = close = False
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        lname = name.strip().lower()
        if lname == b"content-length":
            length = int(value)
        elif lname == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
        elif lname == b"connection" and b"close" in value.lower():
            close = True
    if chunked:
        while True:
            size = int(((await reader.readuntil(b"\r\n")).split(b";")[0]).strip(), 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":
                    pass
                break
            await reader.readexactly(size + 2)
    elif length:
        await reader.readexactly(length)
    elif length is None:
        await reader.read()  # framed by close
        close = True
    return status, close


async def raw_load(port: int, request: bytes, concurrency: int, budget: Budget, sample: Sample) -> None:
    """The default load generator: ``concurrency`` keep-alive connections, one request in flight on
    each, a pre-built request, minimal parsing — so the generator costs little CPU per request."""
    clock = time.perf_counter

    async def worker() -> None:
        reader = writer = None
        try:
            while budget.take():
                if writer is None:
                    reader, writer = await asyncio.open_connection("127.0.0.1", port)
                t0 = clock()
                try:
                    writer.write(request)
                    status, close = await _read_response(reader)  # type: ignore[arg-type]
                except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
                    sample.errors += 1
                    writer.close()
                    reader = writer = None
                    continue
                sample.latencies.append(clock() - t0)
                sample.statuses[status] = sample.statuses.get(status, 0) + 1
                if not 200 <= status < 300:
                    sample.errors += 1
                if close:
                    writer.close()
                    reader = writer = None
        finally:
            if writer is not None:
                writer.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def aiohttp_load(port: int, path: str, headers: dict[str, str], concurrency: int, budget: Budget,
                       sample: Sample) -> None:
    """aiohttp's client as the load generator (connector limit = concurrency), for cross-checking."""
    import aiohttp

    clock = time.perf_counter
    url = f"http://127.0.0.1:{port}{path}"
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
        async def worker() -> None:
            while budget.take():
                t0 = clock()
                try:
                    async with session.get(url, headers=headers) as resp:
                        await resp.read()
                        status = resp.status
                except (aiohttp.ClientError, OSError):
                    sample.errors += 1
                    continue
                sample.latencies.append(clock() - t0)
                sample.statuses[status] = sample.statuses.get(status, 0) + 1
                if not 200 <= status < 300:
                    sample.errors += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def pct(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile of an ascending list (0 when empty)."""
    if not sorted_values:
        return 0.0
    k = max(0, min(len(sorted_values) - 1, math.ceil(p / 100 * len(sorted_values)) - 1))
    return sorted_values[k]
