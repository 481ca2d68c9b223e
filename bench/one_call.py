"""The one call the per-call instruments measure (``bench.instructions``, ``bench.bytecodes``), set up once:
a server of the run's own (embedded PostgreSQL under a temporary folder), the benchmark's upstream, the
bare relay's script, and what treg needs to serve ``GET /call/bench/small`` (its environment, its org).
Everything on 127.0.0.1, everything stopped when the block ends."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator

from bench.procs import BENCH_ROOT, free_port, run_cli, start_helper

#: the bare relay as a script of its own (``python baseline.py <upstream> <port>``)
BASELINE = '''
import asyncio, signal, sys
from aiohttp import web
from bench.servers import baseline_app

async def main() -> None:
    runner = web.AppRunner(baseline_app(sys.argv[1]), access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", int(sys.argv[2])).start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()

asyncio.run(main())
'''


@dataclass
class OneCall:
    """What a measurement of the call needs, for the bare relay and for treg."""

    tmp: Path
    dsn: str
    #: the upstream's URL (``http://127.0.0.1:<port>``)
    upstream: str
    #: the environment every process starts with: bench/ importable
    env: dict[str, str]
    baseline_port: int
    treg_port: int

    @property
    def baseline_cmd(self) -> list[str]:
        """The bare relay's arguments after ``python`` (its script written into ``tmp``)."""
        script = self.tmp / "baseline.py"
        if not script.exists():
            script.write_text(BASELINE)
        return [str(script), self.upstream, str(self.baseline_port)]

    @property
    def baseline_request(self) -> bytes:
        return f"GET /small HTTP/1.1\r\nHost: 127.0.0.1:{self.baseline_port}\r\n\r\n".encode()

    def treg_env(self) -> dict[str, str]:
        """treg serve's environment: its own home, the run's database, loopback allowed, the access log on."""
        env = {k: v for k, v in self.env.items() if not k.startswith("TREG_")}
        env.update(TREG_HOME=str(self.tmp / "home"), TREG_DATABASE_URL=self.dsn, TREG_SSRF_ALLOW="127.0.0.0/8",
                   TREG_HOST="127.0.0.1", TREG_PORT=str(self.treg_port), TREG_LOG_LEVEL="INFO")
        return env

    async def treg_org(self, slug: str, env: dict[str, str] | None = None) -> dict[str, str]:
        """``treg init``'s org (its owner's token under ``token``), before treg serves (``env``: treg's
        environment, when not :meth:`treg_env`'s)."""
        return json.loads(await run_cli(env or self.treg_env(), "init", "--org", slug, "--email", f"{slug}@bench.test"))

    def treg_request(self, token: str, path: str = "/call/bench/small") -> bytes:
        return (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.treg_port}\r\n"
                f"X-Treg-Token: {token}\r\n\r\n").encode()

    async def treg_case(self, slug: str, *, platform: bool = False) -> tuple[dict[str, str], str, bytes]:
        """treg serve's environment, its org's token and the measured call's request, before treg serves:
        the own tool's (``GET /call/bench/small``) or, ``platform``, the platform case's billed call
        (bench/platform_case.py: its provider as a plugin file, treg's key for it, the org's credits)."""
        from bench import platform_case

        env = self.treg_env()
        if platform:
            env["TREG_PLUGINS_DIR"] = str(platform_case.write_plugin(self.tmp / "plugins", self.upstream))
            platform_case.environment(env)
        org = await self.treg_org(slug, env)
        if not platform:
            return env, org["token"], self.treg_request(org["token"])
        await run_cli(env, "credits", "grant", "--org", slug, "--micro", str(platform_case.CREDIT_MICRO),
                      "--note", "benchmark")
        return env, org["token"], self.treg_request(org["token"], platform_case.PATH)


@contextlib.asynccontextmanager
async def one_call(prefix: str) -> AsyncIterator[OneCall]:
    from treg.infra import embedded_pg

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp_name:
        tmp = Path(tmp_name)
        server = embedded_pg.start(tmp / "pg")
        up = None
        try:
            dsn = server.ensure_database()
            up = await start_helper("upstream")
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [BENCH_ROOT, os.environ.get("PYTHONPATH")])))
            yield OneCall(tmp, dsn, f"http://127.0.0.1:{up.port}", env, free_port(), free_port())
        finally:
            if up is not None:
                await up.stop()
            server.stop()
