"""A canary for the aiohttp internals treg overrides or reads: it fails loudly when one of them moves.

pyproject.toml pins aiohttp to the minor release these were verified against (``>=3.14,<3.15``).
Before widening the pin, read each place named in a failure against the new aiohttp's source, fix it
or re-verify it, then update this file. What treg relies on, and where:

* ``treg/infra/upstream.py`` ``FaithfulRequest(ClientRequest)``: overrides ``update_headers`` (builds
  ``self.headers`` from treg's exact list; ``update_headers(None)`` must still set just the URL's Host)
  and ``update_body_from_data`` (sets ``self._body = None`` itself to skip the ``Content-Length: 0``
  aiohttp adds to a bodyless POST); ``__init__`` must call both, headers first; the class goes in via
  ``ClientSession(request_class=...)``.
* ``treg/infra/upstream.py`` ``FaithfulRequest.update_auto_headers``: aiohttp's adds only ``DEFAULT_HEADERS``
  and ``User-Agent``, each unless the headers or the skip list name it, and keeps the skip list as
  ``_skip_auto_headers`` (a CIMultiDict), which the rest of ``ClientRequest`` only reads.
* ``treg/web/call.py`` ``RelayResponse(StreamResponse)``: overrides ``async _prepare_headers()`` (called
  by ``prepare``, after aiohttp's own defaults), edits ``self._headers`` (the same object as
  ``headers``) and sets ``_send_headers_immediately = False`` to send a small answer's headers with its
  body; it overrides ``async _start(request)`` with aiohttp's steps minus ``request._prepare_hook`` (the
  ``on_response_prepare`` signal), so ``_start`` must still be exactly those steps; its subclass
  ``RawHeadResponse`` overrides ``async _write_headers()`` for an answer with
  non-UTF-8 headers (the writer's ``write_headers`` then ``_headers_buf`` replaced, ``send_headers``); catches
  ``aiohttp.http_exceptions.HttpProcessingError``.
* ``treg/infra/read_deadlines.py`` ``DeadlineHandler(ResponseHandler)``: overrides ``_reschedule_timeout`` and
  ``_drop_timeout`` (the only places aiohttp arms or cancels ``_read_timeout_handle``), reads
  ``_read_timeout`` and ``_loop``, and calls ``_on_read_timeout``; ``DeadlineConnector(TCPConnector)`` replaces
  ``self._factory`` (a ``functools.partial(ResponseHandler, loop=...)``) after ``__init__`` and overrides
  ``async close(*, abort_ssl=False)``.
* ``treg/infra/dns.py`` ``VettingConnector(TCPConnector)``: overrides ``async connect(req, traces, timeout)``
  (the session asks it for every request's connection, pooled or new) and reads ``req.url``.
* ``treg/infra/lean_request.py`` ``lean_request``: stands in for ``ClientSession._request`` on a call, so it
  reads the session's private fields (``_connector``, ``_timeout``, ``_retry_connection``, ``_request_class``,
  ``_response_class``, ``_skip_auto_headers``, ``_version``, ``_loop``, ``_auto_decompress``, ``_read_bufsize``,
  ``_max_line_size``, ``_max_field_size``, ``_max_headers``, ``_trace_configs``, ``_middlewares``,
  ``_cookie_jar``), the connector's ``allowed_protocol_schema_set`` and ``_timeout_ceil_threshold``, calls
  ``connector.connect(req, traces=, timeout=)``, ``protocol.set_response_params(...)``, ``req.send(conn)``,
  ``resp.start(conn)``, ``req.close()`` and reads ``req._body.consumed``; ``_request`` must still do
  nothing else for treg's session (its steps are listed in that module's docstring).
* ``treg/web/access_log.py`` ``AccessLogger(AbstractAccessLogger)``: ``__init__(logger, log_format)`` and
  ``log(request, response, time)``; ``AppRunner(..., handler_cancellation=True)`` reaches ``web.Server``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import re
import tomllib
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web, web_response
from aiohttp.abc import AbstractAccessLogger
from aiohttp.client_reqrep import ClientRequest
from multidict import CIMultiDict
from yarl import URL

from treg.infra.read_deadlines import DeadlineConnector, DeadlineHandler
from treg.infra.upstream import FaithfulRequest
from treg.web.call import RawHeadResponse, RelayResponse

CHECKOUT = Path(__file__).resolve().parent.parent
VERIFIED_MINOR = (3, 14)


def check(ok: object, what: str, where: str) -> None:
    """Fail naming the aiohttp internal that moved and the treg code to re-verify against it."""
    assert ok, (f"aiohttp {aiohttp.__version__}: {what} moved. treg relies on it in {where}: re-verify that "
                f"code against this aiohttp's source (see this file's docstring), then update the canary "
                f"and the pin")


def params(fn) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


EMPTY = inspect.Parameter.empty
UPSTREAM = "treg/infra/upstream.py FaithfulRequest"
RELAY = "treg/web/call.py RelayResponse"


def test_the_pin_is_the_verified_minor_and_installed():
    deps = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())["project"]["dependencies"]
    pin = next(d for d in deps if re.match(r"aiohttp\b", d))
    major, minor = VERIFIED_MINOR
    assert pin.replace(" ", "") == f"aiohttp>={major}.{minor},<{major}.{minor + 1}", pin
    installed = tuple(int(x) for x in aiohttp.__version__.split(".")[:2])
    check(installed == VERIFIED_MINOR, f"the installed version (verified: {major}.{minor})",
          "everything below")


async def test_client_request_update_headers():
    check(params(ClientRequest.update_headers) == [("self", EMPTY), ("headers", EMPTY)],
          "ClientRequest.update_headers(self, headers)", UPSTREAM)
    req = ClientRequest("GET", URL("http://upstream.test:8080/x"))
    req.update_headers(None)
    only_host = list(req.headers.items()) == [("Host", "upstream.test:8080")]
    check(isinstance(req.headers, CIMultiDict) and only_host,
          "update_headers(None) setting only the URL's Host on self.headers", UPSTREAM)


def test_client_request_update_body_from_data():
    expected = [("self", EMPTY), ("body", EMPTY), ("_stacklevel", 3)]
    check(params(ClientRequest.update_body_from_data) == expected,
          "ClientRequest.update_body_from_data(self, body, _stacklevel=3)", UPSTREAM)
    source = inspect.getsource(ClientRequest.update_body_from_data)
    check("self._body = None" in source and '"0"' in source,
          "the bodyless branch of update_body_from_data (self._body = None, then Content-Length: 0)",
          UPSTREAM)
    init = inspect.getsource(ClientRequest.__init__)
    heads, body = init.find("self.update_headers(headers)"), init.find("self.update_body_from_data(data)")
    check(0 <= heads < body, "ClientRequest.__init__ calling update_headers, then update_body_from_data",
          UPSTREAM)
    check("request_class" in inspect.signature(aiohttp.ClientSession.__init__).parameters,
          "ClientSession(request_class=...)", "treg/infra/upstream.py create_session")


LEAN = "treg/infra/lean_request.py lean_request"
SESSION_FIELDS = ("_connector", "_timeout", "_retry_connection", "_request_class", "_response_class",
                  "_skip_auto_headers", "_version", "_loop", "_auto_decompress", "_read_bufsize", "_max_line_size",
                  "_max_field_size", "_max_headers", "_trace_configs", "_middlewares", "_cookie_jar")


async def test_the_lean_request_reads_what_is_there():
    from aiohttp.client_proto import ResponseHandler
    from aiohttp.client_reqrep import ClientResponse
    from aiohttp.payload import Payload

    session = aiohttp.ClientSession()
    try:
        for name in SESSION_FIELDS:
            check(hasattr(session, name), f"ClientSession.{name}", LEAN)
        check(hasattr(session._connector, "allowed_protocol_schema_set")
              and hasattr(session._connector, "_timeout_ceil_threshold"),
              "the connector's allowed_protocol_schema_set and _timeout_ceil_threshold", LEAN)
    finally:
        await session.close()
    check(params(aiohttp.BaseConnector.connect) == [("self", EMPTY), ("req", EMPTY), ("traces", EMPTY),
                                                    ("timeout", EMPTY)],
          "BaseConnector.connect(self, req, traces, timeout)", LEAN)
    wanted = {"timer", "skip_payload", "read_until_eof", "auto_decompress", "read_timeout", "read_bufsize",
              "timeout_ceil_threshold", "max_line_size", "max_field_size", "max_headers"}
    check(wanted == {n for n, _ in params(ResponseHandler.set_response_params)} - {"self"},
          "ResponseHandler.set_response_params's parameters", LEAN)
    init = {n for n, _ in params(ClientRequest.__init__)}
    check({"headers", "skip_auto_headers", "data", "version", "loop", "response_class", "timer", "session",
           "traces"} <= init, "ClientRequest.__init__'s keywords", LEAN)
    check(params(ClientRequest.send) == [("self", EMPTY), ("conn", EMPTY)] and
          params(ClientResponse.start) == [("self", EMPTY), ("connection", EMPTY)] and
          inspect.iscoroutinefunction(ClientRequest.close) and isinstance(getattr(Payload, "consumed"), property),
          "ClientRequest.send(conn), ClientResponse.start(connection), ClientRequest.close(), Payload.consumed",
          LEAN)
    # what _request does for treg's session is what lean_request does: the steps it must still have (a
    # step gone means the two differ; read _request against lean_request before changing this list)
    source = inspect.getsource(aiohttp.ClientSession._request)
    for step in ("strip_auth_from_url(url)", "self._cookie_jar.filter_cookies(url)", "retry_persistent_connection",
                 "await self._connector.connect(", "conn.protocol.set_response_params(", "await req.send(conn)",
                 "await resp.start(conn)", "req._body.consumed", "raise ClientOSError(*exc.args) from exc",
                 "upload_tracker", "effective_middlewares"):
        check(step in source, f"ClientSession._request's step {step!r}", LEAN)


def test_update_auto_headers_adds_only_the_defaults_and_the_user_agent():
    where = "treg/infra/upstream.py FaithfulRequest.update_auto_headers"
    check(params(ClientRequest.update_auto_headers) == [("self", EMPTY), ("skip_auto_headers", EMPTY)],
          "ClientRequest.update_auto_headers(self, skip_auto_headers)", where)
    body = inspect.getsource(ClientRequest.update_auto_headers)
    writes = re.findall(r"self\.(\w+)(?:\[[^\]]*\])?\s*=", body)
    check(sorted(set(writes)) == ["_skip_auto_headers", "headers"] and "self.DEFAULT_HEADERS.items()" in body
          and "hdrs.USER_AGENT" in body, "what update_auto_headers sets (the default headers, User-Agent, the map)",
          where)
    source = inspect.getsource(ClientRequest)
    uses = re.findall(r"self\._skip_auto_headers\b[^\n]*", source)
    check(all(" = " not in u or u.startswith("self._skip_auto_headers = CIMultiDict(") for u in uses),
          "_skip_auto_headers written only by update_auto_headers (the rest of ClientRequest reads it)", where)


def test_faithful_request_overrides_what_it_means_to():
    # a rename on treg's side would silently fall back to aiohttp's behaviour
    for name in ("update_headers", "update_body_from_data", "update_auto_headers"):
        assert name in FaithfulRequest.__dict__ and hasattr(ClientRequest, name), name


def test_stream_response_prepare_headers():
    hook = getattr(web.StreamResponse, "_prepare_headers", None)
    check(hook is not None and inspect.iscoroutinefunction(hook), "async StreamResponse._prepare_headers",
          RELAY)
    check(params(hook) == [("self", EMPTY)], "StreamResponse._prepare_headers(self)", RELAY)
    source = inspect.getsource(web_response.StreamResponse)
    check("await self._prepare_headers()" in source, "StreamResponse calling _prepare_headers on prepare",
          RELAY)
    resp = web.StreamResponse()
    check(isinstance(resp._headers, CIMultiDict) and resp.headers is resp._headers,
          "StreamResponse._headers (the object headers returns)", RELAY)
    assert "_prepare_headers" in RelayResponse.__dict__


def test_stream_response_start():
    """RelayResponse._start is aiohttp's StreamResponse._start without the on_response_prepare signal: the
    same steps, in the same order, or the override would drop (or double) one."""
    hook = getattr(web.StreamResponse, "_start", None)
    check(hook is not None and inspect.iscoroutinefunction(hook)
          and params(hook) == [("self", EMPTY), ("request", EMPTY)], "async StreamResponse._start(self, request)", RELAY)
    body = [line.strip() for line in inspect.getsource(hook).splitlines()[1:] if line.strip()]
    check(body == ["self._req = request", "writer = self._payload_writer = request._payload_writer",
                   "await self._prepare_headers()", "await request._prepare_hook(self)",
                   "await self._write_headers()", "return writer"], "StreamResponse._start's steps", RELAY)
    ours = [line.strip() for line in inspect.getsource(RelayResponse._start).splitlines()[1:]
            if line.strip() and not line.strip().startswith("#")]
    assert ours == [line for line in body if "_prepare_hook" not in line]


def test_stream_response_write_headers():
    """RawHeadResponse._write_headers (an upstream's non-UTF-8 header sent as its bytes) redoes aiohttp's
    status line, calls the writer's write_headers, then replaces the head it buffered."""
    where = "treg/web/call.py RawHeadResponse._write_headers (non-UTF-8 answer headers)"
    hook = getattr(web.StreamResponse, "_write_headers", None)
    check(hook is not None and inspect.iscoroutinefunction(hook) and params(hook) == [("self", EMPTY)],
          "async StreamResponse._write_headers(self)", where)
    source = inspect.getsource(hook)
    for piece in ('status_line = f"HTTP/{version[0]}.{version[1]} {self._status} {self._reason}"',
                  "await writer.write_headers(status_line, self._headers)", "writer.send_headers()"):
        check(piece in source, f"StreamResponse._write_headers: {piece}", where)
    from aiohttp.http_writer import StreamWriter

    check("self._headers_buf = buf" in inspect.getsource(StreamWriter.write_headers),
          "StreamWriter.write_headers buffering the head in _headers_buf", where)
    check("self._headers_buf" in inspect.getsource(StreamWriter.send_headers),
          "StreamWriter.send_headers writing _headers_buf", where)
    assert "_write_headers" in RawHeadResponse.__dict__


def test_stream_response_send_headers_immediately():
    where = f"{RELAY}.__init__ (a small answer's headers sent with its body)"
    check(web.StreamResponse._send_headers_immediately is True, "StreamResponse._send_headers_immediately",
          where)
    # the class default, and at least one place that reads it
    source = inspect.getsource(web_response.StreamResponse)
    check(source.count("_send_headers_immediately") >= 2, "StreamResponse reading _send_headers_immediately",
          where)


def test_http_processing_error_import():
    from aiohttp.http_exceptions import HttpProcessingError

    check(issubclass(HttpProcessingError, Exception), "aiohttp.http_exceptions.HttpProcessingError",
          "treg/web/call.py _BODY_BROKEN")


@pytest.mark.parametrize("method, expected", [
    ("__init__", ["self", "logger", "log_format"]),
    ("log", ["self", "request", "response", "time"]),
])
def test_access_logger(method: str, expected: list[str]):
    check([n for n, _ in params(getattr(AbstractAccessLogger, method))] == expected,
          f"AbstractAccessLogger.{method}", "treg/web/access_log.py AccessLogger")


def test_server_takes_handler_cancellation():
    check("handler_cancellation" in inspect.signature(web.Server.__init__).parameters,
          "web.Server(handler_cancellation=...)", "treg/app.py make_runner")


DEADLINES = "treg/infra/read_deadlines.py DeadlineHandler"


def test_response_handler_read_timeout_internals():
    from aiohttp import client_proto, client_reqrep
    from aiohttp.client_proto import ResponseHandler

    for name in ("_reschedule_timeout", "_drop_timeout", "_on_read_timeout", "start_timeout"):
        check(callable(getattr(ResponseHandler, name, None)) and params(getattr(ResponseHandler, name)) ==
              [("self", EMPTY)], f"ResponseHandler.{name}(self)", DEADLINES)
        if name in ("_reschedule_timeout", "_drop_timeout"):
            assert name in DeadlineHandler.__dict__, name  # a rename on treg's side: aiohttp's timers again
    source = inspect.getsource(client_proto)
    # the timer lives only in the two methods treg overrides (and __init__): nothing else arms one
    arming = [m.start() for m in re.finditer(r"_read_timeout_handle\s*=\s*self\._loop\.call", source)]
    check(len(arming) == 1 and "def _reschedule_timeout" in source[max(0, arming[0] - 400):arming[0]],
          "ResponseHandler arming its read timer only in _reschedule_timeout", DEADLINES)
    check("self._reschedule_timeout()" in inspect.getsource(ResponseHandler.data_received)
          and "self._reschedule_timeout()" in inspect.getsource(ResponseHandler.start_timeout),
          "ResponseHandler moving the read timeout on data and on start_timeout", DEADLINES)
    check("set_exception" in inspect.getsource(ResponseHandler._on_read_timeout),
          "ResponseHandler._on_read_timeout setting the timeout error", DEADLINES)
    check("protocol.start_timeout()" in inspect.getsource(client_reqrep),
          "ClientRequest starting the read timeout when the request is sent", DEADLINES)
    proto = ResponseHandler(asyncio.new_event_loop())
    check(proto._read_timeout is None and proto._read_timeout_handle is None and hasattr(proto, "_loop"),
          "ResponseHandler._read_timeout, _read_timeout_handle, _loop", DEADLINES)
    proto._loop.close()


async def test_tcp_connector_factory_and_close():
    from aiohttp.client_proto import ResponseHandler

    connector = aiohttp.TCPConnector()
    factory = connector._factory
    check(isinstance(factory, functools.partial) and factory.func is ResponseHandler
          and set(factory.keywords) == {"loop"}, "TCPConnector._factory = partial(ResponseHandler, loop=...)",
          "treg/infra/read_deadlines.py DeadlineConnector")
    await connector.close()
    check(inspect.iscoroutinefunction(aiohttp.TCPConnector.close)
          and params(aiohttp.TCPConnector.close) == [("self", EMPTY), ("abort_ssl", False)],
          "async TCPConnector.close(self, *, abort_ssl=False)", "treg/infra/read_deadlines.py DeadlineConnector")
    assert "close" in DeadlineConnector.__dict__


def test_connector_connect_is_asked_for_every_request():
    """``VettingConnector`` vets in ``connect``, which the session calls for every request (a pooled
    connection and a redirect's next hop included) with a request whose ``url`` is where it goes."""
    from treg.infra.dns import VettingConnector

    check(inspect.iscoroutinefunction(aiohttp.BaseConnector.connect)
          and [n for n, _ in params(aiohttp.BaseConnector.connect)] == ["self", "req", "traces", "timeout"],
          "async BaseConnector.connect(self, req, traces, timeout)", "treg/infra/dns.py VettingConnector")
    source = inspect.getsource(aiohttp.ClientSession._request)
    check("self._connector.connect(" in source, "ClientSession._request calling self._connector.connect",
          "treg/infra/dns.py VettingConnector")
    assert "connect" in VettingConnector.__dict__
