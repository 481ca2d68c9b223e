"""Slow streams: many long-lived event streams held through treg while short calls go on.

N raw connections each ``GET`` an event stream (``/sse``: one ``data: …`` event a second, as LLM APIs
send) through treg and read it to its end; while all of them are open, short calls are timed at
concurrency 1 against the same short calls timed just before, without the streams. Reported: how
many streams opened and ended whole, the short calls' p50 with and without, and treg's RSS growth
while the streams were held. Bounded: the upstream ends every stream after ``events`` events, every
read has a deadline, and the short calls stop at a count or a time cap.
"""

from __future__ import annotations

import asyncio
import resource
import time
from dataclasses import dataclass, field
from typing import Any

from bench.load import Budget, Sample, pct, raw_load
from bench.procs import proc_mem_kib


def raise_nofile() -> tuple[int, int]:
    """The soft open-file limit up to the hard one (inherited by the servers started afterwards): a
    thousand streams are a thousand sockets here, two thousand in treg (caller and upstream side)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)


@dataclass
class StreamTally:
    opened: int = 0
    first_event: int = 0
    completed: int = 0
    failed: int = 0
    events: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    all_first: asyncio.Event = field(default_factory=asyncio.Event)

    def fail(self, why: str) -> None:
        self.failed += 1
        self.errors[why] = self.errors.get(why, 0) + 1


async def _one_stream(port: int, request: bytes, expect: int, deadline: float, tally: StreamTally,
                      connect_slots: asyncio.Semaphore, total: int) -> None:
    """One event stream, read to its end (chunked framing) with every read bounded by ``deadline``."""
    writer = None
    counted_first = False

    def left() -> float:
        return max(0.1, deadline - time.monotonic())

    try:
        async with connect_slots:  # the listen backlog is finite: connect a few at a time
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), left())
            writer.write(request)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), left())
        status = int(head.split(b" ", 2)[1])
        if status != 200:
            tally.fail(f"status {status}")
            return
        tally.opened += 1
        seen = 0
        while True:
            size = int((await asyncio.wait_for(reader.readuntil(b"\r\n"), left())).split(b";")[0].strip(), 16)
            if size == 0:
                break
            data = await asyncio.wait_for(reader.readexactly(size + 2), left())
            n = data.count(b"data: ")
            seen += n
            tally.events += n
            if n and not counted_first:
                counted_first = True
                tally.first_event += 1
                if tally.first_event + tally.failed >= total:
                    tally.all_first.set()
        if seen >= expect:
            tally.completed += 1
        else:
            tally.fail("short stream")
    except asyncio.TimeoutError:
        tally.fail("timeout")
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, IndexError) as exc:
        tally.fail(type(exc).__name__)
    finally:
        if tally.first_event + tally.failed >= total:
            tally.all_first.set()
        if writer is not None:
            writer.close()


async def slow_streams(port: int, token: str, pid: int, *, streams: int, events: int, short_requests: int,
                       short_cap: float, warmup: int) -> dict[str, Any]:
    headers = f"Host: 127.0.0.1:{port}\r\nX-Treg-Token: {token}\r\n"
    short = f"GET /call/bench/small HTTP/1.1\r\n{headers}Accept: */*\r\n\r\n".encode()
    sse = f"GET /call/bench/sse?events={events}&interval=1 HTTP/1.1\r\n{headers}Accept: text/event-stream\r\n\r\n".encode()

    sent = 0

    async def short_calls(count: int) -> Sample:
        nonlocal sent
        sample, budget = Sample(), Budget(count, short_cap)
        started = time.perf_counter()
        await asyncio.wait_for(raw_load(port, short, 1, budget, sample), short_cap + 30)
        sample.seconds = time.perf_counter() - started
        sent += budget.taken
        return sample

    await short_calls(warmup)
    quiet = await short_calls(short_requests)
    mem0 = proc_mem_kib(pid)

    tally = StreamTally()
    deadline = time.monotonic() + events + 60.0  # a stream lasts ~events seconds; none outlives this
    slots = asyncio.Semaphore(64)
    opened_at = time.perf_counter()
    tasks = [asyncio.create_task(_one_stream(port, sse, events, deadline, tally, slots, streams))
             for _ in range(streams)]
    peak_rss = mem0["VmRSS"]

    async def watch_rss() -> None:
        nonlocal peak_rss
        while not all(t.done() for t in tasks):
            peak_rss = max(peak_rss, proc_mem_kib(pid)["VmRSS"])
            await asyncio.sleep(0.25)

    watcher = asyncio.create_task(watch_rss())
    try:
        await asyncio.wait_for(tally.all_first.wait(), events)
    except asyncio.TimeoutError:
        pass
    all_open_s = time.perf_counter() - opened_at
    held_at_measure = tally.first_event
    busy = await short_calls(short_requests)
    held_after_measure = sum(1 for t in tasks if not t.done())
    rss_while_held = proc_mem_kib(pid)["VmRSS"]
    await asyncio.gather(*tasks)
    await watcher
    mem1 = proc_mem_kib(pid)

    def figures(sample: Sample) -> dict[str, Any]:
        lat = sorted(sample.latencies)
        return {"requests": len(lat), "errors": sample.errors, "seconds": round(sample.seconds, 3),
                "p50_ms": round(pct(lat, 50) * 1000, 3), "p99_ms": round(pct(lat, 99) * 1000, 3)}

    q, b = figures(quiet), figures(busy)
    growth = (max(peak_rss, rss_while_held) - mem0["VmRSS"]) / 1024
    return {
        "streams": streams, "events_per_stream": events, "opened": tally.opened, "first_event": tally.first_event,
        "completed": tally.completed, "failed": tally.failed, "errors": tally.errors, "events": tally.events,
        "seconds_until_all_streaming": round(all_open_s, 3), "held_during_short_calls": held_at_measure,
        "still_open_after_short_calls": held_after_measure,
        "short_calls_sent": sent, "short_without_streams": q, "short_with_streams": b,
        "added_p50_ms": round(b["p50_ms"] - q["p50_ms"], 3),
        "rss_kib_before": mem0["VmRSS"], "rss_kib_peak": max(peak_rss, rss_while_held), "rss_kib_after": mem1["VmRSS"],
        "rss_growth_mib": round(growth, 1),
        # the short calls must have run while every stream was open, or the figure says nothing
        "ok": (tally.completed == streams and held_at_measure == streams and held_after_measure == streams
               and b["errors"] == 0),
    }
