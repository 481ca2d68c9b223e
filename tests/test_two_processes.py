"""Two real ``treg serve`` processes on one PostgreSQL database (operability.md, "Several processes"):
a change made through one is honoured by the other within 2 s; money, idempotency and the reaper are
exact across them."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import psycopg2
from sqlalchemy import text, update

from treg import membership, money, testing
from treg.infra.schema import holds
from treg import reaper
from treg.testing import (PROPAGATION_S, Api, assert_clean_exits, check_books, open_services, run_treg,
                          serve_pair, stop_all, within)

PRICE = 2000  # acme.items.get, per call (treg.testing.example_provider)



def _sql(dsn: str, query: str, *args: Any) -> list[tuple]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(query, args)
            return cur.fetchall()
    finally:
        conn.close()


async def _orphans(dsn: str, settings, n: int) -> tuple[str, list[str]]:
    """An org with ``n`` open holds already past their expiry (left by a crashed process)."""
    svc = await open_services(dsn, settings)
    try:
        org = await membership.create_org(svc, slug="crashed", email="c@crashed.test")
        await money.grant(svc, org_id=org["org_id"], amount_micro=n * 1_000, actor="test")
        ids = [f"orphan{i}" for i in range(n)]
        for call_id in ids:
            await money.place_hold(svc, org_id=org["org_id"], member_id=None, call_id=call_id, amount_micro=1_000)
        async with svc.db.tx() as tx:
            await tx.execute(update(holds).where(holds.c.id.in_(ids)).values(expires_at=text("now() - interval '1 s'")))
        return org["org_id"], ids
    finally:
        await svc.db.close()


async def test_two_processes_on_one_database(dsn, settings, tmp_path):
    orphan_org, orphan_ids = await _orphans(dsn, settings, 30)
    async with testing.raw_upstream() as up:
        env = testing.example_provider_env(tmp_path, dsn, settings.secret_key.reveal(), up.url,
                                           TREG_PLATFORM_KEY_ACME="pk-platform", TREG_REAPER_INTERVAL_S="0.5")
        acme = json.loads((await asyncio.to_thread(run_treg, env, "init", "--org", "acme",
                                                   "--email", "o@acme.test")).stdout)
        bank = json.loads((await asyncio.to_thread(run_treg, env, "init", "--org", "bank",
                                                   "--email", "o@bank.test")).stdout)
        for slug, micro in (("acme", 1_000_000), ("bank", 25 * PRICE)):
            granted = await asyncio.to_thread(run_treg, env, "credits", "grant", "--org", slug, "--micro", str(micro))
            assert granted.returncode == 0, granted.stderr
        # both start at once: both run the reaper at startup, over the same expired holds
        a, b = await serve_pair(env, tmp_path)
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                A, B = Api(session, a.base), Api(session, b.base)
                await _changes_propagate(A, B, acme, up)
                await _idempotency_across(A, B, acme, up)
                await _money_exact(A, B, bank, dsn)
            await _reaped_once(dsn, orphan_org, orphan_ids)
        finally:
            codes = await stop_all(a, b)
    assert_clean_exits(codes, a, b)


async def _changes_propagate(A: Api, B: Api, org: dict[str, Any], up: Any) -> None:
    owner = org["token"]
    # a secret (and the tool that binds it): B caches the tool and its secret, A rebinds it
    _, s1, _ = await A.req("POST", "/api/v1/secrets", owner, 201, json={"name": "one", "value": "value-ONE"})
    _, s2, _ = await A.req("POST", "/api/v1/secrets", owner, 201, json={"name": "two", "value": "value-TWO"})
    binding = {"location": "header", "name": "Authorization", "format": "Bearer {secret}"}
    _, tool, _ = await A.req("POST", "/api/v1/tools", owner, 201, json={
        "name": "up", "base_url": up.url + "/v1", "bindings": [{**binding, "secret_id": s1["id"]}]})
    for _ in range(3):
        await B.req("GET", "/call/up/x", owner, 200)
    assert up.last.header("Authorization") == "Bearer value-ONE"
    await A.req("PATCH", f"/api/v1/tools/{tool['id']}", owner, 200, json={"bindings": [{**binding, "secret_id": s2["id"]}]})

    async def sees_two() -> bool:
        await B.req("GET", "/call/up/x", owner, 200)
        return up.last.header("Authorization") == "Bearer value-TWO"
    await within(PROPAGATION_S, sees_two)

    # a provider secret made through A: B's catalog call moves from the platform key to the team's
    await B.req("GET", "/catalog/call/acme.items.get?item_id=p1", owner, 200)
    assert up.last.header("Authorization") == "Bearer pk-platform"
    _, team, _ = await A.req("POST", "/api/v1/secrets", owner, 201,
                             json={"name": "acme", "value": "team-KEY", "provider": "acme"})

    async def team_key() -> bool:
        await B.req("GET", "/catalog/call/acme.items.get?item_id=p2", owner, 200)
        return up.last.header("Authorization") == "Bearer team-KEY"
    await within(PROPAGATION_S, team_key)
    await A.req("DELETE", f"/api/v1/secrets/{team['id']}", owner, 204)

    async def platform_again() -> bool:
        await B.req("GET", "/catalog/call/acme.items.get?item_id=p3", owner, 200)
        return up.last.header("Authorization") == "Bearer pk-platform"
    await within(PROPAGATION_S, platform_again)

    # a deny rule
    _, rule, _ = await A.req("POST", "/api/v1/deny-rules", owner, 201,
                             json={"host": "127.0.0.1", "path": "/v1/blocked", "reason": "ops test"})

    async def denied() -> bool:
        return (await B.req("GET", "/call/up/blocked", owner))[0] == 403
    await within(PROPAGATION_S, denied)
    await A.req("DELETE", f"/api/v1/deny-rules/{rule['id']}", owner, 204)

    async def allowed() -> bool:
        return (await B.req("GET", "/call/up/blocked", owner))[0] == 200
    await within(PROPAGATION_S, allowed)

    # a member scope: a member B admitted loses the tool when A narrows it to the owner
    _, member, _ = await A.req("POST", "/api/v1/members", owner, 201, json={"email": "m@acme.test", "role": "member"})
    for _ in range(2):
        await B.req("GET", "/call/up/x", member["token"], 200)
    await A.req("PATCH", f"/api/v1/tools/{tool['id']}", owner, 200, json={"allowed_member_ids": [org["member_id"]]})

    async def scoped_out() -> bool:
        return (await B.req("GET", "/call/up/x", member["token"]))[0] == 403
    await within(PROPAGATION_S, scoped_out)

    # a token revocation
    _, extra, _ = await A.req("POST", "/api/v1/tokens", owner, 201, json={})
    for _ in range(2):
        await B.req("GET", "/api/v1/me", extra["token"], 200)
    _, listed, _ = await A.req("GET", "/api/v1/tokens", owner, 200)
    (token_id,) = [t["id"] for t in listed["tokens"] if extra["token"].startswith(t["prefix"])]
    await A.req("DELETE", f"/api/v1/tokens/{token_id}", owner, 204)

    async def revoked() -> bool:
        return (await B.req("GET", "/call/up/x", extra["token"]))[0] == 401
    await within(PROPAGATION_S, revoked)


async def _idempotency_across(A: Api, B: Api, org: dict[str, Any], up: Any) -> None:
    owner = org["token"]
    path = "/catalog/call/acme.items.get?item_id=idem1"
    before = sum(1 for ex in up.exchanges if "/items/idem1" in ex.target)
    _, start, _ = await A.req("GET", "/api/v1/balance", owner, 200)
    status, first, h1 = await A.req("GET", path, owner, headers={"Idempotency-Key": "ops-k1"})
    assert status == 200 and h1.get("X-Treg-Idempotent-Replay") is None
    charged: dict[str, Any] = {}

    async def charged_once() -> bool:
        # A closes the hold off the answer's path (treg/money/settler.py): B sees it within moments
        nonlocal charged
        _, charged, _ = await B.req("GET", "/api/v1/balance", owner, 200)
        return charged["held_micro"] == 0
    await within(PROPAGATION_S, charged_once)
    assert charged["balance_micro"] == start["balance_micro"] - PRICE
    status, again, h2 = await B.req("GET", path, owner, headers={"Idempotency-Key": "ops-k1"})
    assert status == 200 and h2.get("X-Treg-Idempotent-Replay") == "true", dict(h2)
    assert again == first
    assert sum(1 for ex in up.exchanges if "/items/idem1" in ex.target) == before + 1  # relayed once
    _, after, _ = await A.req("GET", "/api/v1/balance", owner, 200)
    assert after["balance_micro"] == charged["balance_micro"]  # the replay through B is not charged again


async def _money_exact(A: Api, B: Api, org: dict[str, Any], dsn: str) -> None:
    """60 billed calls through both processes at once against credits for 25: exactly 25 charged."""
    token = org["token"]
    gates = {id(A): asyncio.Semaphore(8), id(B): asyncio.Semaphore(8)}

    async def one(api: Api, i: int) -> tuple[int, int]:
        async with gates[id(api)]:
            status, _, headers = await api.req("GET", f"/catalog/call/acme.items.get?item_id=m{i}", token)
            return status, int(headers.get("X-Treg-Cost-Micro") or 0)

    results = await asyncio.wait_for(asyncio.gather(*(one(A if i % 2 else B, i) for i in range(60))), 120)
    ok = [cost for status, cost in results if status == 200]
    assert sorted({status for status, _ in results}) == [200, 402], results
    assert len(ok) == 25 and sum(ok) == 25 * PRICE
    async def books_closed() -> bool:  # B's closes land within moments of A's read (off the answers' path)
        _, balance, _ = await A.req("GET", "/api/v1/balance", token, 200)
        return (balance["balance_micro"], balance["held_micro"]) == (0, 0)
    await within(PROPAGATION_S, books_closed)
    rows = await asyncio.to_thread(_sql, dsn, "SELECT state, count(*), sum(settled_micro) FROM holds h "
                                              "JOIN orgs o ON o.id = h.org_id WHERE o.slug = 'bank' GROUP BY state")
    states = {state: (n, int(total)) for state, n, total in rows}
    assert "held" not in states and states["settled"] == (25, 25 * PRICE), states


async def _reaped_once(dsn: str, org_id: str, ids: list[str]) -> None:
    rows = await asyncio.to_thread(_sql, dsn, "SELECT state, count(*) FROM holds WHERE id = ANY(%s) GROUP BY state",
                                   ids)
    assert rows == [("released", len(ids))]
    (held, granted, settled), = await asyncio.to_thread(
        _sql, dsn, "SELECT held_micro, granted_micro, settled_micro FROM org_balances WHERE org_id = %s", org_id)
    assert (held, settled) == (0, 0) and granted == len(ids) * 1_000  # released once: no negative held


async def test_reaper_sweeps_one_at_a_time_across_processes(dsn, settings):
    """Two processes' services on one database: while one holds the sweep's lock the other does nothing;
    run together, each expired hold is released once and the books stay exact."""
    first, second = await open_services(dsn, settings), await open_services(dsn, settings)
    try:
        org = await membership.create_org(first, slug="reap", email="r@reap.test")
        oid = org["org_id"]
        await money.grant(first, org_id=oid, amount_micro=200_000, actor="test")
        ids = [f"h{i}" for i in range(120)]
        for call_id in ids:
            await money.place_hold(first, org_id=oid, member_id=None, call_id=call_id, amount_micro=1_000)
        async with first.db.tx() as tx:
            await tx.execute(update(holds).where(holds.c.id.in_(ids)).values(expires_at=text("now() - interval '1 s'")))

        # a sweep under way elsewhere (its lock held on another session): this process leaves the work
        blocker = psycopg2.connect(dsn)
        try:
            with blocker.cursor() as cur:
                cur.execute("SELECT pg_advisory_lock(%s)", (reaper.LOCK_KEY,))
            assert await reaper.run_once(second) == {"holds_released": 0, "idempotency_pruned": 0}
            assert await money.hold_state(second, "h0") == "held"
        finally:
            blocker.close()  # the lock goes with the session

        results = await asyncio.gather(reaper.run_once(first), reaper.run_once(second), reaper.run_once(first))
        assert sum(r["holds_released"] for r in results) == len(ids)
        assert sorted(r["holds_released"] for r in results)[:2] == [0, 0]  # one sweep did the work
        assert {await money.hold_state(first, i) for i in ids} == {"released"}
        b = await money.balance(first, oid)
        assert (b.balance_micro, b.held_micro) == (200_000, 0)
        await check_books(first, oid)
    finally:
        await first.db.close()
        await second.db.close()
