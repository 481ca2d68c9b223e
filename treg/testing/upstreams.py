"""Raw-socket upstreams that record exactly the bytes they receive (``RawUpstream``), and a pair of them on
one port of 127.0.0.1 and 127.0.0.2 (``upstream_pair``) for the SSRF guard's tests."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Awaitable, Callable

from treg.testing.client import HeaderLookup


@dataclass
class Exchange(HeaderLookup):
    """One request as it arrived on the wire."""

    raw: bytes
    request_line: str
    headers: list[tuple[str, str]]
    body: bytes
    #: the connection's streams, for a responder that writes (slowly, partly) itself and returns None
    reader: Any = field(default=None, repr=False, compare=False)
    writer: Any = field(default=None, repr=False, compare=False)
    #: which connection (1-based, in accept order) carried this request
    connection: int = 0

    @property
    def method(self) -> str:
        return self.request_line.split(" ", 1)[0]

    @property
    def target(self) -> str:
        return self.request_line.split(" ")[1]


Responder = Callable[[Exchange], Awaitable[bytes] | bytes]


def http_response(status: int = 200, body: bytes = b"ok", headers: list[tuple[str, str]] | None = None,
                  reason: str = "OK", length: bool = True) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}"]
    for k, v in headers or []:
        lines.append(f"{k}: {v}")
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@dataclass
class RawUpstream:
    """An HTTP/1.1 server on a raw socket: records exactly the bytes it receives and answers with the
    bytes a responder returns (default: 200 ``ok``). Understands Content-Length and chunked bodies."""

    responder: Responder | None = None
    exchanges: list[Exchange] = field(default_factory=list)
    #: a server SSLContext (treg.testing.tls): the upstream speaks https
    ssl: Any = None
    connections: int = 0
    #: connections the client closed while idle (between requests)
    peer_closes: int = 0
    _server: asyncio.AbstractServer | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        return f"{'https' if self.ssl is not None else 'http'}://127.0.0.1:{self.port}"

    async def start(self) -> "RawUpstream":
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.ssl)
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def __aenter__(self) -> "RawUpstream":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def _read_request(self, reader: asyncio.StreamReader) -> Exchange | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        text = head.decode("latin-1")
        lines = text.split("\r\n")
        headers = []
        for line in lines[1:]:
            if line:
                k, _, v = line.partition(":")
                headers.append((k, v.strip()))
        raw = head
        body = b""
        lookup = {k.lower(): v for k, v in headers}
        if "content-length" in lookup:
            body = await reader.readexactly(int(lookup["content-length"]))
            raw += body
        elif lookup.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size_line = await reader.readuntil(b"\r\n")
                raw += size_line
                size = int(size_line.split(b";")[0].strip(), 16)
                chunk = await reader.readexactly(size + 2)
                raw += chunk
                body += chunk[:-2]
                if size == 0:
                    break
        return Exchange(raw=raw, request_line=lines[0], headers=headers, body=body)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn_no = self.connections
        try:
            while True:
                ex = await self._read_request(reader)
                if ex is None:
                    self.peer_closes += 1  # the client (treg) closed its end between requests
                    break
                ex.reader, ex.writer, ex.connection = reader, writer, conn_no
                self.exchanges.append(ex)
                out = self.responder(ex) if self.responder else http_response()
                if asyncio.iscoroutine(out):
                    out = await out
                if out is None:  # the responder wrote (or dropped) the connection itself
                    break
                writer.write(out)
                await writer.drain()
                if ex.header("connection") == "close":
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    @property
    def last(self) -> Exchange:
        return self.exchanges[-1]


@contextlib.asynccontextmanager
async def raw_upstream(responder: Responder | None = None, *, ssl: Any = None) -> AsyncIterator[RawUpstream]:
    up = RawUpstream(responder, ssl=ssl)
    await up.start()
    try:
        yield up
    finally:
        await up.close()


#: ``TREG_SSRF_ALLOW`` exempting 127.0.0.1 alone: with :func:`upstream_pair`, 127.0.0.2 stands for an
#: internal address a call must never reach
ALLOW_ONE = ("127.0.0.1/32",)


@dataclass
class BoundUpstream(RawUpstream):
    """RawUpstream on a chosen loopback address (and port)."""

    host: str = "127.0.0.1"
    want_port: int = 0

    async def start(self) -> "BoundUpstream":
        self._server = await asyncio.start_server(self._handle, self.host, self.want_port)
        return self


@contextlib.asynccontextmanager
async def upstream_pair() -> AsyncIterator[tuple[BoundUpstream, BoundUpstream]]:
    """Servers on 127.0.0.1:P and 127.0.0.2:P (one port, so one URL could reach either)."""
    for _ in range(20):  # the port 127.0.0.2 got may be taken on 127.0.0.1: try another, bounded
        inside = await BoundUpstream(host="127.0.0.2").start()
        try:
            allowed = await BoundUpstream(host="127.0.0.1", want_port=inside.port).start()
        except OSError:
            await inside.close()
            continue
        try:
            yield allowed, inside
        finally:
            await allowed.close()
            await inside.close()
        return
    raise RuntimeError("no port free on both 127.0.0.1 and 127.0.0.2")
