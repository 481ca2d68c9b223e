"""The console log: the same lines as logging's defaults, INFO lines batched only under treg serve."""

import asyncio
import io
import json
import logging
import sys
import time

from treg import logs
from treg.web import access_log
from treg.web.access_log import AccessSink, fields


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


def _deferred_console(formatter=None):
    """A deferred console handler (as under treg serve) as the only root handler: (stream, handler, restore)."""
    out = _Slow()
    h = logs.ConsoleHandler(out)
    h.setFormatter(formatter or logs.Formatter(logs.FORMAT))
    h.defer()
    return out, h, _console_root(h)


def _entry(path="/call/t/x", status=200, size=5, seconds=0.001, call_id=None, caller=None, client=None):
    return (time.time(), "GET", path, status, size, seconds, call_id, caller, client)


async def test_access_sink_line_is_the_line_logging_writes():
    out, h, restore = _deferred_console()
    try:
        sink = AccessSink(h.console)
        sink.add(_entry())
        logging.getLogger("aiohttp.access").info("GET /call/t/x 200 5 1.0ms")
        h.flush()
        ours, theirs = out.shown.splitlines()
        assert ours.split(" ", 2)[2] == theirs.split(" ", 2)[2] == "INFO aiohttp.access: GET /call/t/x 200 5 1.0ms"
        assert len(ours) == len(theirs) and ours[:10] == theirs[:10]  # same timestamp shape
    finally:
        h.close()
        restore()


async def test_access_sink_json_line_is_the_record_json_formatter_writes():
    out, h, restore = _deferred_console(logs.JsonFormatter())
    try:
        sink = AccessSink(h.console, "json")
        caller = ("org_1", None)
        sink.add(_entry("/api/v1/me", 401, 0, 0.00025, "call_9", caller, "203.0.113.5"))
        record = logging.makeLogRecord({"name": "aiohttp.access", "levelno": logging.INFO, "levelname": "INFO",
                                        "msg": "GET /api/v1/me 401 0 0.2ms"})
        setattr(record, logs.EXTRA_FIELDS, fields("GET", "/api/v1/me", 401, 0, 0.00025, "call_9", caller,
                                                  "203.0.113.5"))
        logging.getLogger("aiohttp.access").handle(record)
        h.flush()
        ours, theirs = (json.loads(line) for line in out.shown.splitlines())
        assert ours.pop("ts")[:16] == theirs.pop("ts")[:16]
        assert ours == theirs == {"level": "INFO", "logger": "aiohttp.access", "msg": "GET /api/v1/me 401 0 0.2ms",
                                  "call_id": "call_9", "org_id": "org_1", "member_id": None, "surface": "api",
                                  "method": "GET", "path": "/api/v1/me", "status": 401, "bytes": 0,
                                  "duration_ms": 0.2, "client": "203.0.113.5"}
    finally:
        h.close()
        restore()


async def test_access_lines_are_formatted_with_their_batch_in_order_and_bounded():
    out, h, restore = _deferred_console()
    try:
        sink = AccessSink(h.console)
        sink.add(_entry("/call/t/a", 200, 5, 0.00125))
        sink.add(_entry("/call/t/b", 404, 0, 0.0005))
        assert out.getvalue() == ""  # kept, not even formatted yet
        logging.getLogger("treg").warning("after both")
        lines = out.shown.splitlines()
        assert [line.split(": ", 1)[1] for line in lines] == ["GET /call/t/a 200 5 1.2ms", "GET /call/t/b 404 0 0.5ms",
                                                            "after both"]  # in order, before the warning
        for i in range(access_log.LINES_MAX):  # a full batch is written without waiting for the timer
            sink.add(_entry(f"/call/t/{i}", 200, 1, 0.0001))
        assert out.getvalue().count("\n") == 3 + access_log.LINES_MAX and sink.take() == ""
    finally:
        h.close()
        restore()


def test_configure_leaves_loggings_process_wide_switches_alone(monkeypatch):
    """The access sink does its own formatting: nothing else in the process pays for it."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    switches, level = (logging.logThreads, logging.logProcesses, logging.logMultiprocessing), root.level
    handler = logs.configure("INFO", "text")
    try:
        assert handler is not None and logs.console() is handler.console
        assert (logging.logThreads, logging.logProcesses, logging.logMultiprocessing) == switches == (True, True, True)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
