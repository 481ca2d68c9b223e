"""Money invariants under faults: hundreds of concurrent billed calls with random upstream failures,
mid-body disconnects and cancellations. Afterwards every hold is closed exactly once and
balance = credits − settled charges, to the micro-dollar."""

import asyncio
import random

import pytest

from treg import membership, money
from treg.call import service
from treg.keys import SERVICES
from treg.settings import SecretStr
from treg.testing import (Gateway, ProviderPlugin as Plugin, call_input, example_provider as provider,
                          http_response, raw_upstream)

N = 240
PRICE = 2000


@pytest.mark.parametrize("seed", [7])
async def test_money_invariants_under_faults(aiohttp_client, make_app, seed):
    rng = random.Random(seed)

    async def chaos(ex):
        kind = ex.target.rsplit("/", 1)[-1].split("?")[0]
        await asyncio.sleep(rng.random() * 0.02)
        if kind.startswith("ok"):
            return http_response(200, b'{"fine": true}')
        if kind.startswith("fail"):
            return http_response(rng.choice([400, 402, 429, 500, 503]), b'{"error": "x"}')
        if kind.startswith("cut"):
            # promise 1000 bytes, send 10, then drop the connection mid-body
            ex.writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789")
            await ex.writer.drain()
            return None
        if kind.startswith("slow"):
            await asyncio.sleep(1.0)
            return http_response(200, b"{}")
        return http_response(200, b"{}")

    async with raw_upstream(chaos) as up:
        app = make_app(extra_plugins=(Plugin([provider(up.url + "/v1")]),), ssrf_allow=("127.0.0.0/8",),
                       platform={"TREG_PLATFORM_KEY_ACME": SecretStr("pk")}, db_pool_max=10)
        client = await aiohttp_client(app)
        svc = client.app[SERVICES]
        org = await membership.create_org(svc, slug="chaos", email="c@chaos.test")
        gw = Gateway(client, org)
        credits = 300_000  # enough for 150 calls: some calls must meet a 402 too
        await money.grant(svc, org_id=org["org_id"], amount_micro=credits, actor="test")

        plan = [rng.choice(["ok", "ok", "fail", "cut", "slow-cancel", "http-cancel"]) for _ in range(N)]
        results = []

        async def via_http(i, kind):
            r = await gw.call("GET", f"/catalog/call/acme.items.get?item_id={kind}{i}")
            try:
                await r.read()
            except Exception:
                pass
            return r.status, int(r.headers.get("X-Treg-Cost-Micro", "0") or 0)

        async def via_service_cancelled(i):
            # plain-Python drive of the pipeline, cancelled while the upstream is in flight
            inp = call_input("acme.items.get", surface="catalog", raw_query=f"item_id=slow{i}",
                             token=org["token"])
            task = asyncio.create_task(service.execute(svc, inp))
            await asyncio.sleep(0.05 + rng.random() * 0.1)
            task.cancel()
            try:
                out = await task
                out.finish(0, None)
            except (asyncio.CancelledError, Exception):
                pass
            return None

        async def via_http_cancelled(i):
            try:
                await asyncio.wait_for(gw.call("GET", f"/catalog/call/acme.items.get?item_id=slow{i}"), 0.1)
            except asyncio.TimeoutError:
                pass
            return None

        tasks = []
        for i, kind in enumerate(plan):
            if kind == "slow-cancel":
                tasks.append(via_service_cancelled(i))
            elif kind == "http-cancel":
                tasks.append(via_http_cancelled(i))
            else:
                tasks.append(via_http(i, kind))
        results = await asyncio.gather(*tasks)
        # let handlers whose clients went away finish (they keep running server-side), then reap
        for _ in range(200):
            async with svc.db.tx() as tx:
                open_holds = await tx.scalar("SELECT count(*) FROM holds WHERE state = 'held'")
            if open_holds == 0:
                break
            await asyncio.sleep(0.05)
        assert open_holds == 0, f"{open_holds} holds still open"

        async with svc.db.tx() as tx:
            settled = await tx.scalar("SELECT coalesce(sum(settled_micro), 0) FROM holds WHERE state = 'settled'")
            released_charge = await tx.scalar(
                "SELECT coalesce(sum(settled_micro), 0) FROM holds WHERE state = 'released'")
            n_holds = await tx.scalar("SELECT count(*) FROM holds")
            row = await tx.fetch_one("SELECT * FROM org_balances WHERE org_id = %(o)s", {"o": org["org_id"]})
        bal = await money.balance(svc, org["org_id"])
        assert released_charge == 0
        assert bal.held_micro == 0
        assert bal.balance_micro == credits - settled, (bal, credits, settled)
        assert row["settled_micro"] == settled
        # what callers were told they paid is exactly what was settled (HTTP calls that completed)
        told = sum(c for r in results if r is not None for s, c in [r])
        assert told <= settled
        ok_count = sum(1 for r in results if r is not None and r[0] == 200 and r[1] == PRICE)
        assert settled == PRICE * (settled // PRICE) and ok_count == told // PRICE
        assert n_holds > 0 and any(r is not None and r[0] == 402 for r in results)
        await client.close()
