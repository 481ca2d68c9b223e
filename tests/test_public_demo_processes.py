"""The public demo across two real ``treg serve`` processes on one database: the operator's CLI (``treg demo
enable|disable|token``), the hourly limit exact whichever process a visitor's calls reach (and however
many arrive at once), the daily budget too, a disable honoured by both. The vendor is a plugin FILE in
``TREG_PLUGINS_DIR``."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from treg.testing import PROPAGATION_S, Api, assert_clean_exits, run_treg, serve_pair, stop_all, treg_env, within
from treg.testing.vendors.tables import PLATFORM, vendor_upstream, write_plugin

LIMIT = 5


async def test_two_processes_share_the_hour_and_the_budget(dsn, settings, tmp_path):
    vendor, up = vendor_upstream()
    async with up:
        write_plugin(tmp_path / "plugins", up.url + "/v1")
        env = treg_env(tmp_path / "home", dsn, TREG_SECRET_KEY=settings.secret_key.reveal(),
                       TREG_SSRF_ALLOW="127.0.0.0/8", TREG_PLUGINS_DIR=str(tmp_path / "plugins"),
                       TREG_ANONYMOUS_PROVIDERS="crm", TREG_DEMO_ENDPOINTS="crm.status,crm.dear",
                       TREG_DEMO_CALLS_PER_HOUR=str(LIMIT), TREG_DEMO_DAILY_BUDGET_MICRO="1000000", **PLATFORM)

        def cli(*args: str) -> dict:
            done = run_treg(env, *args)
            assert done.returncode == 0, done.stderr
            return json.loads(done.stdout)

        await asyncio.to_thread(cli, "init", "--org", "show", "--email", "o@show.test")
        await asyncio.to_thread(cli, "credits", "grant", "--org", "show", "--micro", "5000000")
        issued = await asyncio.to_thread(cli, "demo", "token", "--org", "show")
        assert issued["public_demo"] is False and issued["token"].startswith("treg_")
        assert await asyncio.to_thread(cli, "demo", "enable", "--org", "show") == {"org": "show", "public_demo": True}
        token = issued["token"]
        a, b = await serve_pair(env, tmp_path)
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                A, B = Api(session, a.base), Api(session, b.base)

                def spread(path: str, n: int) -> "asyncio.Future":
                    return asyncio.gather(*((A if i % 2 else B).req("GET", path, token) for i in range(n)))

                # the budget (400 000 a call, 1 000 000 a day) across both processes at once: two holds fit
                results = await spread("/catalog/call/crm.dear", 8)
                assert sorted(s for s, _, _ in results) == [200] * 2 + [429] * 6
                # (a call the budget refuses gives its hour back, but only once refused: meanwhile, a
                # concurrent one may have found the hour full)
                assert "demo_budget_spent" in {b["error"] for s, b, _ in results if s == 429}
                assert {b["error"] for s, b, _ in results if s == 429} <= {"demo_budget_spent", "demo_rate_limited"}
                assert len(up.exchanges) == 2
                # the hour counted the two calls that went through, not the six the budget refused: of
                # twice the hour's calls at once, half through each process, exactly LIMIT - 2 pass
                results = await spread("/catalog/call/crm.status", 2 * LIMIT)
                statuses = sorted(s for s, _, _ in results)
                assert statuses == [200] * (LIMIT - 2) + [429] * (LIMIT + 2), statuses
                assert all(h["X-Treg-Demo"] == "1" for _, _, h in results)
                assert len(up.exchanges) == LIMIT
                for proc in (A, B):  # and neither process admits one more
                    status, body, _ = await proc.req("GET", "/catalog/call/crm.status", token)
                    assert status == 429 and body["error"] == "demo_rate_limited" and body["retry_after_s"] > 0

                # disabled through the CLI: both processes refuse the token within 2 s; enabled: revived
                assert (await asyncio.to_thread(cli, "demo", "disable", "--org", "show"))["public_demo"] is False

                async def both_refuse() -> bool:
                    got = [await p.req("GET", "/catalog/call/crm.status", token) for p in (A, B)]
                    return all(s == 403 and body["error"] == "demo_disabled" for s, body, _ in got)
                await within(PROPAGATION_S, both_refuse)
                assert (await asyncio.to_thread(cli, "demo", "enable", "--org", "show"))["public_demo"] is True
                for proc in (A, B):  # the token works again (and its hour is still spent)
                    status, body, _ = await proc.req("GET", "/catalog/call/crm.status", token)
                    assert status == 429 and body["error"] == "demo_rate_limited"
                assert len(up.exchanges) == LIMIT
        finally:
            codes = await stop_all(a, b)
    assert_clean_exits(codes, a, b)


def test_the_demo_commands_name_an_unknown_org(dsn, settings, tmp_path):
    env = treg_env(tmp_path / "home", dsn, TREG_SECRET_KEY=settings.secret_key.reveal())
    for command in ("enable", "disable", "token"):
        done = run_treg(env, "demo", command, "--org", "nobody")
        assert done.returncode == 2 and done.stdout == ""
        assert json.loads(done.stderr.strip().splitlines()[-1])["error"] == "org_not_found"
    assert run_treg(env, "demo", "enable").returncode == 2  # --org is required (argparse)
