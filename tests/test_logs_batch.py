"""The console's batch of access lines is bounded in lines, so formatting one never holds the loop
for long (the c=1 tail, docs/performance.md round 4)."""

from __future__ import annotations

import io
import time

from treg import logs


async def test_access_lines_are_written_in_batches_of_at_most_256():
    out = io.StringIO()
    h = logs.ConsoleHandler(out)
    fmt = logs.Formatter(logs.FORMAT)
    h.setFormatter(fmt)
    h.defer()
    try:
        for i in range(300):
            h.keep_line(fmt, " INFO aiohttp.access: ", "GET %s 200", (f"/call/t/{i}",), time.time())
        # the first 256 were formatted and written as one batch without waiting for the timer; the rest wait
        lines = out.getvalue().splitlines()
        assert len(lines) == 256 and len(h._lines) == 44
        assert lines[0].endswith("INFO aiohttp.access: GET /call/t/0 200")
        assert lines[-1].endswith("GET /call/t/255 200")
        h.flush()
        assert out.getvalue().count("\n") == 300
    finally:
        h.close()
