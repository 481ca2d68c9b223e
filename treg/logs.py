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
"""

from __future__ import annotations

import asyncio
import io
import logging
import sys
import time
from typing import IO

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
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


class ConsoleHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """stderr through a buffer of our own; flushed per record until :meth:`defer` is called."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        super().__init__(stream if stream is not None else _buffered_stderr())
        self._deferred = False
        self._timer: asyncio.TimerHandle | None = None

    def defer(self) -> None:
        """From now on, INFO lines may wait up to ``FLUSH_INTERVAL_S`` (call it on the serving loop)."""
        self._deferred = True

    def emit(self, record: logging.LogRecord) -> None:
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

    def write_line(self, line: str) -> None:
        """A finished line (see :class:`DirectLine`), kept like a deferred INFO record."""
        self.acquire()
        try:
            self.stream.write(line)
        finally:
            self.release()
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(FLUSH_INTERVAL_S, self._timed_flush)

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


def configure(level: str) -> ConsoleHandler | None:
    """Log to stderr at ``level`` unless logging was configured already (as ``basicConfig`` would);
    returns the handler installed, if any."""
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
    handler.setFormatter(Formatter(FORMAT))
    root.addHandler(handler)
    return handler


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

    def write(self, message: str) -> None:
        """Call on the serving loop."""
        now = time.time()
        msecs = int((now - int(now)) * 1000)  # as LogRecord computes it
        self._handler.write_line(f"{self._formatter.time_text(now, msecs)}{self._prefix}{message}\n")


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
