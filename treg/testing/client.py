"""A raw-socket client: requests sent as exact bytes, answers read with their framing kept."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any


class HeaderLookup:
    """Case-insensitive reads of a ``headers`` list of (name, value) pairs, kept in wire order."""

    headers: list[tuple[str, str]]

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None

    def header_all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]


@dataclass
class RawReply(HeaderLookup):
    """One HTTP/1.1 answer as it came off the wire (framing kept: ``chunked`` says how the body came)."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    chunked: bool
    head: bytes

    def json(self) -> Any:
        import json

        return json.loads(self.body)


def raw_request_bytes(method: str, target: str, headers: list[tuple[str, str]] | None = None,
                      body: bytes | None = None, *, chunks: list[bytes] | None = None) -> bytes:
    """Request bytes exactly as given: no header is added except ``Host`` (when absent), and
    ``Content-Length`` only when ``body`` is given and no length/encoding header is; ``chunks`` sends a
    chunked body (the caller adds ``Transfer-Encoding: chunked``)."""
    headers = list(headers or [])
    names = {k.lower() for k, _ in headers}
    if "host" not in names:
        headers.insert(0, ("Host", "127.0.0.1"))
    if body is not None and "content-length" not in names and "transfer-encoding" not in names:
        headers.append(("Content-Length", str(len(body))))
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    out = head.encode("latin-1")
    if chunks is not None:
        for c in chunks:
            out += f"{len(c):x}\r\n".encode() + c + b"\r\n"
        out += b"0\r\n\r\n"
    elif body is not None:
        out += body
    return out


async def read_reply(reader: asyncio.StreamReader, *, head_request: bool = False) -> RawReply:
    """One final answer; interim 1xx answers (``100 Continue``) before it are skipped."""
    head = await reader.readuntil(b"\r\n\r\n")
    for _ in range(10):  # bounded: a peer sending endless 1xx is broken
        if not head.startswith(b"HTTP/1.1 1") or head.startswith(b"HTTP/1.1 101"):
            break
        head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    _, status, reason = (lines[0].split(" ", 2) + [""])[:3]
    headers = []
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            headers.append((k, v.strip()))
    lookup = {k.lower(): v for k, v in headers}
    code = int(status)
    body, chunked = b"", False
    if head_request or code in (204, 304) or 100 <= code < 200:
        pass
    elif "chunked" in lookup.get("transfer-encoding", "").lower():
        chunked = True
        while True:  # bounded by the peer's final 0-size chunk (or EOF: IncompleteReadError)
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip(), 16)
            data = await reader.readexactly(size + 2)
            body += data[:-2]
            if size == 0:
                break
    elif "content-length" in lookup:
        body = await reader.readexactly(int(lookup["content-length"]))
    else:
        body = await reader.read()  # until the server closes
    return RawReply(code, reason, headers, body, chunked, head)


async def raw_exchange(port: int, data: bytes, *, head_request: bool = False,
                       timeout: float = 15.0, source: str | None = None, tls: Any = None) -> RawReply:
    """Send ``data`` on a fresh connection to 127.0.0.1:``port`` and read one answer. ``source``: the local
    address to connect from (another loopback address, ``127.0.0.2``, is another peer to the server);
    ``tls``: an ``ssl.SSLContext`` to speak TLS with (the server's certificate names 127.0.0.1)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls,
                                                   local_addr=(source, 0) if source else None)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(read_reply(reader, head_request=head_request), timeout)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
