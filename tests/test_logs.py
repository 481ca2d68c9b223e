"""The console log: the same lines as logging's defaults, INFO lines batched only under treg serve."""

import asyncio
import io
import logging

from treg import logs


def _record(level=logging.INFO, msg="GET %s 200", args=("/call/t/x",)):
    return logging.LogRecord("aiohttp.access", level, __file__, 1, msg, args, None)


def test_timestamp_text_matches_loggings_own():
    ours, theirs = logs.Formatter(logs.FORMAT), logging.Formatter(logs.FORMAT)
    for created in (1_796_000_000.123, 1_796_000_000.999, 1_796_000_001.0, 1_796_000_061.5):
        rec = _record()
        rec.created, rec.msecs = created, int((created - int(created)) * 1000)
        assert ours.format(rec) == theirs.format(rec)


def test_undeferred_handler_writes_every_line_at_once():
    out = io.StringIO()
    h = logs.ConsoleHandler(out)
    h.setFormatter(logs.Formatter("%(message)s"))
    h.handle(_record())
    assert out.getvalue() == "GET /call/t/x 200\n"


class _Slow(io.StringIO):
    """A stream that shows only what was flushed (as stderr shows only what was written)."""

    def __init__(self):
        super().__init__()
        self.shown = ""

    def flush(self):
        self.shown = self.getvalue()


async def test_deferred_info_waits_for_the_timer_and_warnings_do_not():
    out = _Slow()
    h = logs.ConsoleHandler(out)
    h.setFormatter(logs.Formatter("%(levelname)s %(message)s"))
    h.defer()
    h.handle(_record())
    h.handle(_record())
    assert out.shown == ""  # buffered: no write per access line
    await asyncio.sleep(logs.FLUSH_INTERVAL_S + 0.2)
    assert out.shown == "INFO GET /call/t/x 200\n" * 2  # written by the timer, nothing lost
    h.handle(_record())
    h.handle(_record(logging.WARNING, "upstream %s failed", ("x",)))
    assert out.shown.endswith("INFO GET /call/t/x 200\nWARNING upstream x failed\n")  # at once, in order
    h.handle(_record())
    h.close()
    assert out.shown.endswith("WARNING upstream x failed\nINFO GET /call/t/x 200\n")  # closing writes the rest


def test_deferred_line_from_a_thread_without_a_loop_is_written_at_once():
    out = _Slow()
    h = logs.ConsoleHandler(out)
    h.setFormatter(logs.Formatter("%(message)s"))
    h.defer()
    h.handle(_record())  # no running loop here
    assert out.shown == "GET /call/t/x 200\n"


def _console_root(handler):
    """Make ``handler`` the only root handler for a test; returns a restore function."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)

    def restore():
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    return restore


def _deferred_console():
    """A deferred console handler (as under treg serve) as the only root handler: (stream, handler, restore)."""
    out = _Slow()
    h = logs.ConsoleHandler(out)
    h.setFormatter(logs.Formatter(logs.FORMAT))
    h.defer()
    return out, h, _console_root(h)


async def test_direct_line_is_the_line_logging_writes():
    out, h, restore = _deferred_console()
    try:
        access = logging.getLogger("aiohttp.access")
        direct = logs.direct_line(access, logging.INFO)
        assert direct is not None
        direct.write("GET /call/t/x 200 5 1.0ms")
        access.info("GET /call/t/x 200 5 1.0ms")
        h.flush()
        ours, theirs = out.shown.splitlines()
        assert ours.split(" ", 2)[2] == theirs.split(" ", 2)[2] == "INFO aiohttp.access: GET /call/t/x 200 5 1.0ms"
        assert len(ours) == len(theirs) and ours[:10] == theirs[:10]  # same timestamp shape
        # anything that could change the record on its way means logging does the work
        access.addFilter(lambda r: True)
        assert logs.direct_line(access, logging.INFO) is None
        access.filters.clear()
        extra = logging.NullHandler()
        logging.getLogger("aiohttp").addHandler(extra)
        assert logs.direct_line(access, logging.INFO) is None
        logging.getLogger("aiohttp").removeHandler(extra)
        h._deferred = False  # not under treg serve
        assert logs.direct_line(access, logging.INFO) is None
    finally:
        restore()


async def test_direct_lines_are_formatted_with_their_batch_in_order_and_bounded():
    out, h, restore = _deferred_console()
    try:
        access = logging.getLogger("aiohttp.access")
        direct = logs.direct_line(access, logging.INFO)
        direct.write("%s %s %s %s %.1fms", ("GET", "/call/t/a", 200, 5, 1.25))
        direct.write("%s %s %s %s %.1fms", ("GET", "/call/t/b", 404, 0, 0.5))
        assert out.getvalue() == ""  # kept, not even formatted yet
        logging.getLogger("treg").warning("after both")
        lines = out.shown.splitlines()
        assert [line.split(": ", 1)[1] for line in lines] == ["GET /call/t/a 200 5 1.2ms", "GET /call/t/b 404 0 0.5ms",
                                                            "after both"]  # in order, before the warning
        for i in range(logs._LINES_MAX):  # a full batch is written without waiting for the timer
            direct.write("%s %s %s %s %.1fms", ("GET", f"/call/t/{i}", 200, 1, 0.1))
        assert out.getvalue().count("\n") == 3 + logs._LINES_MAX and not h._lines
    finally:
        h.close()
        restore()
