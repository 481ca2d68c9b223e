"""The access sink's batch of lines is bounded in lines, so formatting one never holds the loop
for long (the c=1 tail, docs/performance.md round 4)."""

from __future__ import annotations

import io
import time

from treg import logs
from treg.web.access_log import LINES_MAX, AccessSink


def test_a_batch_holds_the_loop_briefly():
    # a full batch is formatted inside the request callback that fills it (docs/performance.md round 8)
    assert 16 <= LINES_MAX <= 64


async def test_access_lines_are_written_in_batches_of_at_most_lines_max():
    out = io.StringIO()
    console = logs.Console(out)
    console.defer()
    sink = AccessSink(console)
    total = 9 * LINES_MAX + 5
    try:
        for i in range(total):
            sink.add((time.time(), "GET", f"/call/t/{i}", 200, 0, 0.0, None, None, None))
        # every full batch was formatted and written without waiting for the timer; the rest wait
        lines = out.getvalue().splitlines()
        assert len(lines) == 9 * LINES_MAX and len(sink._kept) == 5
        assert lines[0].endswith("INFO aiohttp.access: GET /call/t/0 200 0 0.0ms")
        assert lines[-1].endswith(f"GET /call/t/{9 * LINES_MAX - 1} 200 0 0.0ms")
        console.flush()
        assert out.getvalue().count("\n") == total
    finally:
        console.close()



def test_a_drain_at_the_worst_moment_loses_no_line():
    """The loop appends without the console's lock, and an executor's log line may drain the sink from another
    thread at any moment, even between the loop's look at the kept lines and its append. Here that drain runs
    right there, before every append: every line is still written exactly once, in order (a list taken
    whole by the drain lost the line appended to it just after)."""
    from collections import deque

    out = io.StringIO()
    console = logs.Console(out)
    console.defer()
    sink = AccessSink(console)

    class DrainedFirst(deque):
        def append(self, entry):
            console.write("another thread's line\n")  # drains the sink, then writes its own line
            super().append(entry)

    sink._kept = DrainedFirst()
    total = 3 * LINES_MAX + 7
    try:
        for i in range(total):
            sink.add((time.time(), "GET", f"/call/t/{i}", 200, 0, 0.0, None, None, None))
        console.flush()
        paths = [line.split(" ")[-4] for line in out.getvalue().splitlines() if "aiohttp.access" in line]
        assert paths == [f"/call/t/{i}" for i in range(total)]
    finally:
        console.close()
