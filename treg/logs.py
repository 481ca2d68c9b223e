"""The console log of the CLI and ``treg serve``: one handler on stderr, through :class:`Console`.

:class:`Console` is stderr's one batched writer. Under ``treg serve`` (:meth:`Console.defer`) lines at
INFO and below collect in a 64 KiB buffer written when it fills, at most ``FLUSH_INTERVAL_S`` after a
line came in, and at shutdown; a WARNING or worse writes everything at once. A process killed outright
loses at most that interval of INFO lines; the durable record of every call is the audit table, not
this log. The access log (treg/web/access_log.py) is a sink of its own writing through the same
``Console``, so its lines and the log's keep their order and never split one another. Timestamp text
is formatted once per second (:class:`Formatter`); why each of these pays: docs/performance.md.

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
import threading
import time
from contextvars import ContextVar
from typing import IO, Any, Callable

import orjson

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: the values of ``TREG_LOG_FORMAT``
FORMATS = ("text", "json")
#: the attribute of a LogRecord carrying fields of its own (a dict; an access line's call fields) for ``json``
EXTRA_FIELDS = "treg_fields"
#: (org_id, member_id) of the token the current request was admitted with, for its access line. Set
#: where treg.authentication admits a token; read by the access logger, which aiohttp runs in the request's
#: own task (a fresh copy of the context per request, so no value leaks into the next request).
CALLER: ContextVar[tuple[str, str | None] | None] = ContextVar("treg_caller", default=None)
#: how long an INFO line may wait in the buffer under ``treg serve``
FLUSH_INTERVAL_S = 0.5
_BUFFER = 64 * 1024


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


class Console:
    """stderr's one batched writer: text written through it goes to ``stream`` (a buffered stderr) and
    is flushed at once until :meth:`defer` is called, then at most ``FLUSH_INTERVAL_S`` later, or at
    once when ``urgent``. Sources of lines kept unformatted (the access log's sink) are drained into it
    before anything else is written, so lines keep the order they came in."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream if stream is not None else _buffered_stderr()
        self.lock = threading.RLock()  # a log line may come from an executor's thread
        self._deferred = False
        self._timer: asyncio.TimerHandle | None = None
        self._sources: list[Callable[[], str]] = []

    def defer(self) -> None:
        """From now on, lines that are not urgent may wait up to ``FLUSH_INTERVAL_S`` (call it on the
        serving loop)."""
        self._deferred = True

    def add_source(self, take: Callable[[], str]) -> None:
        """``take()`` returns the text of the lines a source kept (and forgets them); called before any
        other text is written and at every flush."""
        self._sources.append(take)

    def write(self, text: str, *, urgent: bool = False) -> None:
        with self.lock:
            self._drain()
            self.stream.write(text)
            if urgent or not self._deferred:
                self.stream.flush()
                return
        self.later()

    def drain(self) -> None:
        """Write what the sources kept now (into the buffer; flushed as any other deferred text)."""
        try:
            with self.lock:
                self._drain()
        except (OSError, ValueError):  # stderr closed or gone: a lost log line never breaks the request
            return
        self.later()

    def later(self) -> None:
        """Flush within ``FLUSH_INTERVAL_S``: by a timer on the running loop, else (a thread without a
        loop, an executor's log line) now."""
        if self._timer is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._timer = loop.call_later(FLUSH_INTERVAL_S, self._timed_flush)

    def _drain(self) -> None:
        for take in self._sources:
            text = take()
            if text:
                self.stream.write(text)

    def flush(self) -> None:
        with self.lock:
            self._drain()
            self.stream.flush()

    def _timed_flush(self) -> None:
        self._timer = None
        try:
            self.flush()
        except (OSError, ValueError):  # stderr closed or gone: there is nowhere to say so
            pass

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flush()


class ConsoleHandler(logging.Handler):
    """The log's handler on stderr, writing through its :class:`Console` (``console``): WARNING and
    worse at once, the rest as the console allows."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        super().__init__()
        self.console = Console(stream)

    def defer(self) -> None:
        self.console.defer()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.console.write(self.format(record) + "\n", urgent=record.levelno >= logging.WARNING)
        except Exception:  # logging's own policy: a broken log line never breaks the caller
            self.handleError(record)

    def flush(self) -> None:
        self.console.flush()

    def close(self) -> None:
        self.console.close()
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


def console() -> Console | None:
    """The console :func:`configure` installed (None when logging was set up by someone else)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, ConsoleHandler):
            return handler.console
    return None
