"""A member's call cap is exact across two real ``treg serve`` processes on one PostgreSQL: N + k calls at
once, half through each process, on a cap of N let exactly N through (the count is one conditional
upsert in the database, not a per-process counter), and the next UTC day lets the member call again."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from treg import testing
from treg.testing import Api, assert_clean_exits, run_sql, run_treg, serve_pair, stop_all, treg_env

CAP = 6
EXTRA = 10


async def test_cap_is_exact_across_two_processes(dsn, settings, tmp_path):
    async with testing.raw_upstream() as up:
        env = treg_env(tmp_path / "home", dsn, TREG_SECRET_KEY=settings.secret_key.reveal(),
                       TREG_SSRF_ALLOW="127.0.0.0/8")
        org = json.loads((await asyncio.to_thread(run_treg, env, "init", "--org", "acme",
                                                  "--email", "o@acme.test")).stdout)
        a, b = await serve_pair(env, tmp_path)
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                A, B = Api(session, a.base), Api(session, b.base)
                owner = org["token"]
                await A.req("POST", "/api/v1/tools", owner, 201, json={"name": "up", "base_url": up.url + "/v1"})
                _, bob, _ = await A.req("POST", "/api/v1/members", owner, 201, json={"email": "bob@acme.test"})
                _, limits, _ = await B.req("PUT", f"/api/v1/members/{bob['member_id']}/limits", owner, 200,
                                           json={"calls_per_day": CAP})
                assert limits["calls_per_day"] == CAP and limits["calls_today"] == 0

                async def one(api: Api) -> int:
                    status, _, _ = await api.req("GET", "/call/up/x", bob["token"])
                    return status

                statuses = await asyncio.gather(*(one(A if i % 2 else B) for i in range(CAP + EXTRA)))
                assert sorted(statuses) == [200] * CAP + [429] * EXTRA
                assert len(up.exchanges) == CAP
                assert run_sql(dsn, "SELECT calls FROM member_calls WHERE member_id = %s",
                            bob["member_id"]) == [(CAP,)]
                status, body, _ = await A.req("GET", "/call/up/x", bob["token"])
                assert status == 429 and body["used"] == CAP and body["limit"] == CAP
                # midnight (UTC) passes: the day's row moved back a day in the database, no sleeping
                run_sql(dsn, "UPDATE member_calls SET day = day - 1 WHERE member_id = %s", bob["member_id"])
                statuses = await asyncio.gather(*(one(A if i % 2 else B) for i in range(CAP + 2)))
                assert sorted(statuses) == [200] * CAP + [429] * 2
        finally:
            codes = await stop_all(a, b)
        assert_clean_exits(codes, a, b)
