"""Test support shipped with treg: database provisioning, a raw-socket upstream recorder, helpers.

Third-party plugin authors can use these too (``from treg.testing import RawUpstream``). Everything
binds to 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets as pysecrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

import psycopg2
import psycopg2.extensions

from treg import hookimpl
from treg.infra import crypto, embedded_pg, migrate
from treg.settings import SecretStr, Settings, load

def template_db() -> str:
    # one template per test session: parallel sessions on one server must not drop each other's
    return f"treg_test_template_{os.getpid()}"


# -- databases ---------------------------------------------------------------------------------------

def test_home() -> Path:
    default = Path(__file__).resolve().parent.parent / ".test-home"
    return Path(os.environ.get("TREG_TEST_HOME", str(default))).expanduser()


def base_dsn() -> str:
    """The maintenance DSN of the test server: TREG_TEST_DATABASE_URL, else the embedded server."""
    url = os.environ.get("TREG_TEST_DATABASE_URL")
    if url:
        return url
    return embedded_pg.start(test_home() / "pg").base_dsn


def dsn_for(base: str, dbname: str) -> str:
    return psycopg2.extensions.make_dsn(base, dbname=dbname)


def _admin(base: str) -> Any:
    conn = psycopg2.connect(base)
    conn.autocommit = True
    return conn


def _drop_orphans(cur: Any) -> None:
    """Drop test databases whose session's process is gone (a killed run leaves them behind)."""
    cur.execute("SELECT datname FROM pg_database WHERE datname LIKE 'treg\\_test\\_template\\_%%' "
                "OR datname LIKE 'treg\\_t\\_%%'")
    for (name,) in cur.fetchall():
        pid = name.rsplit("_", 1)[-1] if name.startswith("treg_test_template_") else name.split("_")[2]
        if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def prepare_template(base: str) -> None:
    """(Re)create the migrated template database every test database is cloned from."""
    conn = _admin(base)
    try:
        with conn.cursor() as cur:
            _drop_orphans(cur)
            cur.execute(f'DROP DATABASE IF EXISTS "{template_db()}" WITH (FORCE)')
            cur.execute(f'CREATE DATABASE "{template_db()}"')
    finally:
        conn.close()
    migrate.upgrade(dsn_for(base, template_db()))


def drop_template(base: str) -> None:
    conn = _admin(base)
    try:
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{template_db()}" WITH (FORCE)')
    finally:
        conn.close()


@contextlib.contextmanager
def fresh_database(base: str) -> Iterator[str]:
    """A private database cloned from the template (each test isolated), dropped afterwards."""
    name = f"treg_t_{os.getpid()}_{pysecrets.token_hex(6)}"  # the pid lets a later session drop orphans
    conn = _admin(base)
    try:
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db()}"')
        yield dsn_for(base, name)
    finally:
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.close()


def make_settings(home: Path, **overrides: Any) -> Settings:
    base = load(environ={"TREG_HOME": str(home)})
    values: dict[str, Any] = {"secret_key": SecretStr(crypto.new_key_text()), "cache_ttl_s": 30.0,
                              "audit_flush_ms": 20}
    values.update(overrides)
    return base.replace(**values)


# -- a raw-socket upstream ---------------------------------------------------------------------------

@dataclass
class Exchange:
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

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None

    def header_all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]

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
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> "RawUpstream":
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
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
async def raw_upstream(responder: Responder | None = None) -> AsyncIterator[RawUpstream]:
    up = RawUpstream(responder)
    await up.start()
    try:
        yield up
    finally:
        await up.close()


# -- a raw-socket client ----------------------------------------------------------------------------

@dataclass
class RawReply:
    """One HTTP/1.1 answer as it came off the wire (framing kept: ``chunked`` says how the body came)."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    chunked: bool
    head: bytes

    def header(self, name: str) -> str | None:
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None

    def header_all(self, name: str) -> list[str]:
        return [v for k, v in self.headers if k.lower() == name.lower()]

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
                       timeout: float = 15.0) -> RawReply:
    """Send ``data`` on a fresh connection to 127.0.0.1:``port`` and read one answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(read_reply(reader, head_request=head_request), timeout)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


# -- a fake DNS server -------------------------------------------------------------------------------

@dataclass
class FakeDns:
    """An authoritative DNS server on 127.0.0.1 (UDP and TCP on one random port) answering A/AAAA from
    ``records`` ``{name: [(ip, ttl), ...]}`` (mutable while running), for ``TREG_DNS_NAMESERVERS``.

    Unknown names are NXDOMAIN; a known name without a record of the asked type is an empty answer with
    an SOA of ``negative_ttl`` (RFC 2308). ``cnames`` maps ``name -> (target, ttl)``. ``truncate_udp``
    answers every UDP query truncated (TC) so a client must retry over TCP; names in ``servfail`` get
    SERVFAIL, names in ``silent`` get no answer at all. Every query is recorded in ``queries`` as
    ``(name, type, transport)``.
    """

    records: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    cnames: dict[str, tuple[str, int]] = field(default_factory=dict)
    negative_ttl: int = 60
    truncate_udp: bool = False
    servfail: set[str] = field(default_factory=set)
    silent: set[str] = field(default_factory=set)
    queries: list[tuple[str, str, str]] = field(default_factory=list)
    _udp: asyncio.DatagramTransport | None = None
    _tcp: asyncio.AbstractServer | None = None

    @property
    def port(self) -> int:
        assert self._udp is not None
        return self._udp.get_extra_info("sockname")[1]

    @property
    def nameserver(self) -> str:
        """The ``ip:port`` to put in ``dns_nameservers``."""
        return f"127.0.0.1:{self.port}"

    def count(self, name: str, rdtype: str | None = None, transport: str | None = None) -> int:
        name = name.rstrip(".").lower()
        return sum(1 for n, t, tr in self.queries
                   if n == name and (rdtype is None or t == rdtype) and (transport is None or tr == transport))

    def answer(self, wire: bytes, transport: str) -> bytes | None:
        import dns.flags
        import dns.message
        import dns.rcode
        import dns.rdataclass
        import dns.rdatatype
        import dns.rrset

        query = dns.message.from_wire(wire)
        question = query.question[0]
        qname = question.name.to_text(omit_final_dot=True).lower()
        rdtype = dns.rdatatype.to_text(question.rdtype)
        self.queries.append((qname, rdtype, transport))
        if qname in self.silent:
            return None
        resp = dns.message.make_response(query)
        resp.flags |= dns.flags.AA
        if qname in self.servfail:
            resp.set_rcode(dns.rcode.SERVFAIL)
            return resp.to_wire()
        if transport == "udp" and self.truncate_udp:
            resp.flags |= dns.flags.TC
            return resp.to_wire()
        name = qname
        for _ in range(8):  # follow our own CNAMEs, bounded
            if name not in self.cnames:
                break
            target, ttl = self.cnames[name]
            resp.answer.append(dns.rrset.from_text(name + ".", ttl, "IN", "CNAME", target.rstrip(".") + "."))
            name = target.rstrip(".").lower()
        known = name in self.records
        want = 4 if question.rdtype == dns.rdatatype.A else 6 if question.rdtype == dns.rdatatype.AAAA else 0
        matching = [(ip, ttl) for ip, ttl in self.records.get(name, [])
                    if want and (":" in ip) == (want == 6)]
        if matching:
            ttl = min(t for _, t in matching)
            resp.answer.append(dns.rrset.from_text_list(name + ".", ttl, "IN", rdtype, [ip for ip, _ in matching]))
        else:
            if not known and not resp.answer:
                resp.set_rcode(dns.rcode.NXDOMAIN)
            zone = name.split(".", 1)[-1] + "." if "." in name else name + "."
            soa = f"ns.{zone} admin.{zone} 1 3600 600 86400 {self.negative_ttl}"
            resp.authority.append(dns.rrset.from_text(zone, self.negative_ttl, "IN", "SOA", soa))
        return resp.to_wire()

    async def start(self) -> "FakeDns":
        loop = asyncio.get_running_loop()
        fake = self

        class _Udp(asyncio.DatagramProtocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                self.transport = transport

            def datagram_received(self, data: bytes, addr: Any) -> None:
                try:
                    out = fake.answer(data, "udp")
                except Exception:  # a malformed query: no answer, like a real server under abuse
                    return
                if out is not None:
                    self.transport.sendto(out, addr)  # type: ignore[attr-defined]

        async def _tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    size = int.from_bytes(await reader.readexactly(2), "big")
                    out = fake.answer(await reader.readexactly(size), "tcp")
                    if out is None:
                        continue
                    writer.write(len(out).to_bytes(2, "big") + out)
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    writer.close()

        for _ in range(20):  # TCP must get the port UDP got; another process may hold it: try again
            transport, _proto = await loop.create_datagram_endpoint(_Udp, local_addr=("127.0.0.1", 0))
            self._udp = transport  # type: ignore[assignment]
            try:
                self._tcp = await asyncio.start_server(_tcp, "127.0.0.1", self.port)
                return self
            except OSError:
                transport.close()
        raise RuntimeError("FakeDns: no free port for UDP and TCP together")

    async def close(self) -> None:
        if self._udp is not None:
            self._udp.close()
        if self._tcp is not None:
            self._tcp.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._tcp.wait_closed(), 2)

    async def __aenter__(self) -> "FakeDns":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


# -- a treg under test, with its first org -----------------------------------------------------------

class Gateway:
    """A running treg (aiohttp TestClient on a real socket) with an org and its owner, plus helpers to
    set up members, secrets and tools through the management API."""

    def __init__(self, client: Any, org: dict[str, Any]) -> None:
        self.client = client
        self.org = org
        self.owner = {"X-Treg-Token": org["token"]}

    @property
    def services(self) -> Any:
        from treg.keys import SERVICES

        return self.client.app[SERVICES]

    async def api(self, method: str, path: str, *, as_: dict[str, str] | None = None, expect: int | None = None,
                  **kw: Any) -> Any:
        resp = await self.client.request(method, path, headers=as_ or self.owner, **kw)
        body = await resp.json() if resp.content_type == "application/json" else await resp.read()
        if expect is not None:
            assert resp.status == expect, (resp.status, body)
        return body

    async def secret(self, value: Any, name: str = "key", provider: str | None = None) -> str:
        body: dict[str, Any] = {"name": name, "value": value}
        if provider:
            body["provider"] = provider
        return (await self.api("POST", "/api/v1/secrets", json=body, expect=201))["id"]

    async def tool(self, name: str, base_url: str, bindings: list[dict[str, Any]] | None = None,
                   **extra: Any) -> dict[str, Any]:
        return await self.api("POST", "/api/v1/tools", json={"name": name, "base_url": base_url,
                                                             "bindings": bindings or [], **extra}, expect=201)

    async def member(self, email: str, role: str = "member", project_ids: list[str] | None = None) -> dict[str, Any]:
        out = await self.api("POST", "/api/v1/members", json={"email": email, "role": role,
                                                              "project_ids": project_ids}, expect=201)
        out["headers"] = {"X-Treg-Token": out["token"]}
        return out

    async def call(self, method: str, path: str, *, as_: dict[str, str] | None = None, **kw: Any) -> Any:
        headers = {**(as_ or self.owner), **kw.pop("headers", {})}
        return await self.client.request(method, path, headers=headers, **kw)

    async def raw(self, method: str, target: str, headers: list[tuple[str, str]] | None = None,
                  body: bytes | None = None, *, chunks: list[bytes] | None = None, auth: bool = True) -> "RawReply":
        """A call sent as exact bytes on a fresh socket (no client-added headers; the owner's token
        first unless ``auth`` is False), its answer read with framing kept."""
        hs = ([("X-Treg-Token", self.org["token"])] if auth else []) + list(headers or [])
        data = raw_request_bytes(method, target, hs, body, chunks=chunks)
        return await raw_exchange(self.client.port, data, head_request=method.upper() == "HEAD")

    async def calls(self, as_: dict[str, str] | None = None) -> list[dict[str, Any]]:
        return (await self.api("GET", "/api/v1/calls?limit=500", as_=as_, expect=200))["calls"]


# -- catalog providers for tests ---------------------------------------------------------------------

def example_provider(base_url: str, **over: Any) -> dict[str, Any]:
    """A provider dict (the plugin contract) named ``acme`` whose endpoints cover every price form,
    a retired row, an anonymous row and a strict-query row; ``base_url`` is the test upstream."""
    row = {
        "id": "acme",
        "base_url": base_url,
        "auth": [{"location": "header", "name": "Authorization", "format": "Bearer {secret}"}],
        "required_headers": {"X-Api-Version": "2025-11-01"},
        "endpoints": [
            {"id": "acme.items.get", "method": "GET", "path": "/items/{item_id}",
             "params": [{"name": "item_id", "in": "path", "required": True},
                        {"name": "fields", "in": "query", "enum": ["id", "all"]}],
             "price": {"per_call_micro": 2000}, "capability": "items.lookup"},
            {"id": "acme.items.cheap", "method": "GET", "path": "/cheap/{item_id}",
             "params": [{"name": "item_id", "in": "path", "required": True}],
             "price": {"per_call_micro": 500}, "capability": "items.lookup"},
            {"id": "acme.items.old", "method": "GET", "path": "/old", "params": [], "price": {"per_call_micro": 1},
             "status": "retired", "status_note": "v0 is gone", "superseded_by": "acme.items.get"},
            {"id": "acme.status", "method": "GET", "path": "/status", "params": [], "price": {"per_call_micro": 0},
             "platform_auth": "anonymous"},
            {"id": "acme.chat", "method": "POST", "path": "/chat", "params": [],
             "price": {"usage": [{"path": "usage.total_tokens", "micro_per_unit": 3}], "estimate_micro": 9000}},
            {"id": "acme.search", "method": "GET", "path": "/search",
             "params": [{"name": "q", "in": "query", "required": True}], "price": {"per_call_micro": 100},
             "strict_query": True},
            {"id": "acme.items.create", "method": "POST", "path": "/items",
             "params": [{"name": "name", "in": "body", "required": True},
                        {"name": "tags", "in": "body", "type": "array", "max_items": 2, "item_enum": ["a", "b"]}],
             "price": {"per_call_micro": 300}, "body_allowlist": True},
            {"id": "acme.items.legacy", "method": "GET", "path": "/legacy", "params": [],
             "price": {"per_call_micro": 50}, "capability": "items.lookup", "status": "broken",
             "status_note": "the provider turned it off"},
        ],
    }
    row.update(over)
    return row


class ProviderPlugin:
    """A plugin object declaring the given provider dicts (``make_app(extra_plugins=(ProviderPlugin([...]),))``)."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    @hookimpl
    def treg_register_providers(self) -> list[dict[str, Any]]:
        return self.rows
