"""The access log: one line per request, as its own sink.

Speed trick, named: **batched access lines** (figures: docs/performance.md, "Where each speed trick
lives"). An access line is written once per request, so under ``treg serve`` it does not go through
logging at all: :class:`AccessSink` keeps each request's few values as a tuple and formats the kept
lines together when the console drains them (at most ``LINES_MAX`` at once, so one batch never holds
the loop for long), written with one ``write`` through the console's batched writer
(:class:`treg.logs.Console`) that the log's own lines share, so the order of lines is kept. It makes
no LogRecord, needs no handler chain and reads nothing of logging's state: what it writes is fixed
when ``treg serve`` makes it (the log's format, ``text`` or ``json``), and whether it writes at all
is the ``aiohttp.access`` logger's level (:attr:`AccessLogger.enabled`).

Without a sink (aiohttp's test server, an app embedded elsewhere) :class:`AccessLogger` hands logging
a record, as aiohttp's own access logger would, with the call's fields for a JSON formatter.

Never the query string (callers put keys there; an OAuth callback's code) nor a redirect's or a connect
link's opaque value; in ``json`` the line
adds the call's id, org, member and surface, and the client's address (``client``: the peer's, or what a
proxy in ``TREG_TRUSTED_PROXIES`` says in ``X-Forwarded-For``, treg/forwarded.py).
"""

from __future__ import annotations

import logging
import time as clock
from collections import deque
from typing import Any

import orjson
from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from treg import logs
from treg.redaction import MASK, mask_userinfo
from treg.web import forwarded

#: at most this many access lines are formatted in one batch: a bound on memory between two timer
#: flushes, and on how long one batch holds the loop — a full batch is written inside the request
#: callback that fills it (256 lines held a call at c=1 for ~0.8 ms; 32 for ~0.1 ms: docs/performance.md,
#: rounds 4 and 8)
LINES_MAX = 32
#: the line's text after the timestamp and level, as ``logging`` would format the record
MESSAGE = "%s %s %s %s %.1fms"
#: a whole text line: the timestamp (``%s,%03d``, as :meth:`treg.logs.Formatter.time_text`), the prefix, MESSAGE
_TEXT_LINE = "%s,%03d%s" + MESSAGE + "\n"
LOGGER = "aiohttp.access"
CALL_ID = "X-Treg-Call-Id"

#: the call surfaces by path prefix (as treg.web.call routes them); anything else is ``api`` or ``other``
_SURFACES = (("/call/", "call"), ("/catalog/call/", "catalog"), ("/table/", "table"), ("/redirect/", "redirect"),
             ("/api/", "api"))


def surface(path: str) -> str:
    for prefix, name in _SURFACES:
        if path.startswith(prefix):
            return name
    return "other"


def logged_path(raw_path: str) -> str:
    # never the query string (callers put keys there), nor a redirect's opaque value: it seals the
    # target URL and whatever token that URL carried (treg/call/redirects.py)
    path = raw_path.partition("?")[0]
    if not path.startswith("/"):  # absolute-form (GET http://user:pw@treg/call/...): its path only
        path = "/" + path.split("://", 1)[-1].partition("/")[2]
    if "@" in path and path.startswith("/call/"):
        # a passthrough target's user:password@ (refused, ambiguous_target): masked as the audit masks it
        return "/call/" + mask_userinfo(path[6:], MASK)
    if path.startswith("/oauth/connect/"):  # a connect link works once for whoever opens it first (docs/oauth.md)
        return "/oauth/connect/…"
    return "/redirect/…" if path.startswith("/redirect/") else path


#: what one request leaves for its line: (created, method, path, status, bytes, seconds, call_id, caller,
#: client)
Entry = tuple[float, str, str, int, int, float, "str | None", "tuple[str, str | None] | None", "str | None"]


class AccessSink:
    """Access lines kept unformatted, written in batches through ``console`` in ``fmt`` (``text`` or
    ``json``, as :func:`treg.logs.configure` formats the log). Call :meth:`log` on the serving loop."""

    def __init__(self, console: logs.Console, fmt: str = "text", *, logger: str = LOGGER) -> None:
        self._console = console
        self._json = fmt == "json"
        self._logger = logger
        self._prefix = f" INFO {logger}: "
        self._text_time = logs.Formatter(logs.FORMAT)
        self._json_time = logs.JsonFormatter()
        self._kept: deque[Entry] = deque()
        console.add_source(self.take)

    def log(self, request: web.BaseRequest, response: web.StreamResponse, seconds: float) -> None:
        """The line of one request (the call's id, caller and client are read only when the format shows them)."""
        if self._json:
            call_id, caller, client = response.headers.get(CALL_ID), logs.CALLER.get(), forwarded.client(request)
        else:
            call_id = caller = client = None
        self.add((clock.time(), request.method, logged_path(request.raw_path), response.status,
                  response.body_length, seconds, call_id, caller, client))

    def add(self, entry: Entry) -> None:
        # no lock: a deque's append is atomic, and :meth:`take` pops only the lines there when it looked,
        # so a line appended while a thread drains (an executor's log line) waits for the next batch, never
        # lost (the console's lock here cost ~1.5 k instructions a request: docs/performance.md, rounds 13 and 16)
        kept = self._kept
        kept.append(entry)
        if len(kept) >= LINES_MAX:
            self._console.drain()
        else:
            self._console.later()

    def take(self) -> str:
        """The kept lines' text, forgotten here (the console calls it before writing anything else)."""
        kept = self._kept
        with self._console.lock:  # one taker at a time: each pops exactly the lines it counted
            entries = [kept.popleft() for _ in range(len(kept))]
        if not entries:
            return ""
        line = self._json_line if self._json else self._text_line
        return "".join([line(entry) for entry in entries])

    def _text_line(self, entry: Entry) -> str:
        created, method, path, status, size, seconds, _, _, _ = entry
        second = int(created)
        clock = self._text_time
        if second != clock._second:
            clock.time_text(created, 0)  # the second's date text, made once a second
        # the Formatter's "<date>,<msecs>" (``%03d`` truncates as LogRecord's int() does), the prefix and
        # MESSAGE in one formatting operation instead of three strings joined (docs/performance.md)
        return _TEXT_LINE % (clock._text, (created - second) * 1000, self._prefix, method, path, status, size,
                             seconds * 1000)

    def _json_line(self, entry: Entry) -> str:
        created, method, path, status, size, seconds, call_id, caller, client = entry
        return orjson.dumps({"ts": self._json_time.ts(created), "level": "INFO", "logger": self._logger,
                             "msg": MESSAGE % (method, path, status, size, seconds * 1000),
                             **fields(method, path, status, size, seconds, call_id, caller, client)},
                            default=str).decode() + "\n"


def fields(method: str, path: str, status: int, size: int, seconds: float, call_id: str | None,
           caller: tuple[str, str | None] | None, client: str | None = None) -> dict[str, Any]:
    """An access line's own fields in ``json``."""
    org_id, member_id = caller or (None, None)
    return {"call_id": call_id, "org_id": org_id, "member_id": member_id, "surface": surface(path),
            "method": method, "path": path, "status": status, "bytes": size, "duration_ms": round(seconds * 1000, 1),
            "client": client}


class AccessLogger(AbstractAccessLogger):
    """aiohttp's access logger (one per connection): a record handed to logging; the class
    :meth:`writing_to` makes for a runner with an :class:`AccessSink` hands the line to the sink instead."""

    @classmethod
    def writing_to(cls, sink: AccessSink | None) -> type[AccessLogger]:
        """The access logger class for a runner whose lines go to ``sink`` (aiohttp takes a class)."""
        # the sink's own bound ``log`` as the class's: a bound method is no descriptor, so aiohttp's call
        # goes straight to the sink, one frame fewer a request
        return cls if sink is None else type(cls.__name__, (cls,), {"log": sink.log})

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        # the raw path as the caller sent it: no URL object decoded for a line
        method, path, status, size = request.method, logged_path(request.raw_path), response.status, response.body_length
        call_id, caller = response.headers.get(CALL_ID), logs.CALLER.get()
        # a record made directly, without logging's caller lookup (a walk up the stack for a file and
        # line nobody reads in an access line)
        record = self.logger.makeRecord(self.logger.name, logging.INFO, __file__, 0, MESSAGE,
                                        (method, path, status, size, time * 1000), None)
        setattr(record, logs.EXTRA_FIELDS, fields(method, path, status, size, time, call_id, caller,
                                                  forwarded.client(request)))
        self.logger.handle(record)

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)
