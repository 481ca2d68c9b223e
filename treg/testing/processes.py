"""Real ``treg`` processes for the operability tests: the CLI run to completion (``run_treg``,
``run_cli``), ``treg serve`` kept running until stopped by PID (``Served``, two at once: ``serve_pair``),
JSON over HTTP to them (``http``, ``Api``) and a bounded wait for two of them to agree (``within``).
Everything bounded; all traffic on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import aiohttp

#: operability.md: a change made through one process is honoured by every other within 2 s
PROPAGATION_S = 2.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def treg_env(home: Path, dsn: str | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TREG_")}
    env.update(TREG_HOME=str(home), TREG_LOG_LEVEL="INFO")
    if dsn is not None:
        env["TREG_DATABASE_URL"] = dsn
    env.update(extra)
    return env


def run_cli(home: Path, dsn: str | None, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``treg <args>`` run to completion with ``TREG_HOME=home`` (and ``TREG_DATABASE_URL=dsn``), no other
    ``TREG_`` variable of this process's environment, ``env`` added; at treg's own log level."""
    e = {k: v for k, v in os.environ.items() if not k.startswith("TREG_")}
    e.update(TREG_HOME=str(home), **env)
    if dsn is not None:
        e["TREG_DATABASE_URL"] = dsn  # a libpq keyword DSN works as well as a postgresql:// URL
    return subprocess.run([sys.executable, "-m", "treg", *args], env=e, capture_output=True, text=True, timeout=120)


#: a plugin file registering the example provider (treg.testing.example_provider) at an upstream, as an
#: operator installs a provider in ``TREG_PLUGINS_DIR``
EXAMPLE_PLUGIN = """
from treg import hookimpl
from treg.testing import example_provider


@hookimpl
def treg_register_providers():
    return [example_provider({url!r} + "/v1")]
"""


def example_provider_env(folder: Path, dsn: str, secret_key: str, upstream_url: str, **extra: str) -> dict[str, str]:
    """``treg_env`` of a deployment selling the example provider at ``upstream_url`` on the platform tier:
    its plugin file in ``folder/plugins``, ``TREG_PLATFORM_KEY_ACME`` set, loopback upstreams allowed,
    its home in ``folder/home``; ``extra`` settings on top."""
    plugins = folder / "plugins"
    plugins.mkdir()
    (plugins / "acme_fake.py").write_text(EXAMPLE_PLUGIN.format(url=upstream_url))
    settings = {"TREG_SECRET_KEY": secret_key, "TREG_SSRF_ALLOW": "127.0.0.0/8", "TREG_PLUGINS_DIR": str(plugins),
                "TREG_PLATFORM_KEY_ACME": "pk", **extra}
    return treg_env(folder / "home", dsn, **settings)


async def credited_org(env: dict[str, str], slug: str, micro: int) -> dict[str, Any]:
    """``treg init`` of an org (its ``org_id``, ``token``, …), then ``treg credits grant`` of ``micro``."""
    done = await asyncio.to_thread(run_treg, env, "init", "--org", slug, "--email", f"o@{slug}.test")
    assert done.returncode == 0, done.stderr
    granted = await asyncio.to_thread(run_treg, env, "credits", "grant", "--org", slug, "--micro", str(micro))
    assert granted.returncode == 0, granted.stderr
    return dict(json.loads(done.stdout))


def run_treg(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "treg", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def http(method: str, url: str, token: str | None = None, body: Any = None,
         headers: dict[str, str] | None = None, timeout: float = 30) -> tuple[int, Any, dict[str, str]]:
    """(status, parsed JSON or raw bytes, headers) of one request (urllib: no event loop needed)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    if token:
        req.add_header("X-Treg-Token", token)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw, status, hs = resp.read(), resp.status, dict(resp.headers)
    except urllib.error.HTTPError as exc:
        raw, status, hs = exc.read(), exc.code, dict(exc.headers)
    try:
        return status, json.loads(raw or b"null"), hs
    except ValueError:
        return status, raw, hs


class Served:
    """``treg serve`` in a subprocess (stderr into ``log``; stdout too with ``stdout``), waited for until
    /healthz answers."""

    def __init__(self, env: dict[str, str], log: Path, *, wait_s: float = 90, stdout: bool = False) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        self._fh = open(log, "ab")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen([sys.executable, "-m", "treg", "serve", "--port", str(self.port)],
                                     env=env, stdout=self._fh if stdout else subprocess.DEVNULL, stderr=self._fh)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._fh.close()
                raise AssertionError(f"treg serve exited {self.proc.returncode}: {log.read_text()}")
            try:
                with urllib.request.urlopen(self.base + "/healthz", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.1)
        self.kill()
        raise AssertionError(f"treg serve never answered /healthz: {log.read_text()}")

    def signal(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.kill()

    def stop(self, timeout: float = 60) -> int:
        self.signal(signal.SIGTERM)
        code = self.wait(timeout)
        self._fh.close()
        return code

    def kill(self) -> None:
        """The finally-block exit: SIGKILL by PID if it still runs."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        if not self._fh.closed:
            self._fh.close()


async def serve_pair(env: dict[str, str], folder: Path, env_b: dict[str, str] | None = None) -> tuple[Served, Served]:
    """Two ``treg serve`` processes of ``env`` (the second of ``env_b`` when given) started at once
    (logging to ``a.log`` and ``b.log`` in ``folder``); when one never comes up, the other is killed
    before the failure is raised."""
    started = await asyncio.gather(asyncio.to_thread(Served, env, folder / "a.log"),
                                   asyncio.to_thread(Served, env_b or env, folder / "b.log"), return_exceptions=True)
    failed = [s for s in started if isinstance(s, BaseException)]
    if failed:
        for s in started:
            if isinstance(s, Served):
                s.kill()
        raise failed[0]
    a, b = started
    return a, b  # type: ignore[return-value]


@contextlib.asynccontextmanager
async def served_pair(env: dict[str, str], folder: Path,
                      env_b: dict[str, str] | None = None) -> AsyncIterator[tuple["Api", "Api"]]:
    """:func:`serve_pair`, with an :class:`Api` on each process over one session (60 s a request); on
    the way out both are stopped, and, when the body did not fail, checked to have exited cleanly."""
    a, b = await serve_pair(env, folder, env_b)
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            yield Api(session, a.base), Api(session, b.base)
    finally:
        codes = await stop_all(a, b)
    assert_clean_exits(codes, a, b)


async def sixteen_calls_on_credit_for_ten(a: "Api", b: "Api", token: str, price: int) -> None:
    """issue 23's rule: 16 concurrent calls of the example provider (``price`` each) through two
    processes, on credit for 10, charge exactly 10 and refuse the other 6 for the balance."""
    results = await asyncio.gather(*((a if i % 2 else b).req("GET", f"/catalog/call/acme.items.get?item_id=t{i}",
                                                              token) for i in range(16)))
    ok = [int(h["X-Treg-Cost-Micro"]) for status, _, h in results if status == 200]
    refused = [body["error"] for status, body, _ in results if status == 402]
    assert len(ok) == 10 and sum(ok) == 10 * price and refused == ["insufficient_balance"] * 6, results


async def stop_all(*served: "Served") -> list[int]:
    """SIGTERM every served treg at once (each ``stop`` waits for its exit), then make sure none is left;
    the exit codes, in order. Call it in ``finally`` and check with :func:`assert_clean_exits` after."""
    codes = await asyncio.gather(*(asyncio.to_thread(s.stop) for s in served))
    for s in served:
        s.kill()
    return list(codes)


def assert_clean_exits(codes: list[int], *served: "Served") -> None:
    """Every process exited 0 and logged no traceback."""
    assert codes == [0] * len(served), [s.log.read_text() for s in served]
    for s in served:
        assert "Traceback" not in s.log.read_text()


async def within(deadline_s: float, probe: Callable[[], "Awaitable[bool] | bool"]) -> float:
    """Seconds until ``probe()`` holds, asserting it does within ``deadline_s`` (polled every 50 ms).
    ``probe`` answers a bool, or an awaitable of one (a query)."""
    t0 = time.monotonic()
    while True:
        held = probe()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return time.monotonic() - t0
        if time.monotonic() - t0 > deadline_s:
            raise AssertionError(f"not honoured within {deadline_s}s")
        await asyncio.sleep(0.05)


class Api:
    """JSON over one aiohttp session against one of the processes."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session, self.base = session, base

    async def req(self, method: str, path: str, token: str, expect: int | None = None, *,
                  headers: dict[str, str] | None = None, **kw: Any) -> tuple[int, Any, Any]:
        async with self.session.request(method, self.base + path, headers={"X-Treg-Token": token, **(headers or {})},
                                        **kw) as r:
            raw = await r.read()
            body = json.loads(raw) if r.content_type == "application/json" and raw else raw
            if expect is not None:
                assert r.status == expect, (method, path, r.status, body)
            return r.status, body, r.headers
