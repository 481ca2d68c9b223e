"""Two real ``treg serve`` processes on one database agree on a capacity lock within 2 s (the contract's
"every treg process on the database honours a lock within 2 s of it being written"), and a clear by a
third process (``treg capacity clear``) reaches both. The vendor comes from a plugin FILE in
``TREG_PLUGINS_DIR`` declaring its own signature rows: no core edit."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp

from treg import testing
from treg.testing import PROPAGATION_S, Api, assert_clean_exits, run_treg, serve_pair, stop_all, treg_env, within
from treg.testing.vendors.capacity import PLATFORM_KEYS, ok, out_of_credits, write_plugin

ITEMS = "/catalog/call/vend.items.get?item_id=1"


async def locks_gauge(session: aiohttp.ClientSession, base: str) -> float:
    async with session.get(base + "/metrics") as r:  # loopback: no token needed
        text = await r.text()
    [line] = [ln for ln in text.splitlines() if ln.startswith("treg_capacity_locks ")]
    return float(line.split()[1])


async def test_two_processes_agree_on_a_lock_within_2s(dsn, settings, tmp_path):
    def vendor(ex):  # treg's own account at the vendor is empty; everything else answers
        return out_of_credits() if ex.target.startswith("/v1/items/") else ok()

    async with testing.raw_upstream(vendor) as up:
        write_plugin(tmp_path / "plugins", up.url)
        env = treg_env(tmp_path / "home", dsn, TREG_SECRET_KEY=settings.secret_key.reveal(),
                       TREG_SSRF_ALLOW="127.0.0.0/8", TREG_PLUGINS_DIR=str(tmp_path / "plugins"),
                       TREG_CAPACITY_STRIKE_GAP_S="0.2", TREG_CAPACITY_PROBE_INTERVAL_S="600", **PLATFORM_KEYS)
        org = json.loads((await asyncio.to_thread(run_treg, env, "init", "--org", "acme",
                                                  "--email", "o@acme.test")).stdout)
        granted = await asyncio.to_thread(run_treg, env, "credits", "grant", "--org", "acme", "--micro", "100000")
        assert granted.returncode == 0, granted.stderr
        a, b = await serve_pair(env, tmp_path)
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                A, B = Api(session, a.base), Api(session, b.base)
                token = org["token"]
                assert await locks_gauge(session, b.base) == 0
                # two strikes through A, the gap apart: A writes the lock
                assert (await A.req("GET", ITEMS, token))[0] == 402
                await asyncio.sleep(0.3)
                assert (await A.req("GET", ITEMS, token))[0] == 402

                async def b_sees_it() -> bool:
                    return await locks_gauge(session, b.base) == 1
                await within(PROPAGATION_S, b_sees_it)
                # B honours it: its one probe of the interval goes through, the next call is refused
                status, _, headers = await B.req("GET", ITEMS, token)
                assert status == 402 and headers.get("X-Treg-Capacity-Probe") == "1"
                status, body, headers = await B.req("GET", ITEMS, token)
                assert status == 503 and body["error"] == "provider_capacity" and body["provider"] == "vend"
                assert headers["X-Treg-Error"] == "1"
                sent = len(up.exchanges)
                assert (await B.req("GET", ITEMS, token))[0] == 503 and len(up.exchanges) == sent

                # a third process clears it: both see that within 2 s too
                cleared = await asyncio.to_thread(run_treg, env, "capacity", "clear", "vend")
                assert cleared.returncode == 0 and json.loads(cleared.stdout) == {"key": "vend", "cleared": True}
                t0 = time.monotonic()

                async def both_clear() -> bool:
                    return [await locks_gauge(session, s.base) for s in (a, b)] == [0, 0]
                await within(PROPAGATION_S, both_clear)
                assert time.monotonic() - t0 <= PROPAGATION_S
                status, _, headers = await B.req("GET", ITEMS, token)
                assert status == 402 and "X-Treg-Capacity-Probe" not in headers  # an ordinary call again
        finally:
            codes = await stop_all(a, b)
    assert_clean_exits(codes, a, b)
