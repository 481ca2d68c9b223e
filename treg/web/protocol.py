"""aiohttp's own answers, for requests its HTTP parser refuses before any route sees them.

aiohttp answers those itself (``RequestHandler.handle_error``): a ``text/plain`` body and an ERROR log
line, both carrying the parser's message, which quotes the raw bytes around the fault — an
``X-Treg-Token`` sent on a malformed request ended up in the log and in the answer. Here:

* :class:`RedactingLog` is the logger of every connection's protocol (``handler_args`` of the app, so
  also under aiohttp's test server): a parser error is logged as its kind and a short reason, never
  its message or traceback;
* :class:`TregRequestHandler` answers with the contract's error body (``X-Treg-Error: 1``) instead of
  aiohttp's text; :func:`protocol_server` makes a runner's server use it (aiohttp has no public hook
  for the protocol class: its ``Server`` builds ``RequestHandler`` itself).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from treg.errors import TregError
from treg.web.errors import error_response

_SERVER_LOG = "aiohttp.server"

#: the start of a parser message, up to the first quote, colon or line break: llhttp's and aiohttp's
#: fixed reason text ("Invalid header value char"), never the quoted bytes after it
_REASON = re.compile(r"[^'\":\n\\]*")


def parser_reason(exc: HttpProcessingError) -> str:
    """A parser error as a short text without any byte of the request."""
    text = _REASON.match(str(exc.message or ""))
    reason = text.group(0).strip()[:120] if text else ""
    return f"{type(exc).__name__}: {reason}" if reason else type(exc).__name__


def _parser_error(exc_info: Any) -> HttpProcessingError | None:
    exc = exc_info[1] if isinstance(exc_info, tuple) else exc_info
    return exc if isinstance(exc, HttpProcessingError) else None


class RedactingLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """aiohttp's server logger, minus the request's bytes: a record whose exception is a parser error
    becomes one INFO line naming it (a caller's malformed request is not treg's error)."""

    def __init__(self) -> None:
        super().__init__(logging.getLogger(_SERVER_LOG), {})

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        exc = _parser_error(kwargs.get("exc_info"))
        if exc is not None:
            kwargs["exc_info"] = None
            level, msg, args = logging.INFO, f"{msg}: %s (the request's bytes are not logged)", (
                *args, parser_reason(exc))
        super().log(level, msg, *args, **kwargs)


class TregRequestHandler(web.RequestHandler):
    """aiohttp's protocol, its error answers in treg's shape."""

    def handle_error(self, request: web.BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if isinstance(exc, HttpProcessingError):
            self.logger.info("malformed request from %s refused: %s", request.remote, parser_reason(exc))
        else:
            self.log_exception("Error handling request from %s", request.remote, exc_info=exc)
        if request.writer.output_size > 0:
            # as aiohttp's: part of an answer is out, a second one cannot follow
            raise ConnectionError("Response is sent already, cannot send another response with the error message")
        if isinstance(exc, HttpProcessingError) and status < 500:
            err = TregError(f"the request is not valid HTTP/1.1 ({parser_reason(exc)})", code="malformed_request",
                            status=status, blame="caller")
        elif status == 504:
            err = TregError("treg did not finish the request in time", code="timeout", status=504, blame="treg")
        else:
            err = TregError("treg failed unexpectedly; the error was logged", code="internal_error", status=status,
                            blame="treg")
        resp = error_response(err)
        resp.force_close()
        return resp


class _Server(web.Server):
    def __call__(self) -> web.RequestHandler:
        return TregRequestHandler(self, loop=self._loop, **self._kwargs)


def protocol_server(server: web.Server) -> web.Server:
    """``server`` (a runner's, before it listens) making :class:`TregRequestHandler` connections."""
    server.__class__ = _Server  # the same object and state: only the protocol it builds changes
    return server


class Runner(web.AppRunner):
    """aiohttp's AppRunner whose connections answer parser errors in treg's shape."""

    async def _make_server(self) -> web.Server:
        return protocol_server(await super()._make_server())
