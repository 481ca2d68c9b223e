"""The access sink's batch of lines is bounded in lines, so formatting one never holds the loop
for long (the c=1 tail, docs/performance.md round 4)."""

from __future__ import annotations

import io
import time

from treg import logs
from treg.web.access_log import AccessSink


async def test_access_lines_are_written_in_batches_of_at_most_256():
    out = io.StringIO()
    console = logs.Console(out)
    console.defer()
    sink = AccessSink(console)
    try:
        for i in range(300):
            sink.add((time.time(), "GET", f"/call/t/{i}", 200, 0, 0.0, None, None, None))
        # the first 256 were formatted and written as one batch without waiting for the timer; the rest wait
        lines = out.getvalue().splitlines()
        assert len(lines) == 256 and len(sink._kept) == 44
        assert lines[0].endswith("INFO aiohttp.access: GET /call/t/0 200 0 0.0ms")
        assert lines[-1].endswith("GET /call/t/255 200 0 0.0ms")
        console.flush()
        assert out.getvalue().count("\n") == 300
    finally:
        console.close()
