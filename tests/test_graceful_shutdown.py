"""SIGTERM to a real ``treg serve``: new connections refused at once, a stream in flight finishes within
``TREG_SHUTDOWN_GRACE_S`` (or is cut when longer) and is audited either way; the process exits 0."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import threading
import time
from typing import AsyncIterator

import psycopg2
import pytest

from treg.infra import crypto
from treg.testing import Served, http, run_treg, treg_env

TICK_S = 0.25


@contextlib.asynccontextmanager
async def streaming_upstream(chunks: int) -> AsyncIterator[str]:
    """An upstream answering every request with an SSE stream of ``chunks`` events, one per TICK_S."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for i in range(chunks):
                event = f"data: {i}\n\n".encode()
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                await writer.drain()
                await asyncio.sleep(TICK_S)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # treg cut the stream
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


def stream_call(port: int, token: str, first: threading.Event, out: dict) -> None:
    """GET /call/up/events on a raw socket, read to EOF (bounded); ``first`` is set at the first event."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    buf = b""
    try:
        s.sendall(f"GET /call/up/events HTTP/1.1\r\nHost: treg\r\nX-Treg-Token: {token}\r\n"
                  "Connection: close\r\n\r\n".encode())
        while True:
            try:
                data = s.recv(65536)
            except OSError:
                break
            if not data:
                break
            buf += data
            if b"data: 0" in buf:
                first.set()
    finally:
        s.close()
        out["raw"] = buf
        first.set()


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def audit_row(dsn: str, call_id: str) -> tuple | None:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT outcome, status FROM calls WHERE id = %s", (call_id,))
            return cur.fetchone()
    finally:
        conn.close()


def _setup(tmp_path, dsn: str, grace: float, up_url: str) -> tuple[Served, str]:
    env = treg_env(tmp_path / "home", dsn, TREG_SECRET_KEY=crypto.new_key_text(), TREG_SSRF_ALLOW="127.0.0.0/8",
                   TREG_SHUTDOWN_GRACE_S=str(grace))
    init = run_treg(env, "init", "--org", "acme", "--email", "owner@acme.test")
    assert init.returncode == 0, init.stderr
    token = json.loads(init.stdout)["token"]
    served = Served(env, tmp_path / "serve.log")
    status, body, _ = http("POST", served.base + "/api/v1/tools", token, {"name": "up", "base_url": up_url})
    assert status == 201, body
    return served, token


def _sigterm_mid_stream(served: Served, token: str) -> tuple[dict, float, bool, int]:
    """Start the stream, SIGTERM at its first event; (what the caller read, seconds to exit, whether new
    connections were refused while the stream was in flight, exit code)."""
    first, out = threading.Event(), {}
    reader = threading.Thread(target=stream_call, args=(served.port, token, first, out), daemon=True)
    reader.start()
    assert first.wait(30), "the stream never started"
    t0 = time.monotonic()
    served.signal(signal.SIGTERM)
    was_refused = False
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and reader.is_alive():
        if refused(served.port):
            was_refused = True
            break
        time.sleep(0.05)
    code = served.wait(timeout=60)
    elapsed = time.monotonic() - t0
    reader.join(30)
    assert not reader.is_alive()
    return out, elapsed, was_refused, code


def _call_id(raw: bytes) -> str:
    head = raw.split(b"\r\n\r\n", 1)[0].decode()
    return next(line.split(":", 1)[1].strip() for line in head.split("\r\n")
                if line.lower().startswith("x-treg-call-id:"))


@pytest.mark.parametrize("chunks,grace", [(12, 20.0), (400, 1.5)], ids=["finishes-within-grace", "cut-after-grace"])
async def test_sigterm_with_a_stream_in_flight(chunks, grace, dsn, tmp_path):
    async with streaming_upstream(chunks) as up_url:
        served, token = await asyncio.to_thread(_setup, tmp_path, dsn, grace, up_url)
        try:
            out, elapsed, was_refused, code = await asyncio.to_thread(_sigterm_mid_stream, served, token)
        finally:
            served.kill()
    log = served.log.read_text()
    assert code == 0, log
    assert was_refused, "a new connection was accepted after SIGTERM"
    raw = out["raw"]
    call_id = _call_id(raw)
    row = await asyncio.to_thread(audit_row, dsn, call_id)
    if chunks * TICK_S < grace:
        # the whole stream arrived, terminating chunk included, and the call is audited as a success
        assert all(f"data: {i}".encode() in raw for i in range(chunks)) and raw.endswith(b"0\r\n\r\n")
        assert elapsed >= (chunks - 2) * TICK_S  # the process waited for it
        assert row == ("ok", 200), row
    else:
        assert not raw.endswith(b"0\r\n\r\n")  # cut: no terminating chunk
        assert grace - 0.5 <= elapsed < grace + 10, elapsed
        assert row == ("cancelled", 200), row
    assert "Traceback" not in log, log
