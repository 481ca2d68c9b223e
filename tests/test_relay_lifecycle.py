"""Close-once: the upstream response is closed exactly once whichever way a relayed answer ends — a full
read (the connection is released and reused), a client disconnect, a stream error, a cancellation —
and the upstream connection ends up reused or closed accordingly.

Two servers are used: aiohttp's TestServer cancels a handler whose client went away
(``handler_cancellation=True``: the cancellation path), while ``treg serve`` runs with aiohttp's default
(no cancellation: the disconnect is seen as a failed write). Each case gets the server that exercises it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from treg import membership, testing
from treg.app import make_runner
from treg.keys import SERVICES
from treg.testing import http_response, raw_request_bytes, raw_upstream

BOUND = 10.0  # seconds any single wait may take before the test fails (a bound, not a timing)


async def wait_calls(gw: testing.Gateway, n: int) -> list[dict[str, Any]]:
    return await gw.wait_calls(n, bound=BOUND)


class StreamingUpstream:
    """A responder that sends the head and a first part, then waits for the test's go-ahead, then either
    drops the connection, or keeps sending until treg hangs up; it records whether treg closed."""

    def __init__(self, *, length: int = 10_000_000, then: str = "trickle") -> None:
        self.length = length
        self.then = then
        self.first_sent = asyncio.Event()
        self.go_on = asyncio.Event()
        self.treg_closed = asyncio.Event()

    async def __call__(self, ex: testing.Exchange) -> None:
        w, r = ex.writer, ex.reader
        w.write(f"HTTP/1.1 200 OK\r\nContent-Length: {self.length}\r\nContent-Type: text/plain\r\n\r\n".encode()
                + b"a" * 4096)
        await w.drain()
        self.first_sent.set()
        if self.then == "wait_for_eof":
            # send nothing more; treg must close on its own (cancellation)
            with contextlib.suppress(asyncio.TimeoutError, ConnectionError):
                if await asyncio.wait_for(r.read(1), BOUND) == b"":
                    self.treg_closed.set()
            return None
        await asyncio.wait_for(self.go_on.wait(), BOUND)
        if self.then == "drop":
            w.close()
            return None
        for _ in range(int(BOUND / 0.01)):  # trickle until treg hangs up
            try:
                w.write(b"b" * 1024)
                await w.drain()
                data = await asyncio.wait_for(r.read(1), 0.01)
            except asyncio.TimeoutError:
                continue
            except ConnectionError:
                self.treg_closed.set()
                return None
            if data == b"":
                self.treg_closed.set()
                return None
        return None


async def open_call(port: int, token: str, path: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw_request_bytes("GET", path, [("X-Treg-Token", token)]))
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND)
    return reader, writer, head


class _ServeClient:
    """The bits of a TestClient that testing.Gateway uses, for a treg run like ``treg serve`` runs it."""

    def __init__(self, app: web.Application, port: int, session: aiohttp.ClientSession) -> None:
        self.app, self.port, self._session = app, port, session

    def request(self, method: str, path: str, **kw: Any) -> Any:
        return self._session.request(method, f"http://127.0.0.1:{self.port}{path}", **kw)


@pytest.fixture
async def served(make_app):
    """treg under aiohttp's AppRunner with its defaults, as ``treg serve`` runs it."""
    app = make_app(ssrf_allow=("127.0.0.0/8",))
    runner = make_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    async with aiohttp.ClientSession() as session:
        org = await membership.create_org(app[SERVICES], slug="acme", email="owner@acme.test")
        gw = testing.Gateway(_ServeClient(app, port, session), org)
        gw.runner = runner  # type: ignore[attr-defined]
        yield gw
    await runner.cleanup()


# -- 1. a full read -----------------------------------------------------------------------------------

async def test_full_read_releases_once_and_reuses_the_connection(gateway, closes):
    async with raw_upstream(lambda ex: http_response(200, b"x" * 200_000)) as up:
        await gateway.tool("up", up.url)
        for _ in range(3):
            r = await gateway.raw("GET", "/call/up/a")
            assert r.status == 200 and len(r.body) == 200_000
        await closes.wait_closed(3)
        for closer in closes.instances:
            assert closes.effective(closer) == [True]  # one effective close, a release
            assert closer.reused is True
            assert closer.calls >= 2  # the body iterator and the edge's cleanup both closed it
        assert up.connections == 1  # every call reused the one kept-alive connection
        calls = await wait_calls(gateway, 3)
        assert {c["outcome"] for c in calls} == {"ok"}


async def test_full_read_of_upstream_error_also_reuses(gateway, closes):
    async with raw_upstream(lambda ex: http_response(500, b"e" * 20_000)) as up:
        await gateway.tool("up", up.url)
        for _ in range(2):
            r = await gateway.raw("GET", "/call/up/a")
            assert r.status == 500 and r.body == b"e" * 20_000
        await closes.wait_closed(2)
        assert [closes.effective(c) for c in closes.instances] == [[True], [True]]
        assert up.connections == 1


async def test_bodyless_answers_release_and_reuse(gateway, closes):
    async with raw_upstream(lambda ex: b"HTTP/1.1 204 No Content\r\n\r\n") as up:
        await gateway.tool("up", up.url)
        for method in ("DELETE", "GET", "HEAD"):
            r = await gateway.raw(method, "/call/up/a")
            assert r.status == 204
        await closes.wait_closed(3)
        assert [closes.effective(c) for c in closes.instances] == [[True]] * 3
        assert up.connections == 1


# -- 2. a client disconnect (treg serve: no handler cancellation) -------------------------------------

async def test_client_disconnect_closes_upstream_once(served, closes, caplog):
    streamer = StreamingUpstream(then="trickle")
    async with raw_upstream(streamer) as up:
        await served.tool("up", up.url)
        reader, writer, head = await open_call(served.client.port, served.org["token"], "/call/up/stream")
        assert head.startswith(b"HTTP/1.1 200")
        await asyncio.wait_for(reader.readexactly(1000), BOUND)
        writer.close()  # the caller goes away mid-answer
        streamer.go_on.set()
        await asyncio.wait_for(streamer.treg_closed.wait(), BOUND)
        [closer] = await closes.wait_closed(1)
        assert closes.effective(closer) == [False]  # closed, not released: the rest was never read
        assert closer.reused is False
        calls = await wait_calls(served, 1)
        assert calls[0]["outcome"] == "cancelled"
        assert calls[0]["status"] == 200
        # a caller going away is ordinary: not an "unexpected error" with a traceback and a 500
        assert not [r for r in caplog.records if r.levelname == "ERROR" and r.name.startswith("treg")], \
            [r.getMessage() for r in caplog.records]
        # the next call gets a fresh upstream connection and a whole answer
        up.responder = None
        r = await served.raw("GET", "/call/up/again")
        assert (r.status, r.body) == (200, b"ok")
        assert up.connections == 2


async def _silent_upstream_then_caller_leaves(gw: testing.Gateway, closes) -> None:
    """An SSE/long-poll answer whose caller left while the upstream says nothing: the upstream must still
    be closed (not held for the read timeout), once, and the call audited as cancelled."""
    streamer = StreamingUpstream(then="wait_for_eof")
    async with raw_upstream(streamer) as up:
        await gw.tool("up", up.url)
        reader, writer, head = await open_call(gw.client.port, gw.org["token"], "/call/up/sse")
        assert head.startswith(b"HTTP/1.1 200")
        await asyncio.wait_for(reader.readexactly(1000), BOUND)
        writer.close()
        await asyncio.wait_for(streamer.treg_closed.wait(), BOUND)
        [closer] = await closes.wait_closed(1)
        assert closes.effective(closer) == [False]
        calls = await wait_calls(gw, 1)
        assert calls[0]["outcome"] == "cancelled"


async def test_client_disconnect_during_a_silent_upstream_closes_it(served, closes):
    """Under ``treg serve``'s runner (handler cancellation on)."""
    await _silent_upstream_then_caller_leaves(served, closes)


# -- 3. a stream error --------------------------------------------------------------------------------

async def test_upstream_dropping_mid_body_closes_once_and_truncates(gateway, closes):
    streamer = StreamingUpstream(length=100_000, then="drop")
    async with raw_upstream(streamer) as up:
        await gateway.tool("up", up.url)
        reader, writer, head = await open_call(gateway.client.port, gateway.org["token"], "/call/up/stream")
        try:
            assert head.startswith(b"HTTP/1.1 200")
            assert b"Content-Length: 100000" in head
            streamer.go_on.set()
            got = b""
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                got = await asyncio.wait_for(reader.read(200_000), BOUND)
                while True:  # bounded by treg closing the connection (wait_for on each read)
                    more = await asyncio.wait_for(reader.read(200_000), BOUND)
                    if not more:
                        break
                    got += more
            # the caller sees a truncated answer (the connection is cut), never a relabelled error answer
            assert len(got) < 100_000
            assert b"HTTP/1.1 5" not in got
        finally:
            writer.close()
        [closer] = await closes.wait_closed(1)
        assert closes.effective(closer) == [False]
        calls = await wait_calls(gateway, 1)
        assert calls[0]["outcome"] == "stream_error"


async def test_chunked_upstream_breaking_mid_chunk(gateway, closes):
    async def broken(ex: testing.Exchange) -> None:
        ex.writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n400\r\n" + b"x" * 100)
        await ex.writer.drain()
        ex.writer.close()
        return None

    async with raw_upstream(broken) as up:
        await gateway.tool("up", up.url)
        with pytest.raises((aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError)):
            r = await gateway.call("GET", "/call/up/x")
            await r.read()
        [closer] = await closes.wait_closed(1)
        assert closes.effective(closer) == [False]
        calls = await wait_calls(gateway, 1)
        assert calls[0]["outcome"] == "stream_error"


async def test_upstream_dropping_before_answering_is_502(gateway, closes):
    async def hang_up(ex: testing.Exchange) -> None:
        ex.writer.close()
        return None

    async with raw_upstream(hang_up) as up:
        await gateway.tool("up", up.url)
        r = await gateway.raw("GET", "/call/up/x")
        assert r.status == 502 and r.header("X-Treg-Error") == "1"
        assert r.json()["error"] == "upstream_disconnected"
        assert closes.instances == []  # no response object was ever made: nothing to close


# -- 4. cancellation ----------------------------------------------------------------------------------

async def test_cancelled_handler_closes_upstream_once(gateway, closes):
    """Under aiohttp's TestServer, which cancels the handler when its client goes away."""
    await _silent_upstream_then_caller_leaves(gateway, closes)


async def test_cancel_while_waiting_for_upstream_headers(gateway, closes):
    """Cancelled before the upstream answered at all: no response to close, the call is still audited,
    and the upstream connection is not left open."""
    answered = asyncio.Event()
    treg_closed = asyncio.Event()

    async def never(ex: testing.Exchange) -> None:
        answered.set()
        with contextlib.suppress(asyncio.TimeoutError, ConnectionError):
            if await asyncio.wait_for(ex.reader.read(1), BOUND) == b"":
                treg_closed.set()
        return None

    async with raw_upstream(never) as up:
        await gateway.tool("up", up.url)
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.client.port)
        writer.write(raw_request_bytes("GET", "/call/up/x", [("X-Treg-Token", gateway.org["token"])]))
        await writer.drain()
        await asyncio.wait_for(answered.wait(), BOUND)
        writer.close()
        await asyncio.wait_for(treg_closed.wait(), BOUND)
        calls = await wait_calls(gateway, 1)
        assert calls[0]["outcome"] == "cancelled", calls[0]
        assert closes.instances == []


# -- a caller that leaves mid-upload --------------------------------------------------------------------

@pytest.mark.parametrize("size,chunked", [(1000, False), (500_000, False), (500_000, True)])
async def test_caller_leaving_mid_upload(served, closes, caplog, size, chunked):
    """The body never arrives whole: the upstream must not get a complete request, and treg logs no
    unexpected error (the caller hung up; nobody is there to answer). A small body is read before the
    caller is identified, so only a streamed upload leaves an audit row."""
    import logging

    caplog.set_level(logging.INFO, logger="aiohttp.access")
    async with raw_upstream() as up:
        await served.tool("up", up.url)
        idle = len(served.runner.server.connections)  # the management client's kept-alive connection
        reader, writer = await asyncio.open_connection("127.0.0.1", served.client.port)
        framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
        writer.write(f"POST /call/up/upload HTTP/1.1\r\nHost: h\r\nX-Treg-Token: {served.org['token']}\r\n"
                     f"{framing}\r\n\r\n".encode())
        part = b"p" * (size // 2)
        writer.write((f"{len(part):x}\r\n".encode() + part + b"\r\n") if chunked else part)
        await writer.drain()
        writer.close()
        for _ in range(int(BOUND / 0.02)):  # until treg finished with it: answered, or its handler cancelled
            if any("/call/up/upload" in r.getMessage() for r in caplog.records if r.name == "aiohttp.access"):
                break
            if len(served.runner.server.connections) <= idle:
                break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the aborted upload was never finished by treg")
        # an audit row exists once treg identified the caller (a hang-up can cancel the call before
        # that); when it does, it is the caller's doing, never an upstream failure (502): a 400
        # body_incomplete when treg read the broken body, or "cancelled" when the hang-up came first
        for call in await served.calls():
            assert call["status"] == 400 or call["outcome"] == "cancelled", call
        for ex in up.exchanges:  # whatever reached the upstream is visibly incomplete
            assert len(ex.body) < size
        assert not [r for r in caplog.records if r.levelname == "ERROR" and r.name.startswith("treg")], \
            [r.getMessage() for r in caplog.records]


async def test_access_log_line_has_no_query(served, caplog):
    """One access line per request, as ``treg serve`` logs it: method, the path as sent, status, size,
    time; never the query string, where callers put keys."""
    import logging

    caplog.set_level(logging.INFO, logger="aiohttp.access")
    async with raw_upstream() as up:
        await served.tool("up", up.url)
        r = await served.call("GET", "/call/up/v1/a%2Fb?api_key=sk_live_CALLER_KEY&page=2")
        assert r.status == 200
        await r.read()
        for _ in range(int(BOUND / 0.02)):  # the line is written once the answer is finished
            lines = [rec.getMessage() for rec in caplog.records if rec.name == "aiohttp.access"]
            if any("/call/up/" in line for line in lines):
                break
            await asyncio.sleep(0.02)
        line = next(line for line in lines if "/call/up/" in line)
        assert line.startswith("GET /call/up/v1/a%2Fb 200 ") and line.endswith("ms")
        assert "sk_live_CALLER_KEY" not in line and "api_key" not in line and "?" not in line
