"""The call surfaces at the edge: turn an aiohttp request into a CallInput (the intake stage's aiohttp
half; its plain-Python half is treg/call/intake.py), a CallOutcome into a streamed response. Everything
in between is plain Python (treg.call.service)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any, AsyncIterator, Awaitable, Callable

from aiohttp import ClientPayloadError, hdrs, web
from aiohttp.http_exceptions import HttpProcessingError

from treg.call import evidence, service
from treg.call.drain import Sink, drain
from treg.call.intake import decode_body as _decode_body, read_headers  # _decode_body: looked up here per load
from treg.call.types import SURFACE_PREFIXES, CallInput, PendingBody
from treg.errors import BadRequest, TregError
from treg.ids import new_call_id
from treg.infra.schema import BIGINT_MAX, METHOD_MAX
from treg.keys import ERROR_HEADERS, SERVICES
from treg.origin import note_listen
from treg.ui_sessions import COOKIE, SessionCookie
from treg.web import caching
from treg.web.errors import render_failure

routes = web.RouteTableDef()


#: fixed-length answers up to this size send their headers together with the body
COALESCE_MAX = 64 * 1024


class RelayResponse(web.StreamResponse, Sink):
    """A StreamResponse that sends the upstream's headers as they were: it keeps an upstream
    Content-Length on a bodyless answer (204/304, which aiohttp would drop) and adds no Content-Type
    or Server header the upstream did not send (a header that is not UTF-8: :class:`RawHeadResponse`). It is
    also the :class:`~treg.call.drain.Sink` the answer's body is drained into: the caller's socket, as the
    body arrives."""

    #: the upstream broke mid-answer (a TregError), or the caller went away mid-answer (a failed write: an
    #: ordinary event, recorded as cancelled; re-raised it became an "unexpected error" and a 500)
    ends = (TregError, ConnectionError)

    def __init__(self, outcome: service.CallOutcome, request: web.Request) -> None:
        super().__init__(status=outcome.status, reason=outcome.reason or None)
        self._outcome = outcome
        self._caller = request
        if outcome.content_length is not None and outcome.content_length <= COALESCE_MAX:
            # a small fixed-length answer: its headers leave with its first body bytes, one write (and
            # one packet) instead of two (docs/performance.md); a streamed answer's go out at once
            self._send_headers_immediately = False

    async def _prepare_headers(self) -> None:
        await super()._prepare_headers()
        o = self._outcome
        h = self._headers  # aiohttp keeps them here; there is no public hook after its defaults
        if o.content_length is not None and hdrs.CONTENT_LENGTH not in h:
            h[hdrs.CONTENT_LENGTH] = str(o.content_length)
        if not o.has_content_type:
            h.popall(hdrs.CONTENT_TYPE, None)
        if not o.has_server:
            h.popall(hdrs.SERVER, None)
        if hdrs.CACHE_CONTROL not in h:  # treg's own answer on a call surface (a relayed one says private)
            h[hdrs.CACHE_CONTROL] = caching.NOT_STORED

    async def _start(self, request: web.BaseRequest) -> Any:
        # aiohttp's own steps without ``request._prepare_hook``: the app's only ``on_response_prepare``
        # receiver is treg/web/caching.py's, whose work :meth:`_prepare_headers` just did, and sending the
        # signal cost a call ~6 k instructions (a speed trick: docs/performance.md, round 14)
        self._req = request
        writer = self._payload_writer = request._payload_writer
        await self._prepare_headers()
        await self._write_headers()
        return writer

    # the sink's steps are aiohttp's own calls where they can be (no frame in between on the hot path):
    # a body in hand leaves with the head in one write; ``write`` answers None, so a chunk never says "enough"
    whole = web.StreamResponse.write_eof
    chunk = web.StreamResponse.write  # type: ignore[assignment]
    end = web.StreamResponse.write_eof

    async def start(self) -> None:
        await self.prepare(self._caller)

    def broken(self, exc: BaseException) -> None:
        # the headers are gone, so never relabel it as a new error response; cut the connection so the
        # caller sees a truncated answer, not a complete one (aiohttp must not finish it as if it were whole)
        if self._caller.transport is not None:
            self._caller.transport.close()


class RawHeadResponse(RelayResponse):
    """A RelayResponse for an answer with a header that is not UTF-8 (latin-1 obs-text such as
    ``caf\\xe9``): aiohttp's writer encodes header text as UTF-8 and sent ``caf\\xc3\\xa9``, so the head
    is written again with those pairs' own bytes (every other header as aiohttp writes it, UTF-8).
    Rare: only such an answer pays for it (:func:`handle` picks the class)."""

    async def _write_headers(self) -> None:
        raw = self._outcome.raw_headers
        assert raw is not None
        request, writer = self._req, self._payload_writer
        assert request is not None and writer is not None
        version = request.version
        status_line = f"HTTP/{version[0]}.{version[1]} {self._status} {self._reason}"
        await writer.write_headers(status_line, self._headers)  # aiohttp's checks (no CR/LF) and signal
        lines = [status_line.encode()]
        for k, v in self._headers.items():
            name, value = raw.get((k, v)) or (k.encode(), v.encode())
            lines.append(name + b": " + value)
        writer._headers_buf = b"\r\n".join(lines) + b"\r\n\r\n"  # what write_headers buffered, replaced
        if self._send_headers_immediately:
            writer.send_headers()


#: how a caller's body read fails when the caller hangs up mid-upload
_BODY_BROKEN = (ConnectionError, asyncio.IncompleteReadError, HttpProcessingError, ClientPayloadError)


async def _whole(read: Awaitable[bytes]) -> bytes:
    """A buffered body read; a caller that hangs up mid-upload is a 400 (which nobody may be left to
    read), not an unexpected error and a 500."""
    try:
        return await read
    except _BODY_BROKEN as exc:
        raise BadRequest("the request body ended before it was complete (the connection closed)",
                         code="body_incomplete") from exc


async def _caller_stream(request: web.Request) -> AsyncIterator[bytes]:
    """The caller's body, streamed; a caller that hangs up mid-upload surfaces as a 400 naming that
    (the upstream client unwraps it from its send error), not as an upstream failure."""
    read = request.content.readany  # as it arrives, no 64 KiB slicing copies (docs/performance.md round 4)
    try:
        while chunk := await read():
            yield chunk
    except _BODY_BROKEN as exc:
        raise BadRequest("the request body ended before it was complete (the connection closed)",
                         code="body_incomplete") from exc


async def _read_bounded(request: web.Request, limit: int) -> bytes:
    parts, size = [], 0
    async for chunk in request.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise BadRequest(f"the encoded body is larger than {limit} bytes", code="body_too_large")
        parts.append(chunk)
    return b"".join(parts)


def _refuse_header(name: str) -> PendingBody:
    async def load(inp: CallInput) -> CallInput:
        # aiohttp's client writes header text as UTF-8: a latin-1 byte would reach the upstream changed
        # (0xE9 as C3 A9), so such a request is refused rather than silently altered (docs/architecture.md)
        raise BadRequest(f"the header {name} holds bytes that are not UTF-8 (obs-text); treg relays header "
                         "values only as UTF-8 text, so send it UTF-8 or percent-encoded", code="invalid_header")
    return PendingBody(load)


#: the longest body a caller may declare: what the audit row's ``request_bytes`` (a bigint) holds. A
#: longer one (llhttp takes lengths up to 2**64 - 1) once made a row PostgreSQL refused
CONTENT_LENGTH_MAX = BIGINT_MAX


def _refuse_length() -> PendingBody:
    async def load(inp: CallInput) -> CallInput:
        raise BadRequest(f"the declared Content-Length is over {CONTENT_LENGTH_MAX} bytes", code="body_too_large")
    return PendingBody(load)


def _refuse_coding(te: str) -> PendingBody:
    async def load(inp: CallInput) -> CallInput:
        # aiohttp's parser already refused chunked-not-last, a repeated header and a coding without
        # chunked; what reaches here is "<coding>, chunked". Relaying it as plain chunked sent the
        # upstream gzip bytes with no coding named. Relaying the coding instead is not safe either:
        # treg reads request bodies (a JSON binding injects into one, deny rules read a form's
        # _method) and cannot read a coded one, and a non-chunked transfer coding is the classic
        # request-smuggling spelling two servers frame differently (many answer it with 501). So
        # refused, before a byte goes upstream
        raise BadRequest(f"Transfer-Encoding: {te.strip()} is not supported: treg relays request bodies sent "
                         "with chunked alone (or a Content-Length); to send a compressed body, use "
                         "Content-Encoding, or X-Treg-Body-Encoding: gzip for treg to decode it",
                         code="transfer_coding_unsupported")
    return PendingBody(load)


def _exact_body(request: web.Request, declared: int) -> PendingBody:
    async def load(inp: CallInput) -> CallInput:
        return replace(inp, body=await _whole(request.content.readexactly(declared)))
    return PendingBody(load)


def _decoded_body(request: web.Request, encoding: str, declared: int | None) -> PendingBody:
    async def load(inp: CallInput) -> CallInput:
        limit = request.app[SERVICES].settings.body_decode_max_bytes
        if declared is not None and declared > limit:
            raise BadRequest(f"the encoded body is larger than {limit} bytes", code="body_too_large")
        body = _decode_body(encoding, await _whole(_read_bounded(request, limit)), limit)
        return replace(inp, body=body, content_length=len(body))
    return PendingBody(load)


def _session_cookie(cookie: str, csrf: str | None) -> SessionCookie | None:
    """The dashboard's session as the call's identity (Try-it), checked with its ``X-Treg-CSRF`` by
    treg/ui_sessions.py; the cookie itself never goes upstream (treg/call/headers.py scrubs it)."""
    for part in cookie.split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE and value:
            return SessionCookie(value.strip(), csrf)
    return None


def intake(request: web.Request, surface: str, call_id: str) -> CallInput:
    """The request as a CallInput, without reading or decoding anything that could cost treg work: a
    body to read (or a refusal) is a :class:`PendingBody` the pipeline runs once the caller is identified.
    Synchronous: it awaits nothing, and a coroutine per call costs a frame it never needs."""
    if len(request.method) > METHOD_MAX:
        # refused as llhttp refuses it (unrecorded, before the caller is known); only aiohttp's pure-Python
        # parser lets such a token through, and the call's audit row could not hold it
        raise BadRequest(f"an HTTP method longer than {METHOD_MAX} characters", code="invalid_method")
    raw_path = request.raw_path
    if not raw_path.startswith("/"):
        # absolute-form (GET http://treg/call/... HTTP/1.1, RFC 9112 3.2.2): only its path and query count
        raw_path = "/" + raw_path.split("://", 1)[-1].partition("/")[2]
    path, _, query = raw_path.partition("?")
    rest = path[len(SURFACE_PREFIXES[surface]):]
    headers, ctl, not_utf8 = read_headers(request.raw_headers)
    cl, te = ctl.content_length, ctl.transfer_encoding
    token = ctl.token
    if token is None and ctl.cookie is not None and surface != "redirect":
        token = _session_cookie(ctl.cookie, ctl.csrf)
    declared = None if cl is None else int(cl)  # aiohttp's parser already refused a malformed length
    body: object
    if not_utf8 is not None:
        body = _refuse_header(not_utf8)
    elif te is not None and te.strip().lower() != "chunked" and \
            [c.strip().lower() for c in te.split(",")] != ["chunked"]:
        body = _refuse_coding(te)
    elif declared is not None and declared > CONTENT_LENGTH_MAX:
        body = _refuse_length()
    elif ctl.body_encoding is not None:
        body = _decoded_body(request, ctl.body_encoding, declared)
    elif declared is None and (te is None or "chunked" not in te.lower()):
        body = None
    elif declared is not None and declared <= evidence.REQUEST_BODY_MAX:
        body = _exact_body(request, declared) if declared else b""
    else:
        body = _caller_stream(request)  # lazy: nothing is read until the upstream send pulls it
    # the required fields by position (in CallInput's order): matching thirteen keywords cost more than
    # building the value (docs/performance.md, round 6)
    return CallInput(call_id, surface, request.method, rest, query, headers, token, ctl.org_hint,
                     body, declared, tag=ctl.tag, idempotency_key=ctl.idempotency_key,  # type: ignore[arg-type]
                     user_agent=ctl.user_agent, peer=request.remote)


async def handle(request: web.Request, surface: str) -> web.StreamResponse:
    svc = request.app[SERVICES]
    call_id = new_call_id()
    # render_failure adds these to any refusal, 401 included
    request[ERROR_HEADERS] = {"X-Treg-Call-Id": call_id}
    if transport := request.transport:  # the address URLs treg builds name, without TREG_PUBLIC_URL
        note_listen(transport.get_extra_info("sockname"))
    inp = intake(request, surface, call_id)
    outcome = await service.execute(svc, inp)
    resp = RelayResponse(outcome, request) if outcome.raw_headers is None else RawHeadResponse(outcome, request)
    resp.headers.extend(outcome.headers)
    resp.headers["X-Treg-Call-Id"] = call_id
    await drain(outcome, resp)
    return resp


def _surface_route(surface: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def route(request: web.Request) -> web.StreamResponse:
        try:
            return await handle(request, surface)
        except Exception as exc:  # noqa: BLE001 (rendered here: no middleware frame on the hot path)
            return render_failure(request, exc)
    route.__name__ = route.__qualname__ = f"{surface}_route"
    return route


# [\s\S]: match_info is percent-decoded, and a target such as /call/%0d%0a... must still reach the call
# surface (a clear 404 with X-Treg-Call-Id), not fall through the router as "no route" ('.' stops at \n).
# /redirect/: a relayed redirect to another host, followed: relayed there with no credential
# (treg/call/redirects.py); /table/: the catalog call answered as a table (treg/call/table.py)
for _surface, _prefix in SURFACE_PREFIXES.items():
    routes.route("*", _prefix + "{rest:[\\s\\S]*}")(_surface_route(_surface))
