"""The console log of the CLI and ``treg serve``: one handler on stderr, cheap enough for an access
line per request.

Through logging's defaults each access line cost ~50 µs of a ~490 µs call under load
(docs/performance.md): a flushed ``write`` per line (stderr is line-buffered), the timestamp
formatted by ``strftime`` for every record, and thread and process names looked up for a format
that shows neither. Here:

* the timestamp text is formatted once per second;
* records skip the thread and process lookups (the format has no field for them);
* under ``treg serve`` (:meth:`ConsoleHandler.defer`) lines at INFO and below collect in a 64 KiB
  buffer written when it fills, at most ``FLUSH_INTERVAL_S`` after a line came in, and at shutdown;
  a WARNING or worse writes everything at once. A process killed outright loses at most that
  interval of INFO lines; the durable record of every call is the audit table, not this log.

``TREG_LOG_FORMAT=json`` (:class:`JsonFormatter`) makes every stderr line one JSON object (``ts``,
``level``, ``logger``, ``msg``; an access line adds its call's fields), for log shippers that would
otherwise split a traceback into lines. Neither format ever carries a token, secret, body or query
string: the access line is built from the method, the path without its query and the call's ids.
"""

from __future__ import annotations

import asyncio
import io
import logging
import sys
import time
from contextvars import ContextVar
from typing import IO, Any

import orjson

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: the values of ``TREG_LOG_FORMAT``
FORMATS = ("text", "json")
#: the attribute of a LogRecord carrying fields of its own (a dict; an access line's call fields) for ``json``
EXTRA_FIELDS = "treg_fields"
#: (org_id, member_id) of the token the current request was admitted with, for its access line. Set
#: where treg.tenancy admits a token; read by the access logger, which aiohttp runs in the request's
#: own task (a fresh copy of the context per request, so no value leaks into the next request).
CALLER: ContextVar[tuple[str, str | None] | None] = ContextVar("treg_caller", default=None)
#: how long an INFO line may wait in the buffer under ``treg serve``
FLUSH_INTERVAL_S = 0.5
_BUFFER = 64 * 1024
#: at most this many access lines wait unformatted (a bound on memory between two timer flushes)
_LINES_MAX = 2048


class Formatter(logging.Formatter):
    """logging's default ``asctime`` (``2026-11-30 07:00:00,123``), its text made once per second."""

    _second: int | None = None
    _text = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 (logging's name)
        return self.time_text(record.created, record.msecs)

    def time_text(self, created: float, msecs: float) -> str:
        second = int(created)
        if second != self._second:
            self._text = time.strftime("%Y-%m-%d %H:%M:%S", self.converter(created))
            self._second = second
        return "%s,%03d" % (self._text, msecs)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts`` (UTC, RFC 3339 with milliseconds), ``level``, ``logger``,
    ``msg``, an access line's fields, and ``exc`` (the traceback text) when there is one."""

    _second: int | None = None
    _text = ""

    def ts(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            self._text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
            self._second = second
        return "%s.%03dZ" % (self._text, int((created - second) * 1000))

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {"ts": self.ts(record.created), "level": record.levelname, "logger": record.name,
                               "msg": record.getMessage()}
        fields = getattr(record, EXTRA_FIELDS, None)
        if fields:
            out.update(fields)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        # default=str: an odd value in a third-party record must not lose the line
        return orjson.dumps(out, default=str).decode()


class ConsoleHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """stderr through a buffer of our own; flushed per record until :meth:`defer` is called."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        super().__init__(stream if stream is not None else _buffered_stderr())
        self._deferred = False
        self._timer: asyncio.TimerHandle | None = None
        #: lines of :class:`DirectLine` not formatted yet: (formatter, prefix, format, args, created)
        self._lines: list[tuple[Formatter, str, str, tuple[object, ...], float]] = []

    def defer(self) -> None:
        """From now on, INFO lines may wait up to ``FLUSH_INTERVAL_S`` (call it on the serving loop)."""
        self._deferred = True

    def emit(self, record: logging.LogRecord) -> None:
        if self._lines:
            self._write_lines()  # what came before this record is written before it
        if not self._deferred or record.levelno >= logging.WARNING:
            super().emit(record)  # writes and flushes
            return
        try:
            self.stream.write(self.format(record) + self.terminator)
        except Exception:  # logging's own policy: a broken log line never breaks the caller
            self.handleError(record)
            return
        if self._timer is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # a thread without a loop (an executor's log line): write it now
                self.flush()
                return
            self._timer = loop.call_later(FLUSH_INTERVAL_S, self._timed_flush)

    def keep_line(self, formatter: Formatter, prefix: str, fmt: str, args: tuple[object, ...], created: float) -> None:
        """A line of :class:`DirectLine`, kept like a deferred INFO record and formatted only when the
        batch is written (call it on the serving loop): formatting a thousand lines in one loop costs
        less than one at a time between calls, with the CPU's caches cold (docs/performance.md)."""
        self.acquire()
        try:
            self._lines.append((formatter, prefix, fmt, args, created))
            full = len(self._lines) >= _LINES_MAX
        finally:
            self.release()
        if full:
            self._write_lines()
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(FLUSH_INTERVAL_S, self._timed_flush)

    def _write_lines(self) -> None:
        self.acquire()
        try:
            lines, self._lines = self._lines, []
            out = []
            for formatter, prefix, fmt, args, created in lines:
                msecs = int((created - int(created)) * 1000)  # as LogRecord computes it
                out.append(f"{formatter.time_text(created, msecs)}{prefix}{fmt % args if args else fmt}\n")
            if out:
                self.stream.write("".join(out))
        except Exception:  # logging's own policy: a broken log line never breaks the caller
            self.handleError(logging.makeLogRecord({"msg": "access lines could not be written"}))
        finally:
            self.release()

    def flush(self) -> None:
        if self._lines:
            self._write_lines()
        super().flush()

    def _timed_flush(self) -> None:
        self._timer = None
        self.flush()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flush()
        super().close()


def _buffered_stderr() -> IO[str]:
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, ValueError, io.UnsupportedOperation):  # a captured stderr (tests): use it as is
        return sys.stderr
    return open(fd, "w", buffering=_BUFFER, encoding=sys.stderr.encoding or "utf-8",  # noqa: SIM115 (lives as long as the process)
                errors="backslashreplace", closefd=False)


def configure(level: str, fmt: str = "text") -> ConsoleHandler | None:
    """Log to stderr at ``level`` in ``fmt`` (``text`` or ``json``) unless logging was configured
    already (as ``basicConfig`` would); returns the handler installed, if any."""
    from treg.errors import ConfigError

    if fmt not in FORMATS:
        raise ConfigError(f"setting TREG_LOG_FORMAT: expected text or json, got {fmt!r}", code="bad_setting")
    root = logging.getLogger()
    for noisy in ("pgserver", "alembic"):  # their INFO chatter buries treg's own lines
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if root.handlers:
        return None
    root.setLevel(level.upper())
    # process-wide switches of logging: records skip looking up what FORMAT never shows
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = ConsoleHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else Formatter(FORMAT))
    root.addHandler(handler)
    if fmt == "json":
        # what would otherwise reach stderr as bare text: warnings.warn and an uncaught traceback
        logging.captureWarnings(True)
        sys.excepthook = _log_uncaught
    return handler


def _log_uncaught(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
    logging.getLogger("treg").critical("uncaught %s", kind.__name__, exc_info=(kind, exc, tb))
    for handler in logging.getLogger().handlers:
        handler.flush()


def is_json() -> bool:
    """True when the console log writes JSON lines (``TREG_LOG_FORMAT=json``)."""
    return any(isinstance(h.formatter, JsonFormatter) for h in logging.getLogger().handlers)


def json_line(level: int, logger: str, msg: str, **fields: Any) -> str:
    """A line of the ``json`` format written outside logging (the CLI's final error line)."""
    rec = logging.makeLogRecord({"name": logger, "levelno": level, "levelname": logging.getLevelName(level),
                                 "msg": msg, EXTRA_FIELDS: fields})
    return JsonFormatter().format(rec)


def defer_console() -> None:
    """``treg serve``, on its loop: let the console handler keep INFO lines briefly (see the module)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, ConsoleHandler):
            handler.defer()


class DirectLine:
    """Writes a logger's lines straight to the console handler, byte for byte what logging would write.

    For the access line, written once per request: a LogRecord and logging's handler chain cost ~40 µs
    of CPU per request under load, this a few (docs/performance.md). :func:`direct_line` hands one out
    only when the console handler is where the record would end up and nothing could change it on the
    way (no other handler, no filter, propagation all the way up), and only under ``treg serve`` (a
    deferred handler): the access logger asks once per connection."""

    __slots__ = ("_handler", "_formatter", "_prefix")

    def __init__(self, handler: ConsoleHandler, formatter: Formatter, prefix: str) -> None:
        self._handler, self._formatter, self._prefix = handler, formatter, prefix

    def write(self, fmt: str, args: tuple[object, ...] = ()) -> None:
        """The line ``fmt % args`` (``fmt`` as is without args), stamped now; call on the serving loop."""
        self._handler.keep_line(self._formatter, self._prefix, fmt, args, time.time())


def direct_line(logger: logging.Logger, level: int) -> DirectLine | None:
    """A :class:`DirectLine` for ``logger`` at ``level``, or None when logging must do the work."""
    root = logging.root
    if len(root.handlers) != 1 or not logger.isEnabledFor(level):
        return None
    handler = root.handlers[0]
    fmt = handler.formatter
    if (type(handler) is not ConsoleHandler or not handler._deferred or handler.filters or root.filters
            or level < handler.level or type(fmt) is not Formatter or fmt._fmt != FORMAT):
        return None
    node: logging.Logger | None = logger
    while node is not None and node is not root:
        if node.handlers or node.filters or not node.propagate:
            return None
        node = node.parent
    return DirectLine(handler, fmt, f" {logging.getLevelName(level)} {logger.name}: ")
