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
