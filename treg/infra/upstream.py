"""Upstream I/O: the one shared aiohttp ClientSession and a faithful send.

What the session must never do on its own: decompress (``auto_decompress=False``), follow redirects,
add headers the caller did not send (``skip_auto_headers``; no ``Content-Length: 0`` on a bodyless
POST: :class:`FaithfulRequest`), re-quote the URL (``yarl.URL(..., encoded=True)``), keep cookies.
aiohttp errors are mapped to :class:`~treg.errors.GatewayFailed` here, never leaking to handlers.
"""

from __future__ import annotations

import asyncio
import logging
from contextvars import ContextVar
from dataclasses import field
from types import MappingProxyType
from typing import Any, AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable, Mapping, NamedTuple

import aiohttp
from aiohttp import hdrs
from aiohttp.client_reqrep import ClientRequest
from multidict import CIMultiDict
from yarl import URL

from treg.errors import BadRequest, GatewayFailed, TregError
from treg.frozen import frozen_value
from treg.infra.lean_request import lean_request, usable as lean_usable
from treg.infra.read_deadlines import DeadlineConnector
from treg.memo import BoundedMemo, memoized
from treg.settings import Settings

log = logging.getLogger(__name__)


#: the exact header list of the request being sent (set by :func:`send` around ``session.request``)
_EXACT_HEADERS: ContextVar[tuple[tuple[str, str], ...] | None] = ContextVar("treg_exact_headers", default=None)


class FaithfulRequest(ClientRequest):
    """aiohttp's request, minus two liberties it takes:

    * the ``Content-Length: 0`` it adds to a bodyless POST/PUT/PATCH/DELETE: a request the caller sent
      without a body goes upstream without body framing;
    * the session's header merge, which replaces every earlier value when a duplicate name comes with a
      different spelling (``X-Multi: 1`` then ``x-multi: 2`` arrived as one ``x-multi: 2``): the headers
      are taken from :func:`send`'s exact list instead, every pair in order, names as spelled.
    """

    def update_headers(self, headers: Any) -> None:
        exact = _EXACT_HEADERS.get()
        if exact is None:
            super().update_headers(headers)
            return
        super().update_headers(None)  # the Host of the URL
        headers = self.headers
        headers.extend(exact)  # every pair in order, names as spelled
        if len(headers.getall("Host", ())) > 1:
            # a Host of the exact list (a provider's pin) replaces the URL's, in its place at the front
            host = [v for k, v in exact if k.lower() == "host"][-1]
            headers["Host"] = host

    def update_auto_headers(self, skip_auto_headers: Any) -> None:
        # aiohttp sorts the session's skip list into a new CIMultiDict and copies the headers on every
        # request, only to add no header at all when that list names each one it would add (treg's session
        # does: User-Agent, Accept, Accept-Encoding). The same verdict, its map made once per skip list (a
        # speed trick: docs/performance.md round 13); aiohttp only reads ``_skip_auto_headers`` after this
        skip = _SKIP_MAPS.get(skip_auto_headers) if isinstance(skip_auto_headers, frozenset) else None
        if skip is None and isinstance(skip_auto_headers, frozenset):
            skip = _SKIP_MAPS.put(skip_auto_headers, _skip_map(skip_auto_headers, self.DEFAULT_HEADERS))
        if skip is not None and skip[1]:
            self._skip_auto_headers = skip[0]
            return
        super().update_auto_headers(skip_auto_headers)

    def update_body_from_data(self, body: Any, _stacklevel: int = 3) -> None:
        if body is None:
            self._body = None
            return
        super().update_body_from_data(body, _stacklevel=_stacklevel + 1)


def _skip_map(skip: frozenset[str], defaults: Mapping[str, str]) -> tuple[CIMultiDict[None], bool]:
    """aiohttp's map of a skip list, and whether it names every header aiohttp would add on its own."""
    mapped: CIMultiDict[None] = CIMultiDict((name, None) for name in sorted(skip))
    return mapped, all(name in mapped for name in (*defaults, hdrs.USER_AGENT))


#: a session's skip list → (its map, it covers every automatic header); a session has one list
_SKIP_MAPS: BoundedMemo[frozenset[str], tuple[CIMultiDict[None], bool]] = BoundedMemo(16)


class NotServing:
    """The upstream session of a process that sends nothing upstream: a CLI command, a domain test, an
    app before its session opens or after it closed. Every request is refused with 502
    ``shutting_down`` before anything is dialled, so no use site asks whether a session is there.

    Stands in for an :class:`aiohttp.ClientSession` (treg's upstream session and the aggregators' one)
    only where treg sends: ``request``, called as ``await`` or ``async with``."""

    closed = True

    def request(self, method: str, url: Any, **kwargs: Any) -> Any:
        raise GatewayFailed("treg takes no new call: it is shutting down, or this process serves none",
                            code="shutting_down", blame="treg")

    async def close(self) -> None:
        pass  # nothing was opened


def create_session(settings: Settings, resolver: aiohttp.abc.AbstractResolver | None = None) -> aiohttp.ClientSession:
    # the read timeout (sock_read below) is kept by one ticker, not a loop timer per read (read_deadlines.py)
    connector = DeadlineConnector(read_timeout_s=settings.upstream_read_timeout_s,
                                  limit=settings.upstream_pool_size, limit_per_host=0, resolver=resolver,
                                  use_dns_cache=False, enable_cleanup_closed=True, keepalive_timeout=30)
    timeout = aiohttp.ClientTimeout(total=None, connect=settings.upstream_connect_timeout_s,
                                    sock_read=settings.upstream_read_timeout_s)
    return aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False,
                                 skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
                                 cookie_jar=aiohttp.DummyCookieJar(), raise_for_status=False, trust_env=False,
                                 requote_redirect_url=False, request_class=FaithfulRequest)


def header_text(raw: bytes) -> str:
    """A header name or value as text aiohttp's writers re-encode to the same bytes: they write UTF-8,
    so UTF-8 (and ASCII) is decoded as UTF-8 — read as latin-1 it went out double-encoded. Bytes that
    are not UTF-8 (legacy obs-text) have no such text; they are read as latin-1, never dropped."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


#: the raw bytes of an answer's headers that are not UTF-8, by their text pair; None: all are UTF-8
RawHeaders = Mapping[tuple[str, str], tuple[bytes, bytes]]


def header_pairs(raw: Iterable[tuple[bytes, bytes]]) -> tuple[tuple[tuple[str, str], ...], RawHeaders | None]:
    """Raw header pairs as text (see :func:`header_text`), and the raw bytes of each pair that is not
    UTF-8, by its text (None: all are), so the edge can send those bytes on unchanged."""
    raw = tuple(raw)
    try:
        return tuple([(k.decode(), v.decode()) for k, v in raw]), None  # the usual case, in one pass
    except UnicodeDecodeError:
        pairs = tuple([(header_text(k), header_text(v)) for k, v in raw])
        kept = {}
        for pair, (k, v) in zip(pairs, raw):
            if pair[0].encode() != k or pair[1].encode() != v:
                kept[pair] = (k, v)
        return pairs, MappingProxyType(kept)


@frozen_value
class UpstreamRequest:
    """What goes upstream, injected credentials included: nothing of it in a repr."""

    method: str
    url: str = field(repr=False)  # fully encoded, exactly what goes on the request line (plus scheme/host)
    headers: tuple[tuple[str, str], ...] = field(repr=False)
    #: None: no body at all; bytes: a buffered body; else an async iterable streamed through
    body: bytes | AsyncIterable[bytes] | None = field(default=None, repr=False)


class CloseOnce:
    """The one close of an upstream response, shared by the body iterator and the handler's cleanup:
    a full read releases the connection for reuse; anything else (disconnect, error, cancellation)
    closes it. Whichever comes first wins; later calls are no-ops."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.closed = False
        self.reused: bool | None = None
        self.calls = 0

    def close(self, *, complete: bool = False) -> None:
        self.calls += 1
        if self.closed:
            return
        self.closed = True
        self.reused = complete
        if complete:
            self._resp.release()
        else:
            self._resp.close()


@frozen_value
class UpstreamResponse:
    status: int
    reason: str
    headers: tuple[tuple[str, str], ...] = field(repr=False)  # an upstream may echo the key in one
    body: AsyncIterator[bytes]
    closer: CloseOnce = field(repr=False)
    #: case-insensitive lookup of the same headers (aiohttp's; text of non-UTF-8 bytes is surrogate-escaped).
    #: It holds every name ``headers`` holds (a ``replace`` that filters the headers may keep it): a name
    #: absent here is absent there, which lets a stage skip a look at each header (a speed trick). No default:
    #: an empty one would say "no Content-Encoding" of a coded answer
    index: Mapping[str, str] = field(repr=False)
    #: the whole body when it had all arrived with the head (``body`` then replays it); None: it streams
    whole: bytes | None = field(default=None, repr=False)
    #: the raw bytes of the headers that are not UTF-8, by their text pair (:func:`header_pairs`)
    raw_headers: RawHeaders | None = field(default=None, repr=False)

    def close(self, *, complete: bool = False) -> None:
        self.closer.close(complete=complete)

    def header(self, name: str) -> str | None:
        """The first value of ``name``, for framing and presence checks (not for relaying)."""
        return self.index.get(name)


def parse_url(url: str) -> URL:
    """The upstream URL as sent (``encoded=True``: nothing re-quoted); a URL yarl refuses (a port out of
    range, a broken IPv6 literal) is the caller's 502, never an unexpected error.

    A URL with no query and no ``@`` is memoized (a URL is immutable; a refusal is not kept): calls to
    one endpoint then parse it once instead of running yarl's parser with the CPU's caches cold on every
    call (docs/performance.md). A query may carry an injected key and ``@`` credentials: never kept."""
    if "?" in url or "@" in url:
        return _parse_url(url)
    return _parse_url_memo(url)


def _parse_url(url: str) -> URL:
    try:
        return URL(url, encoded=True)
    except (ValueError, TypeError) as exc:
        raise GatewayFailed(f"the upstream URL is not valid: {exc}", code="invalid_upstream_url", blame="caller") from exc


_parse_url_memo = memoized(1024)(_parse_url)


class DialKey(NamedTuple):
    """Where a connection goes: what aiohttp's connector keys and dials by."""

    scheme: str
    host: str  # yarl's raw_host, lower-cased (an IPv6 literal without brackets)
    port: int | None  # the effective port (80/443 when the URL names none)


def dial_key(url: URL) -> DialKey:
    return DialKey(url.scheme, (url.raw_host or "").lower(), url.port)


def map_client_error(exc: BaseException, url: str) -> TregError:
    """An aiohttp failure as a treg 502 with a sentence; an SSRF refusal raised by our resolver is
    unwrapped so the caller sees what treg refused and why."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, TregError):
            return cause
        cause = cause.__cause__ or cause.__context__
        if cause is exc:
            break
    host = URL(url, encoded=True).host
    if isinstance(exc, asyncio.TimeoutError):
        return GatewayFailed(f"the upstream {host} did not answer in time", code="upstream_timeout")
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return GatewayFailed(f"the upstream host {host} could not be resolved", code="dns_failed")
    if isinstance(exc, aiohttp.ClientConnectorError):
        return GatewayFailed(f"could not connect to the upstream {host}", code="upstream_unreachable")
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return GatewayFailed(f"the upstream {host} closed the connection without answering",
                             code="upstream_disconnected")
    if isinstance(exc, aiohttp.ClientResponseError):  # aiohttp's parser refused the answer's head
        return GatewayFailed(f"the upstream {host} answered with malformed HTTP: {exc.message}",
                             code="upstream_bad_response")
    if isinstance(exc, aiohttp.InvalidURL):
        return GatewayFailed(f"the upstream URL is not valid: {exc}", code="invalid_upstream_url", blame="caller")
    return GatewayFailed(f"the upstream {host} failed: {type(exc).__name__}", code="upstream_unreachable")


async def _iterate(resp: aiohttp.ClientResponse, closer: CloseOnce) -> AsyncIterator[bytes]:
    """The body as it arrives: each piece is what aiohttp buffered since the last (``readany``), not
    sliced into 64 KiB copies (``iter_chunked``) behind a second iterator. aiohttp stops reading the
    socket past its buffer's high-water mark, so a piece stays bounded (a few hundred KiB); fewer,
    larger writes to the caller (docs/performance.md round 4)."""
    complete = False
    read = resp.content.readany
    try:
        while data := await read():
            yield data
        complete = True
    except aiohttp.ClientError as exc:
        raise GatewayFailed(f"the upstream stream broke mid-answer: {type(exc).__name__}",
                            code="upstream_stream_error") from exc
    finally:
        closer.close(complete=complete)


class InHand:
    """A body already in hand as the stream of one piece (none when empty).

    Not an async generator, on purpose (a speed trick: docs/performance.md, round 14): an edge takes such
    a body whole and drops its stream unread, and Python 3.11 finalizes a dropped generator by entering its
    frame to raise ``GeneratorExit`` there, started or not (~2 k instructions a call)."""

    __slots__ = ("_data",)

    def __init__(self, data: bytes) -> None:
        self._data = data

    def __aiter__(self) -> "InHand":
        return self

    async def __anext__(self) -> bytes:
        data = self._data
        if not data:
            raise StopAsyncIteration
        self._data = b""
        return data


async def send(session: "aiohttp.ClientSession | NotServing", req: UpstreamRequest, *,
               on_connect: Callable[[], Awaitable[None]] | None = None, url: URL | None = None) -> UpstreamResponse:
    """Send ``req`` and return as soon as the status line and headers arrived; the body streams.
    ``url``: ``req.url`` already parsed (``URL(req.url, encoded=True)``), to parse it once per call."""
    exact = _EXACT_HEADERS.set(req.headers)
    if url is None:
        url = URL(req.url, encoded=True)
    # FaithfulRequest takes the headers from the exact list, so the session's own merge of them (a Python
    # loop per header) is skipped; except with credentials in the URL, where aiohttp must see the headers
    # to refuse an Authorization beside them (as it always did) instead of overwriting it
    merged = req.headers if url.raw_user is not None or url.raw_password is not None else None
    try:
        if lean_usable(session, url):  # the session's own parts without its general path (lean_request.py)
            resp = await lean_request(session, req.method, url, req.body)  # type: ignore[arg-type]
        else:
            resp = await session.request(req.method, url, headers=merged, data=req.body, allow_redirects=False,
                                         compress=None)
    except TregError:
        raise
    except ValueError as exc:
        if merged is not None and "AUTHORIZATION" in str(exc).upper():
            # aiohttp refuses Basic auth from the URL's user:pw@ beside an Authorization header
            raise BadRequest("the URL carries credentials (user:password@) and the request already has an "
                             "Authorization header (the caller's or the tool's): remove them from the URL",
                             code="url_credentials_conflict") from exc
        raise map_client_error(exc, req.url) from exc
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        raise map_client_error(exc, req.url) from exc
    finally:
        _EXACT_HEADERS.reset(exact)
    closer = CloseOnce(resp)
    headers, raw = header_pairs(resp.raw_headers)
    content = resp.content
    if content.is_eof() and content.exception() is None:
        # the whole body came with the head (small answers, HEAD, 204/304): take what already arrived,
        # nothing is waited for, and skip the stream machinery (docs/performance.md)
        whole = content.read_nowait()
        closer.close(complete=True)
        return UpstreamResponse(resp.status, resp.reason or "", headers, InHand(whole), closer, resp.headers, whole,
                                raw)
    # positional (status, reason, headers, body, closer, index): one is built per call
    return UpstreamResponse(resp.status, resp.reason or "", headers, _iterate(resp, closer), closer, resp.headers,
                            None, raw)
