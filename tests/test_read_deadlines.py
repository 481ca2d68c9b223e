"""The upstream read timeout kept by one ticker per session (treg/infra/read_deadlines.py), not a loop timer
per read: a silent upstream still times out (before its head and mid-answer), an upstream that keeps
sending never does, a caller that reads slowly (backpressure pauses the upstream read) is not the
upstream's silence, and no finished connection stays watched.

Real HTTP: raw-socket upstreams on 127.0.0.1, treg's app with a short ``TREG_UPSTREAM_READ_TIMEOUT_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from treg import membership, testing
from treg.infra.read_deadlines import DeadlineConnector, DeadlineHandler, ReadDeadlines
from treg.keys import SERVICES
from treg.testing import raw_upstream

TIMEOUT = 0.4  # the read timeout of these tests' treg
BOUND = 10.0  # seconds any single wait may take before the test fails (a bound, not a timing)


@pytest.fixture
async def gw(make_app, aiohttp_client):
    client = await aiohttp_client(make_app(ssrf_allow=("127.0.0.0/8",), upstream_read_timeout_s=TIMEOUT))
    org = await membership.create_org(client.app[SERVICES], slug="acme", email="owner@acme.test")
    yield testing.Gateway(client, org)
    await client.close()


def deadlines(gw: testing.Gateway) -> ReadDeadlines:
    connector = gw.services.client.connector
    assert isinstance(connector, DeadlineConnector)
    return connector.deadlines


async def test_the_session_uses_the_deadline_connector_and_protocol(gw):
    connector = gw.services.client.connector
    assert isinstance(connector, DeadlineConnector)
    proto = connector._factory()
    assert isinstance(proto, DeadlineHandler) and proto._deadlines is connector.deadlines
    assert connector.deadlines.tick == pytest.approx(TIMEOUT / 4)


async def test_an_upstream_silent_before_its_head_is_a_502_upstream_timeout(gw):
    async def silent(ex: testing.Exchange) -> None:
        with contextlib.suppress(asyncio.TimeoutError, ConnectionError):
            await asyncio.wait_for(ex.reader.read(1), BOUND)  # until treg hangs up
        return None

    async with raw_upstream(silent) as up:
        await gw.tool("up", up.url)
        started = time.monotonic()
        r = await asyncio.wait_for(gw.call("GET", "/call/up/x"), BOUND)
        waited = time.monotonic() - started
        assert r.status == 502
        assert (await r.json())["error"] == "upstream_timeout"
        assert waited >= TIMEOUT  # never before the timeout: it is a deadline, not a guess
        assert deadlines(gw).expired == 1
        [row] = await gw.wait_calls(1, bound=BOUND)
        assert row["outcome"] == "gateway_failed" and row["status"] == 502


async def test_an_upstream_silent_mid_answer_is_cut(gw):
    async def stalls(ex: testing.Exchange) -> None:
        ex.writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"a" * 1000)
        await ex.writer.drain()
        with contextlib.suppress(asyncio.TimeoutError, ConnectionError):
            await asyncio.wait_for(ex.reader.read(1), BOUND)
        return None

    async with raw_upstream(stalls) as up:
        await gw.tool("up", up.url)
        r = await asyncio.wait_for(gw.call("GET", "/call/up/x"), BOUND)
        assert r.status == 200
        got = b""
        with contextlib.suppress(Exception):  # the caller sees a truncated answer (the connection is cut)
            got = await asyncio.wait_for(r.read(), BOUND)
        assert len(got) < 100_000
        [row] = await gw.wait_calls(1, bound=BOUND)
        assert row["outcome"] == "stream_error"
        assert deadlines(gw).expired == 1


async def test_an_upstream_that_keeps_sending_is_never_timed_out(make_app, aiohttp_client):
    # a longer timeout than the other tests' (a loaded machine may stall the loop a few hundred ms):
    # 8 pieces, one every quarter of it, two timeouts long in all, never silent for one
    timeout = 1.2
    pieces, gap = 8, timeout / 4
    client = await aiohttp_client(make_app(ssrf_allow=("127.0.0.0/8",), upstream_read_timeout_s=timeout))
    org = await membership.create_org(client.app[SERVICES], slug="acme", email="owner@acme.test")
    slow = testing.Gateway(client, org)

    async def trickles(ex: testing.Exchange) -> None:
        ex.writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {pieces}\r\n\r\n".encode())
        for _ in range(pieces):
            await asyncio.sleep(gap)
            ex.writer.write(b"x")
            await ex.writer.drain()
        return None

    try:
        async with raw_upstream(trickles) as up:
            await slow.tool("up", up.url)
            r = await asyncio.wait_for(slow.call("GET", "/call/up/x"), BOUND)
            assert r.status == 200
            assert await asyncio.wait_for(r.read(), BOUND) == b"x" * pieces
            assert deadlines(slow).expired == 0
            [row] = await slow.wait_calls(1, bound=BOUND)
            assert row["outcome"] == "ok"
    finally:
        await client.close()


async def test_a_caller_reading_slowly_is_not_the_upstreams_silence(gw):
    """Backpressure: the caller stops reading for three timeouts; treg stops reading the upstream
    (aiohttp pauses the protocol, which drops its deadline) and the answer arrives whole afterwards."""
    size = 32 * 1024 * 1024  # far more than the socket buffers and aiohttp's read buffer hold

    async def floods(ex: testing.Exchange) -> None:
        ex.writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {size}\r\n\r\n".encode())
        block = b"z" * (1024 * 1024)
        for _ in range(size // len(block)):
            ex.writer.write(block)
            await ex.writer.drain()
        return None

    async with raw_upstream(floods) as up:
        await gw.tool("up", up.url)
        reader, writer = await asyncio.open_connection("127.0.0.1", gw.client.port)
        writer.write(f"GET /call/up/big HTTP/1.1\r\nHost: t\r\nX-Treg-Token: {gw.org['token']}\r\n\r\n".encode())
        await writer.drain()
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), BOUND)
            assert head.startswith(b"HTTP/1.1 200")
            await asyncio.sleep(3 * TIMEOUT)  # the caller reads nothing meanwhile
            got = 0
            while got < size:
                chunk = await asyncio.wait_for(reader.read(1024 * 1024), BOUND)
                assert chunk, f"the answer ended after {got} of {size} bytes"
                got += len(chunk)
        finally:
            writer.close()
        assert got == size
        assert deadlines(gw).expired == 0


async def test_finished_connections_are_not_watched_and_the_ticker_stops(gw):
    async with raw_upstream() as up:
        await gw.tool("up", up.url)
        for _ in range(5):
            r = await gw.call("GET", "/call/up/x")
            assert r.status == 200 and await r.read() == b"ok"
        d = deadlines(gw)
        assert d.watched == set()  # each answer's end dropped its deadline (no leak)
        for _ in range(int(BOUND / 0.05)):  # the ticker ends once nothing is watched
            if d._task is None:
                break
            await asyncio.sleep(0.05)
        assert d._task is None
        r = await gw.call("GET", "/call/up/x")  # and a new call starts it again as needed
        assert r.status == 200 and await r.read() == b"ok"
        assert d.expired == 0


async def test_closing_the_session_stops_the_ticker():
    d = ReadDeadlines(TIMEOUT)
    connector = DeadlineConnector(read_timeout_s=TIMEOUT)
    proto = connector._factory()
    proto._reschedule_timeout()  # a read timeout not configured: nothing watched
    assert connector.deadlines.watched == set()
    proto.read_timeout = TIMEOUT
    proto._reschedule_timeout()
    assert connector.deadlines.watched == {proto} and connector.deadlines._task is not None
    await connector.close()
    assert connector.deadlines._task is None
    proto._reschedule_timeout()  # after close: watched, but no ticker is started again
    assert connector.deadlines._task is None
    assert d.tick == pytest.approx(TIMEOUT / 4) and ReadDeadlines(None).tick == 1.0


async def test_one_failing_expiry_does_not_stop_the_others(caplog):
    d = ReadDeadlines(0.2)
    loop = asyncio.get_running_loop()

    class Broken(DeadlineHandler):
        def _on_read_timeout(self) -> None:
            raise RuntimeError("boom")

    class Counted(DeadlineHandler):
        fired = 0

        def _on_read_timeout(self) -> None:
            Counted.fired += 1

    broken, counted = Broken(loop, d), Counted(loop, d)
    for proto in (broken, counted):
        proto.read_timeout = 0.2
        proto._reschedule_timeout()
    for _ in range(int(BOUND / 0.05)):
        if d.expired == 2:
            break
        await asyncio.sleep(0.05)
    assert d.expired == 2 and Counted.fired == 1 and d.watched == set()
    assert "expiring an upstream read deadline failed" in caplog.text
    await d.close()
