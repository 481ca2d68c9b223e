"""Connection discipline: no database connection is checked out while a call waits on its upstream.

Proof: 24 concurrent slow calls through a treg whose pool has TWO connections. All 24 must be in flight
at the upstream at the same moment (impossible if each held a connection), and at the network
boundary (the moment treg sends) the sending task holds no connection.
"""

import asyncio

from aiohttp import web

from treg import membership
from treg.infra import upstream as upstream_mod
from treg.keys import SERVICES
from treg.testing import Gateway

N = 24


async def test_no_connection_held_during_upstream_io(aiohttp_client, aiohttp_server, make_app, monkeypatch):
    in_flight = 0
    peak = 0
    all_arrived = asyncio.Event()

    async def slow(request):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        if in_flight == N:
            all_arrived.set()
        try:
            await asyncio.wait_for(all_arrived.wait(), 10)
        except asyncio.TimeoutError:
            pass
        in_flight -= 1
        return web.Response(text="slow")

    up_app = web.Application()
    up_app.router.add_get("/{tail:.*}", slow)
    up = await aiohttp_server(up_app)

    client = await aiohttp_client(make_app(ssrf_allow=("127.0.0.0/8",), db_pool_max=2, db_pool_min=1))
    svc = client.app[SERVICES]
    org = await membership.create_org(svc, slug="acme", email="o@acme.test")
    gw = Gateway(client, org)
    sid = await gw.secret("k-123456")
    await gw.tool("slow", f"http://127.0.0.1:{up.port}", [{"location": "header", "name": "X-K", "secret_id": sid}])

    boundary = []
    real_send = upstream_mod.send

    async def watched_send(session, req, **kw):
        boundary.append((asyncio.current_task() in svc.db.holders, svc.db.in_use))
        return await real_send(session, req, **kw)

    monkeypatch.setattr(upstream_mod, "send", watched_send)
    results = await asyncio.gather(*(gw.call("GET", f"/call/slow/{i}") for i in range(N)))
    assert [r.status for r in results] == [200] * N
    assert peak == N, f"only {peak} calls were in flight at once with a pool of 2"
    assert len(boundary) == N
    assert not any(held for held, _ in boundary), "a sending task held a DB connection"
    assert svc.db.peak_in_use <= 2
    await client.close()


async def test_no_connection_held_during_the_spacers_wait(aiohttp_client, make_app, tmp_path, monkeypatch):
    """The platform tier's spacer waits after the hold is placed and before the send: 12 calls to a
    provider allowing 10 per second, through a pool of TWO connections, are made to wait, and no
    waiting task holds a connection (the hold's transaction has ended; the settle's has not begun)."""
    from treg import money
    from treg.settings import SecretStr
    from treg.testing import raw_upstream
    from treg.testing.vendors.capacity import PLATFORM_KEYS, write_plugin

    calls = 12
    async with raw_upstream() as up:
        write_plugin(tmp_path / "plugins", up.url, spaced_limit=10)
        client = await aiohttp_client(make_app(
            plugins_dir=tmp_path / "plugins", ssrf_allow=("127.0.0.0/8",), db_pool_max=2, db_pool_min=1,
            platform={k: SecretStr(v) for k, v in PLATFORM_KEYS.items()}))
        svc = client.app[SERVICES]
        org = await membership.create_org(svc, slug="acme", email="o@acme.test")
        await money.grant(svc, org_id=org["org_id"], amount_micro=100_000, actor="test")
        gw = Gateway(client, org)

        waits = []
        real_sleep = svc.spacer.sleep

        async def watched_sleep(seconds):
            waits.append((seconds, asyncio.current_task() in svc.db.holders, svc.db.in_use))
            await real_sleep(seconds)

        monkeypatch.setattr(svc.spacer, "sleep", watched_sleep)
        results = await asyncio.gather(*(gw.call("GET", "/catalog/call/spaced.get") for _ in range(calls)))
        assert [r.status for r in results] == [200] * calls
        assert [r.headers["X-Treg-Cost-Micro"] for r in results] == ["100"] * calls  # each hold was placed
        assert len(waits) >= calls // 2 and max(s for s, _, _ in waits) >= 0.3, waits
        assert not any(held for _, held, _ in waits), "a task held a DB connection while the spacer made it wait"
        assert svc.db.peak_in_use <= 2
        await client.close()
