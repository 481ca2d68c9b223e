"""The platform tier's money path (issue 23, docs/money.md "One statement to hold, one to close"): a hold
is one database round trip and its close another, written off the answer's path by the settler; the
limits stay exact across processes; and a crash, a cut connection or a statement timeout between the
answer and its close leaves a hold that is closed exactly once (by the settler's retry or the reaper); a
caller that goes away while its hold is placed leaves no hold open.

Real parts: the test database, treg on real sockets (the test gateway, and ``treg serve`` processes),
the raw-socket upstream standing in for the vendor."""

from __future__ import annotations

import asyncio
import signal
from typing import Any

import aiohttp
import psycopg2
import pytest

from treg import membership, money
from treg.call import service
from treg.keys import SERVICES
from treg import reaper
from treg.settings import SecretStr
from treg.testing import (Api, Gateway, ProviderPlugin, Served, assert_clean_exits, check_books, credited_org,
                          call_input, example_provider, example_provider_env, hold_close_fault, http_response, open_services,
                          raw_upstream, served_pair, sixteen_calls_on_credit_for_ten, stop_all, within)

PRICE = 2000  # acme.items.get, per call (treg.testing.example_provider)
PATH = "/catalog/call/acme.items.get?item_id=7"

def _sql(dsn: str, query: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(query, args or None)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


@pytest.fixture
async def platform(aiohttp_client, make_app):
    """(gateway, upstream): the example provider on a raw upstream, treg's platform key for it, credits."""
    async with raw_upstream(lambda ex: http_response(200, b'{"ok": true}', [("Content-Type", "application/json")])) as up:
        app = make_app(extra_plugins=(ProviderPlugin([example_provider(up.url + "/v1")]),),
                       ssrf_allow=("127.0.0.0/8",), platform={"TREG_PLATFORM_KEY_ACME": SecretStr("pk-platform")},
                       audit_flush_ms=600_000)  # no audit batch in the middle of a count (flushed on demand)
        client = await aiohttp_client(app)
        org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
        gw = Gateway(client, org)
        await money.grant(gw.services, org_id=org["org_id"], amount_micro=1_000_000, actor="test")
        yield gw, up
        await client.close()


async def test_a_platform_call_is_one_round_trip_to_hold_and_one_to_close(platform):
    gw, _ = platform
    svc = gw.services
    for _ in range(3):  # the caches warm: the caller, the org's tools and secret rows are in memory
        assert (await gw.call("GET", PATH)).status == 200
    before = svc.db.round_trips
    r = await gw.call("GET", PATH)  # waits for the close the call queued
    assert r.status == 200 and r.headers["X-Treg-Cost-Micro"] == str(PRICE)
    assert svc.db.round_trips - before == 2  # treg_place_hold, then treg_close_holds
    await svc.audit.flush()
    detail = await gw.api("GET", f"/api/v1/calls/{r.headers['X-Treg-Call-Id']}", expect=200)
    assert (detail["hold_state"], detail["cost_micro"]) == ("settled", PRICE)
    books = await check_books(svc, gw.org["org_id"])
    assert books["open"] == 0 and books["settled"] == 4 * PRICE


async def test_concurrent_closes_share_statements_and_stay_exact(platform):
    """32 calls at once: each placed its own hold (one statement each), and the settler wrote their
    closes in fewer statements than calls, every one exactly once."""
    gw, _ = platform
    svc = gw.services
    await gw.call("GET", PATH)
    closes = svc.settler.statements
    results = await asyncio.gather(*(gw.client.get(PATH, headers=gw.owner) for _ in range(32)))
    assert {r.status for r in results} == {200}
    await svc.settler.drain()
    assert svc.settler.statements - closes < 32
    books = await check_books(svc, gw.org["org_id"])
    assert books["open"] == 0 and books["settled"] == 33 * PRICE
    bal = await money.balance(svc, gw.org["org_id"])
    assert (bal.balance_micro, bal.held_micro) == (1_000_000 - 33 * PRICE, 0)


@pytest.mark.parametrize("code", ["57014", "08006"], ids=["statement-timeout", "connection-failure"])
async def test_a_failing_close_is_retried_and_written_once(platform, dsn, code):
    """The close fails (a statement timeout, a broken connection) a few times, then works: the answer
    left at once with its charge, and the hold is settled exactly once when the database is back."""
    gw, _ = platform
    svc = gw.services
    await gw.call("GET", PATH)
    await asyncio.to_thread(hold_close_fault, dsn, code)
    try:
        r = await asyncio.wait_for(gw.client.get(PATH, headers=gw.owner), 10)  # not the gateway's call: it drains
        assert r.status == 200 and r.headers["X-Treg-Cost-Micro"] == str(PRICE)
        call_id = r.headers["X-Treg-Call-Id"]
        await asyncio.sleep(0.5)
        assert await money.hold_state(svc, call_id) == "held"  # the close is being retried
    finally:
        await asyncio.to_thread(hold_close_fault, dsn, None)
    await asyncio.wait_for(svc.settler.drain(), 30)
    assert await money.hold_state(svc, call_id) == "settled"
    books = await check_books(svc, gw.org["org_id"])
    assert books["open"] == 0 and books["settled"] == 2 * PRICE


async def test_connections_cut_under_the_settler_are_reopened(platform, dsn):
    """Every treg connection is terminated (as a database restart does) between calls: the next closes
    are written on new connections, once each."""
    gw, _ = platform
    svc = gw.services
    await gw.call("GET", PATH)
    await asyncio.to_thread(_sql, dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                       "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    statuses = []
    for _ in range(5):  # a broken pooled connection fails one attempt; the retry takes a new one
        r = await gw.client.get(PATH, headers=gw.owner)
        statuses.append(r.status)
    await asyncio.wait_for(svc.settler.drain(), 30)
    ok = statuses.count(200)
    books = await check_books(svc, gw.org["org_id"])
    assert books["open"] == 0 and books["settled"] == (1 + ok) * PRICE
    assert ok >= 3, statuses


async def test_sixteen_calls_on_credit_for_ten_across_two_processes_charge_exactly_ten(dsn, settings, tmp_path):
    async with raw_upstream() as up:
        env = example_provider_env(tmp_path, dsn, settings.secret_key.reveal(), up.url)
        org = await credited_org(env, "tenner", 10 * PRICE)
        async with served_pair(env, tmp_path) as (A, B):
            await sixteen_calls_on_credit_for_ten(A, B, org["token"], PRICE)
            # a balance read waits for its own process's queued closes; the other's land within moments
            for api in (A, B):
                async def settled(api: Api = api) -> bool:
                    _, balance, _ = await api.req("GET", "/api/v1/balance", org["token"], 200)
                    return (balance["balance_micro"], balance["held_micro"]) == (0, 0)
                await within(2, settled)
    svc = await open_services(dsn, settings)
    try:
        books = await check_books(svc, org["org_id"])
        assert books["open"] == 0 and books["settled"] == 10 * PRICE
    finally:
        await svc.db.close()


async def test_killed_between_the_answer_and_its_close_the_reaper_closes_the_hold_once(dsn, settings, tmp_path):
    """``kill -9`` after the caller got its answer and before the close was written: the hold stays
    open; a restarted treg's reaper releases it, in the caller's favour, exactly once; the books and the
    call's audit row agree."""
    async with raw_upstream() as up:
        env = example_provider_env(tmp_path, dsn, settings.secret_key.reveal(), up.url, TREG_REAPER_INTERVAL_S="0.5")
        org = await credited_org(env, "killed", 100 * PRICE)
        first = await asyncio.to_thread(Served, env, tmp_path / "first.log")
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
                api = Api(session, first.base)
                _, _, warm = await api.req("GET", "/catalog/call/acme.items.get?item_id=warm", org["token"], 200)

                async def warm_closed() -> bool:  # the settler gathers closes for a moment before it writes
                    return await asyncio.to_thread(_sql, dsn, "SELECT state FROM holds WHERE id = %s",
                                                   warm["X-Treg-Call-Id"]) == [("settled",)]
                await within(10, warm_closed)
                await asyncio.to_thread(hold_close_fault, dsn, "57014")  # closes cannot be written from here on
                status, _, headers = await api.req("GET", "/catalog/call/acme.items.get?item_id=k", org["token"])
                assert status == 200 and headers["X-Treg-Cost-Micro"] == str(PRICE)
                call_id = headers["X-Treg-Call-Id"]

                async def audited() -> bool:
                    rows = await asyncio.to_thread(_sql, dsn, "SELECT hold_state FROM calls WHERE id = %s", call_id)
                    return rows == [("settled",)]  # what the caller was told
                await within(10, audited)
            first.signal(signal.SIGKILL)
            assert first.wait(10) == -signal.SIGKILL
        finally:
            first.kill()
            await asyncio.to_thread(hold_close_fault, dsn, None)
        assert await asyncio.to_thread(_sql, dsn, "SELECT state FROM holds WHERE id = %s", call_id) == [("held",)]
        # the lease ends (TREG_HOLD_TTL_S later: moved here instead of waited for)
        await asyncio.to_thread(_sql, dsn, "UPDATE holds SET expires_at = now() WHERE id = %s", call_id)
        second = await asyncio.to_thread(Served, env, tmp_path / "second.log")  # its reaper runs at startup
        try:
            async def released() -> bool:
                rows = await asyncio.to_thread(_sql, dsn, "SELECT state, settled_micro FROM holds WHERE id = %s",
                                               call_id)
                return rows == [("released", 0)]
            await within(20, released)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
                api = Api(session, second.base)
                _, detail, _ = await api.req("GET", f"/api/v1/calls/{call_id}", org["token"], 200)
                assert (detail["hold_state"], detail["cost_micro"]) == ("released", 0)
                _, listed, _ = await api.req("GET", "/api/v1/calls?limit=10", org["token"], 200)
                [row] = [c for c in listed["calls"] if c["call_id"] == call_id]
                assert row["cost_micro"] == 0  # the list and the detail agree
                _, balance, _ = await api.req("GET", "/api/v1/balance", org["token"], 200)
                assert (balance["balance_micro"], balance["held_micro"]) == (100 * PRICE - PRICE, 0)
        finally:
            codes = await stop_all(second)
    assert_clean_exits(codes, second)
    svc = await open_services(dsn, settings)
    try:
        books = await check_books(svc, org["org_id"])
        assert books["open"] == 0 and books["settled"] == PRICE  # the warm-up call; the killed one released
        # a second sweep finds nothing more to close
        assert await reaper.reap_orphans(svc, older_than_s=0) == 0
    finally:
        await svc.db.close()


@pytest.mark.parametrize("bad", [-1, 1.5, True], ids=["negative", "float", "bool"])
async def test_a_bad_close_fails_its_own_caller_and_the_settler_goes_on(platform, bad):
    """A close the statement cannot write (a programming error upstream of the settler) is refused in its
    caller: it never reaches a batch, where it would take other calls' closes and the settler's loop down."""
    import datetime

    from treg.hold import SETTLED, Close, Hold

    gw, _ = platform
    svc = gw.services
    assert (await gw.call("GET", PATH)).status == 200
    hold = Hold(call_id="call_bad", org_id=gw.org["org_id"], member_id=None, tag=None, amount_micro=PRICE,
                day=datetime.date.today(),
                expires_at=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1))
    with pytest.raises(ValueError):
        await svc.settler.close(hold, Close("call_bad", SETTLED, bad))
    r = await gw.call("GET", PATH)  # the settler still writes the next call's close
    assert r.status == 200 and r.headers["X-Treg-Cost-Micro"] == str(PRICE)
    books = await check_books(svc, gw.org["org_id"])
    assert books["open"] == 0 and books["settled"] == 2 * PRICE


async def test_a_call_cancelled_while_its_hold_is_placed_releases_the_hold(platform, dsn):
    """The caller goes away while ``treg_place_hold`` waits on the org's balance row (locked by another
    transaction here): the statement still places the hold once the lock is free, and the hold is
    released at once, not left open for the reaper's TTL with the call's credit parked in it."""
    gw, _ = platform
    svc = gw.services
    assert (await gw.call("GET", PATH)).status == 200  # warm: the next call's first statement is its hold
    await svc.settler.drain()
    before = await money.balance(svc, gw.org["org_id"])
    locker = await asyncio.to_thread(psycopg2.connect, dsn)
    try:
        cur = locker.cursor()
        await asyncio.to_thread(cur.execute, "SELECT 1 FROM org_balances WHERE org_id = %s FOR UPDATE",
                                (gw.org["org_id"],))
        inp = call_input("acme.items.get", surface="catalog", raw_query="item_id=7", token=gw.org["token"],
                         call_id="call_cancelled_in_place")
        task = asyncio.create_task(service.execute(svc, inp))
        waiting = ("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                   "AND query LIKE '%%treg_place_hold%%'")

        async def placing() -> bool:
            return (await asyncio.to_thread(_sql, dsn, waiting))[0][0] == 1
        await within(10, placing)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await asyncio.to_thread(locker.rollback)
        await asyncio.to_thread(locker.close)
    state = "SELECT state, amount_micro FROM holds WHERE id = 'call_cancelled_in_place'"

    async def closed() -> bool:
        rows = await asyncio.to_thread(_sql, dsn, state)
        return bool(rows) and rows[0][0] != "held"
    await within(10, closed)
    assert await asyncio.to_thread(_sql, dsn, state) == [("released", PRICE)]
    await svc.settler.drain()
    after = await money.balance(svc, gw.org["org_id"])
    assert (after.balance_micro, after.held_micro) == (before.balance_micro, 0)
