"""The lean request (treg/infra/lean_request.py) stands in for ``ClientSession.request`` on a call: the same
bytes on the wire, the same retry of an idempotent method on a kept-alive connection the upstream had
closed (and none of a POST, nor of a body already streamed), the same errors, and ``session.request``
wherever the session or the URL is outside what it covers."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import client_exceptions
from yarl import URL

from treg import membership
from treg.infra import upstream
from treg.infra.lean_request import lean_request, usable
from treg.keys import SERVICES
from treg.settings import load
from treg.testing import Exchange, Gateway, http_response, raw_upstream


def _session() -> aiohttp.ClientSession:
    return upstream.create_session(load(environ={}))


def drop_second_on_first_connection(ex: Exchange) -> bytes | None:
    """The first connection answers its first request (kept alive) and then closes on the next one
    without answering: what an upstream whose idle timeout just fired does to a pooled connection."""
    if ex.connection == 1 and sum(1 for _ in _on_connection(ex)) > 1:
        ex.writer.close()
        return None
    return http_response(200, b"ok:" + ex.body)


def _on_connection(ex: Exchange):
    return [e for e in ex.upstream.exchanges if e.connection == ex.connection]


@pytest.fixture
async def relay(aiohttp_client, make_app):
    client = await aiohttp_client(make_app(ssrf_allow=("127.0.0.0/8",)))
    return Gateway(client, await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test"))


async def _tool(relay: Gateway, url: str) -> None:
    sid = await relay.secret("sk_live_lean")
    await relay.tool("up", url, [{"location": "header", "name": "Authorization", "format": "Bearer {secret}",
                                  "secret_id": sid}])


def _recording(responder):
    """The raw upstream's exchanges reachable from the responder (which connection saw what)."""
    holder: dict[str, object] = {}

    def respond(ex: Exchange):
        ex.upstream = holder["up"]  # type: ignore[attr-defined]
        return responder(ex)
    return holder, respond


@pytest.mark.parametrize("method, body", [("GET", b""), ("PUT", b"the same body twice"), ("DELETE", b"")])
async def test_an_idempotent_call_on_a_closed_kept_alive_connection_is_sent_again_once(relay, method, body):
    holder, respond = _recording(drop_second_on_first_connection)
    async with raw_upstream(respond) as up:
        holder["up"] = up
        await _tool(relay, up.url)
        first = await relay.call(method, "/call/up/a", data=body or None)
        assert first.status == 200 and await first.read() == b"ok:" + body
        again = await relay.call(method, "/call/up/b", data=body or None)
        assert again.status == 200, await again.text()
        assert await again.read() == b"ok:" + body
        sent = [(e.connection, e.method, e.target, e.body) for e in up.exchanges]
        # the second call reached the upstream twice: on the pooled connection (dropped), then a new one
        assert sent == [(1, method, "/a", body), (1, method, "/b", body), (2, method, "/b", body)]
        assert all(e.header("Authorization") == "Bearer sk_live_lean" for e in up.exchanges)


async def test_a_post_on_a_closed_kept_alive_connection_is_not_sent_again(relay):
    holder, respond = _recording(drop_second_on_first_connection)
    async with raw_upstream(respond) as up:
        holder["up"] = up
        await _tool(relay, up.url)
        assert (await relay.call("POST", "/call/up/a", data=b"1")).status == 200
        r = await relay.call("POST", "/call/up/b", data=b"2")
        assert r.status == 502
        assert (await r.json())["error"] == "upstream_disconnected"
        assert [(e.connection, e.target) for e in up.exchanges] == [(1, "/a"), (1, "/b")]


async def test_a_streamed_body_already_sent_is_not_sent_again(relay):
    """A PUT is idempotent, but a body streamed from the caller cannot be read twice: the call fails
    rather than sending the upstream an empty or partial body."""
    holder, respond = _recording(drop_second_on_first_connection)

    async def stream():
        for part in (b"a" * 70_000, b"b" * 70_000):  # over the size intake reads whole: streamed
            yield part

    async with raw_upstream(respond) as up:
        holder["up"] = up
        await _tool(relay, up.url)
        assert (await relay.call("GET", "/call/up/a")).status == 200
        r = await relay.call("PUT", "/call/up/b", data=stream())
        assert r.status == 502, await r.text()
        assert [(e.connection, e.target) for e in up.exchanges] == [(1, "/a"), (1, "/b")]


CASES = [
    ("GET", "/x?a=1&a=2", (("X-Multi", "1"), ("x-multi", "2"), ("Accept", "*/*")), None),
    ("POST", "/bodyless", (), None),
    ("POST", "/json", (("Content-Type", "application/json"), ("Content-Length", "7")), b'{"a":1}'),
    ("HEAD", "/head", (), None),
    ("DELETE", "/pinned", (("Host", "pinned.example"),), None),
]


@pytest.mark.parametrize("method, target, headers, body", CASES)
async def test_the_bytes_on_the_wire_are_session_request_s(method, target, headers, body):
    """The same UpstreamRequest sent through the lean path and through ``session.request`` reaches the
    upstream as the same bytes (names as spelled, duplicates, a pinned Host, no added framing)."""
    async with raw_upstream(lambda ex: http_response(200, b"" if ex.method == "HEAD" else b"ok")) as up:
        req = upstream.UpstreamRequest(method, up.url + target, headers, body)
        session = _session()
        try:
            url = URL(req.url, encoded=True)
            assert usable(session, url)
            lean = await upstream.send(session, req, url=url)
            lean.close()
            token = upstream._EXACT_HEADERS.set(req.headers)
            try:
                general = await session.request(method, url, data=body, allow_redirects=False, compress=None)
            finally:
                upstream._EXACT_HEADERS.reset(token)
            general.close()
        finally:
            await session.close()
        assert lean.status == general.status == 200
        assert len(up.exchanges) == 2
        assert up.exchanges[0].raw == up.exchanges[1].raw


async def test_errors_are_the_session_s():
    session = _session()
    try:
        for url in (URL("ftp://127.0.0.1/x"), URL("http:///x", encoded=True)):
            with pytest.raises(client_exceptions.ClientError) as lean:
                await lean_request(session, "GET", url, None)
            with pytest.raises(client_exceptions.ClientError) as general:
                await session.request("GET", url, allow_redirects=False)
            assert type(lean.value) is type(general.value)
        # nothing listens there: a connection error, never retried
        with pytest.raises(client_exceptions.ClientConnectorError):
            await lean_request(session, "GET", URL(f"http://127.0.0.1:{_closed_port()}/x"), None)
    finally:
        await session.close()
    with pytest.raises(RuntimeError, match="closed"):
        await lean_request(session, "GET", URL("http://127.0.0.1/x"), None)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_what_it_does_not_cover_goes_through_session_request():
    session = _session()
    try:
        plain = URL("http://127.0.0.1:1/x")
        assert usable(session, plain)
        # user:pw@ becomes Basic auth in aiohttp's general path (and is refused beside an Authorization)
        assert not usable(session, URL("http://u:p@127.0.0.1:1/x"))
        assert not usable(session, URL("http://u@127.0.0.1:1/x"))
        assert not usable(upstream.NotServing(), plain)
    finally:
        await session.close()
    traced = aiohttp.ClientSession(trace_configs=[aiohttp.TraceConfig()], timeout=aiohttp.ClientTimeout(total=None),
                                   cookie_jar=aiohttp.DummyCookieJar())
    jar = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
    timed = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5), cookie_jar=aiohttp.DummyCookieJar())
    try:
        assert not usable(traced, plain) and not usable(jar, plain) and not usable(timed, plain)
    finally:
        await asyncio.gather(traced.close(), jar.close(), timed.close())


SKIPS = [frozenset(), frozenset({"User-Agent"}), frozenset({"User-Agent", "Accept", "Accept-Encoding"}),
         frozenset({"user-agent", "ACCEPT", "accept-encoding", "Content-Type"})]
HEADER_SETS = [(), (("Accept", "text/plain"),), (("User-Agent", "sdk/1"), ("X-A", "1"), ("x-a", "2"))]


@pytest.mark.parametrize("skip", SKIPS + [None])
@pytest.mark.parametrize("headers", HEADER_SETS)
async def test_the_automatic_headers_are_aiohttp_s(skip, headers):
    """FaithfulRequest's ``update_auto_headers`` (its skip map made once per skip list) leaves a request
    with exactly the headers and the skip map aiohttp's own would, whatever the list covers."""
    from aiohttp.client_reqrep import ClientRequest
    from multidict import istr

    skip_arg = None if skip is None else frozenset(istr(h) for h in skip)
    token = upstream._EXACT_HEADERS.set(headers)
    try:
        for _ in range(2):  # the map made, then found
            ours = upstream.FaithfulRequest("GET", URL("http://upstream.test/x"), skip_auto_headers=skip_arg,
                                            loop=asyncio.get_running_loop())
            theirs = ClientRequest("GET", URL("http://upstream.test/x"), headers=headers, skip_auto_headers=skip_arg,
                                   loop=asyncio.get_running_loop())
            assert list(ours.headers.items()) == list(theirs.headers.items())
            assert ours.skip_auto_headers == theirs.skip_auto_headers
            assert (ours._skip_auto_headers is None) == (theirs._skip_auto_headers is None)
    finally:
        upstream._EXACT_HEADERS.reset(token)
