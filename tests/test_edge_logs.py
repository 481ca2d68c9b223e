"""aiohttp's own errors for malformed requests never log a token or the request's bytes (api.md,
"Logs"), and, under treg's runner (``treg serve``), are answered with the error body."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from treg.app import make_runner
from treg.testing import raw_exchange


def _malformed(token: str) -> list[bytes]:
    """Requests aiohttp's parser refuses, each carrying ``token`` near the fault."""
    t = token.encode()
    return [
        # a control character in the token's own value
        b"GET /api/v1/me HTTP/1.1\r\nHost: h\r\nX-Treg-Token: " + t + b"\x01\r\n\r\n",
        # a broken header line right after the token
        b"GET /call/x/y HTTP/1.1\r\nHost: h\r\nX-Treg-Token: " + t + b"\r\nBad Header\x7f: 1\r\n\r\n",
        # both framings at once
        (b"POST /call/x/y HTTP/1.1\r\nHost: h\r\nX-Treg-Token: " + t + b"\r\nContent-Length: 3\r\n"
         b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"),
        # a request line with junk after the version
        b"GET /x?k=" + t + b" HTTP/1.1 junk\r\nX-Treg-Token: " + t + b"\r\n\r\n",
    ]


class _Everything(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def text(self) -> str:
        fmt = logging.Formatter("%(name)s %(levelname)s %(message)s")
        return "\n".join(fmt.format(r) for r in self.records)


@contextlib.contextmanager
def _capture_all():
    """Every record of every logger at DEBUG, with tracebacks formatted."""
    handler = _Everything()
    root = logging.getLogger()
    saved = root.level, {name: lg.level for name, lg in logging.root.manager.loggerDict.items()
                         if isinstance(lg, logging.Logger)}
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    for name in saved[1]:
        logging.getLogger(name).setLevel(logging.NOTSET)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(saved[0])
        for name, level in saved[1].items():
            logging.getLogger(name).setLevel(level)


@pytest.fixture
async def served_port(make_app):
    """treg under its own runner, as ``treg serve`` runs it."""
    runner = make_runner(make_app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    await runner.cleanup()


async def test_malformed_requests_are_error_bodies_and_log_no_token(served_port):
    token = "treg_SECRET" + secrets.token_hex(12)
    with _capture_all() as logs:
        for data in _malformed(token):
            r = await raw_exchange(served_port, data)
            assert r.status == 400, (data, r.status, r.body)
            assert r.header("X-Treg-Error") == "1" and r.header("Content-Type", ).startswith("application/json")
            body = r.json()
            assert body["error"] == "malformed_request" and body["blame"] == "caller" and body["detail"]
            assert token not in r.head.decode("latin-1") + r.body.decode("latin-1")
        await asyncio.sleep(0.05)
    text = logs.text()
    assert "malformed request" in text  # the refusals are logged, without the bytes
    assert token not in text and "SECRET" not in text


async def test_aiohttps_test_server_logs_no_token_either(gateway):
    """The protocol's logger is the app's (handler_args), so any server treg's app runs on redacts."""
    token = "treg_SECRET" + secrets.token_hex(12)
    with _capture_all() as logs:
        for data in _malformed(token):
            r = await raw_exchange(gateway.client.port, data)
            assert r.status == 400
        await asyncio.sleep(0.05)
    text = logs.text()
    assert "Error handling request" in text
    assert token not in text and "SECRET" not in text


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_treg_serve_stderr_holds_no_token(dsn, tmp_path: Path):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TREG_")}
    env.update(TREG_HOME=str(tmp_path / "home"), TREG_DATABASE_URL=dsn, TREG_LOG_LEVEL="DEBUG")
    proc = subprocess.Popen([sys.executable, "-m", "treg", "serve", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    token = "treg_SECRET" + secrets.token_hex(12)
    try:
        deadline = time.monotonic() + 60
        async with aiohttp.ClientSession() as session:
            while True:
                assert proc.poll() is None, proc.stderr.read().decode()  # type: ignore[union-attr]
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(f"http://127.0.0.1:{port}/healthz") as resp:
                        if resp.status == 200:
                            break
                assert time.monotonic() < deadline, "treg serve did not come up"
                await asyncio.sleep(0.2)
        for data in _malformed(token):
            r = await raw_exchange(port, data)
            assert r.status == 400 and r.json()["error"] == "malformed_request"
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    stderr = err.decode("utf-8", "replace")
    assert "malformed request" in stderr
    assert token not in stderr and "SECRET" not in stderr
    assert token not in out.decode("utf-8", "replace")
