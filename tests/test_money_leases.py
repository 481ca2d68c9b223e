"""Credit leases (docs/money.md "Credit leases", treg/money/leases.py): a busy (org, member, tag) takes
its platform-tier holds from one lease in memory, and every money guarantee holds as with holds of their
own — the books exact, every call's hold row closed exactly once, near a limit every call on its own
hold, two processes on one database, a failing close retried, and ``kill -9`` between an answer and its
close leaving a lease the reaper releases in the callers' favour, the calls' audit rows saying so. A call
a limit refuses while another process's lease parks credit gets it back instead of a 402, and
``/metrics`` counts the leases.

Real parts: the test database, treg on real sockets (the test gateway, and ``treg serve`` processes),
the raw-socket upstream standing in for the vendor."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import Any, AsyncIterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from treg import membership, money, reaper
from treg.cache import CHANNEL
from treg.keys import SERVICES
from treg.hold import SETTLED, Close
from treg.settings import SecretStr
from treg.testing import (Api, Gateway, ProviderPlugin, Served, assert_clean_exits, check_books, credited_org,
                          example_provider, example_provider_env, hold_close_fault, http_response, open_services,
                          raw_upstream, run_sql, served_pair, sixteen_calls_on_credit_for_ten, stop_all, within)

PRICE = 2000  # acme.items.get, per call (treg.testing.example_provider)
PATH = "/catalog/call/acme.items.get?item_id=7"
LEASE_CALLS = 4

@contextlib.asynccontextmanager
async def _leasing_gateway(aiohttp_client: Any, make_app: Any, *, credit_calls: int,
                           **settings: Any) -> AsyncIterator[Gateway]:
    """A gateway whose every platform-tier key leases from its first hold (``TREG_MONEY_LEASE_AFTER=1``),
    four calls' worth at a time (none grows unless ``money_lease_max_calls`` says so); the example provider
    on a raw upstream; credit for ``credit_calls``."""
    settings.setdefault("money_lease_max_calls", LEASE_CALLS)
    async with raw_upstream(lambda ex: http_response(200, b'{"ok": true}', [("Content-Type", "application/json")])) as up:
        app = make_app(extra_plugins=(ProviderPlugin([example_provider(up.url + "/v1")]),),
                       ssrf_allow=("127.0.0.0/8",), platform={"TREG_PLATFORM_KEY_ACME": SecretStr("pk-platform")},
                       money_lease_after=1, money_lease_calls=LEASE_CALLS, **settings)
        client = await aiohttp_client(app)
        org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
        gw = Gateway(client, org)
        await money.grant(gw.services, org_id=org["org_id"], amount_micro=credit_calls * PRICE, actor="test")
        try:
            yield gw
        finally:
            await client.close()


@pytest.fixture
async def leasing(aiohttp_client, make_app):
    """:func:`_leasing_gateway` with credit for 500 calls."""
    async with _leasing_gateway(aiohttp_client, make_app, credit_calls=500, audit_flush_ms=600_000) as gw:
        yield gw


async def _calls_rows(svc: Any, org_id: str) -> dict[str, tuple[Any, ...]]:
    await svc.audit.flush()
    async with svc.db.tx() as tx:
        rows = await tx.fetch_all("SELECT id, hold_state, cost_micro, lease_id FROM calls WHERE org_id = %(o)s",
                                  {"o": org_id})
    return {r["id"]: (r["hold_state"], r["cost_micro"], r["lease_id"]) for r in rows}


async def test_busy_calls_take_their_holds_from_leases_and_the_books_stay_exact(leasing):
    gw = leasing
    svc = gw.services
    org_id = gw.org["org_id"]
    before = svc.db.round_trips
    sequential = [await gw.client.get(PATH, headers=gw.owner) for _ in range(10)]
    # call 1 waited for a lease of four calls; calls 2, 6 and 10 spent half of the one serving, and each
    # had the next placed ahead (the last one may still be landing); every call took its hold from one
    await svc.settler.leases.placements()
    assert svc.settler.leases.placed == 4
    assert svc.db.round_trips - before < 20  # two a call without leases
    burst = await asyncio.gather(*(gw.client.get(PATH, headers=gw.owner) for _ in range(32)))
    answers = sequential + list(burst)
    assert {r.status for r in answers} == {200}
    assert {r.headers["X-Treg-Cost-Micro"] for r in answers} == {str(PRICE)}
    await svc.settler.drain()
    leases = svc.settler.leases
    assert leases.live == 0  # every lease returned by the drain
    books = await check_books(svc, org_id)
    assert books["open"] == 0 and books["settled"] == 42 * PRICE
    call_ids = {r.headers["X-Treg-Call-Id"] for r in answers}
    rows = {h["id"]: h for h in books["holds"]}
    assert all(rows[c]["state"] == "settled" and rows[c]["settled_micro"] == PRICE for c in call_ids)
    lease_rows = [h for h in books["holds"] if h["lease"]]
    assert len(lease_rows) == leases.placed and all(h["state"] == "released" for h in lease_rows)
    assert set(rows) == call_ids | {h["id"] for h in lease_rows}  # nothing else was held
    audited = await _calls_rows(svc, org_id)
    assert all(audited[c][:2] == ("settled", PRICE) for c in call_ids)
    leased = {c for c in call_ids if audited[c][2] is not None}  # the others placed holds of their own
    assert len(leased) >= 10 and {audited[c][2] for c in leased} <= {h["id"] for h in lease_rows}
    bal = await money.balance(svc, org_id)
    assert (bal.balance_micro, bal.held_micro) == (500 * PRICE - 42 * PRICE, 0)


async def test_a_lease_covers_what_its_calls_hold_while_they_run(leasing):
    """A call in flight on a lease: the lease's row holds its amount, the balance shows it held, and no
    other call can spend it; once closed, its own row says settled."""
    gw = leasing
    svc = gw.services
    hold = await money.place_hold(svc, org_id=gw.org["org_id"], member_id=None, call_id="call_inflight",
                                  amount_micro=PRICE, leasable=True)
    assert hold is not None and hold.lease_id is not None
    [(state, amount)] = await asyncio.to_thread(run_sql, svc.db.dsn,
                                                "SELECT state, amount_micro FROM holds WHERE id = %s", hold.lease_id)
    assert (state, amount) == ("held", LEASE_CALLS * PRICE)
    bal = await money.balance(svc, gw.org["org_id"])
    assert bal.held_micro == LEASE_CALLS * PRICE  # the drain retired the lease; its open call keeps it
    assert await svc.settler.close(hold, money.Close(hold.call_id, money.SETTLED, PRICE))
    await svc.settler.drain()
    assert await money.hold_state(svc, "call_inflight") == "settled"
    bal = await money.balance(svc, gw.org["org_id"])
    assert (bal.balance_micro, bal.held_micro) == (500 * PRICE - PRICE, 0)
    books = await check_books(svc, gw.org["org_id"])
    assert books["open"] == 0 and books["settled"] == PRICE


async def test_near_the_limit_every_call_places_its_own_hold(aiohttp_client, make_app):
    """Credit for 20 calls leaves no headroom for a lease of 4 (it needs 8 leases' worth beside it): 30
    calls at once charge exactly 20, each on its own hold, and the other 10 are refused."""
    async with _leasing_gateway(aiohttp_client, make_app, credit_calls=20) as gw:
        svc = gw.services
        results = await asyncio.gather(*(gw.client.get(PATH, headers=gw.owner) for _ in range(30)))
        statuses = sorted(r.status for r in results)
        assert statuses == [200] * 20 + [402] * 10
        assert svc.settler.leases.placed == 0 and svc.settler.leases.refused >= 1
        books = await check_books(svc, gw.org["org_id"])
        assert books["open"] == 0 and books["settled"] == 20 * PRICE and not any(h["lease"] for h in books["holds"])


@pytest.mark.parametrize("code", ["57014", "08006"], ids=["statement-timeout", "connection-failure"])
async def test_a_failing_leased_close_is_retried_and_written_once(leasing, dsn, code):
    gw = leasing
    svc = gw.services
    assert (await gw.client.get(PATH, headers=gw.owner)).status == 200
    await svc.settler.drain()
    await asyncio.to_thread(hold_close_fault, dsn, code)
    try:
        answers = [await asyncio.wait_for(gw.client.get(PATH, headers=gw.owner), 10) for _ in range(3)]
        assert [r.status for r in answers] == [200] * 3
        await asyncio.sleep(0.5)
        call_ids = [r.headers["X-Treg-Call-Id"] for r in answers]
        assert [await money.hold_state(svc, c) for c in call_ids] == [None] * 3  # their rows not written yet
    finally:
        await asyncio.to_thread(hold_close_fault, dsn, None)
    await asyncio.wait_for(svc.settler.drain(), 30)
    assert [await money.hold_state(svc, c) for c in call_ids] == ["settled"] * 3
    books = await check_books(svc, gw.org["org_id"])
    assert books["open"] == 0 and books["settled"] == 4 * PRICE


async def test_connections_cut_under_leased_calls_are_reopened(leasing, dsn):
    """Every treg connection is terminated (as a database restart does) while a lease serves: its
    return (the change listener's loss pauses leasing) and, once the listener is back, the next calls'
    leased closes are written on new connections, once each."""
    gw = leasing
    svc = gw.services
    assert (await gw.client.get(PATH, headers=gw.owner)).status == 200  # a lease placed, one call on it
    await asyncio.to_thread(run_sql, dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                          "WHERE datname = current_database() AND pid <> pg_backend_pid()")
    await within(10, lambda: svc.settler.leases.paused)
    await within(10, lambda: not svc.settler.leases.paused)
    statuses = [(await gw.client.get(PATH, headers=gw.owner)).status for _ in range(6)]
    await asyncio.wait_for(svc.settler.drain(), 30)
    ok = statuses.count(200)
    assert ok >= 4, statuses
    books = await check_books(svc, gw.org["org_id"])
    assert books["open"] == 0 and books["settled"] == (1 + ok) * PRICE
    assert svc.settler.leases.placed >= 2 and svc.settler.leases.live == 0


async def test_a_process_that_cannot_hear_a_return_request_parks_no_credit(aiohttp_client, make_app, dsn):
    """The change listener's connection is cut (its backend terminated) while a lease serves for a
    minute (``TREG_MONEY_LEASE_S=60``). A request to return it sent meanwhile would be lost, so the
    process returns the lease at once and places none while the listener is away; once the listener is
    back, leasing resumes. The books stay exact."""
    async with _leasing_gateway(aiohttp_client, make_app, credit_calls=100, money_lease_s=60.0) as gw:
        svc, leases = gw.services, gw.services.settler.leases
        assert (await gw.client.get(PATH, headers=gw.owner)).status == 200
        assert (leases.placed, leases.live) == (1, 1)
        cut = await asyncio.to_thread(run_sql, dsn, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                                    "WHERE datname = current_database() AND query = %s", f"LISTEN {CHANNEL}")
        assert cut == [(True,)]
        await within(10, lambda: leases.paused)
        await within(10, lambda: leases.live == 0)  # handed back at once, not after a minute,

        async def released() -> bool:  # ... and its release written by the settler, off any call's path
            rows = await asyncio.to_thread(run_sql, dsn, "SELECT state FROM holds WHERE org_id = %s AND lease",
                                           gw.org["org_id"])
            return rows == [("released",)]
        await within(10, released)
        await within(10, lambda: not leases.paused)  # the listener reconnected (0.2 s backoff)
        assert (await gw.client.get(PATH, headers=gw.owner)).status == 200
        assert (leases.placed, leases.live) == (2, 1)  # leasing again
        await asyncio.wait_for(svc.settler.drain(), 30)
        books = await check_books(svc, gw.org["org_id"])
        assert books["open"] == 0 and books["settled"] == 2 * PRICE


async def test_a_lease_placed_while_paused_is_returned_unused(leasing):
    """A placement in flight when the listener's connection is lost: the lease it places serves no
    call and is returned, and the call waiting on it places its own hold."""
    gw = leasing
    svc, leases = gw.services, gw.services.settler.leases
    placing = asyncio.ensure_future(leases.take(svc, org_id=gw.org["org_id"], member_id=None, tag=None,
                                                call_id="call_paused", amount_micro=PRICE))
    await asyncio.sleep(0)  # the placement started
    assert leases._placing
    svc.settler.listening(False)
    assert await placing is None
    assert leases.placed == 1 and leases.live == 0 and leases.paused
    assert await leases.take(svc, org_id=gw.org["org_id"], member_id=None, tag=None, call_id="call_paused2",
                             amount_micro=PRICE) is None  # none placed while paused
    assert leases.placed == 1
    svc.settler.listening(True)
    await asyncio.wait_for(svc.settler.drain(), 30)
    books = await check_books(svc, gw.org["org_id"])
    assert books["open"] == 0 and books["settled"] == 0



async def test_a_leased_close_given_up_leaves_its_lease_to_the_reaper(leasing, dsn):
    """A leased close the settler cannot write within its retries: its lease is never returned by the
    process (a return would release the calls' amounts with their closes missing); the reaper releases
    it, and marks those calls released, cost 0, as it does a crashed process's."""
    gw = leasing
    svc = gw.services
    svc.settler.retry_for_s = 0.3
    await asyncio.to_thread(hold_close_fault, dsn, "57014")
    try:
        answers = [await gw.client.get(PATH, headers=gw.owner) for _ in range(2)]
        assert [r.status for r in answers] == [200, 200]
        await asyncio.wait_for(svc.settler.drain(), 10)  # the lease retired, its closes given up
    finally:
        await asyncio.to_thread(hold_close_fault, dsn, None)
    # the two closes, the lease's return after them, and the return of the lease the second call had
    # placed ahead (half of the first spent), which served no call
    assert svc.settler.left_to_reaper == 4
    call_ids = [r.headers["X-Treg-Call-Id"] for r in answers]
    leases = await asyncio.to_thread(run_sql, dsn, "SELECT id, state FROM holds WHERE lease ORDER BY created_at")
    assert [state for _, state in leases] == ["held", "held"]
    lease_id = leases[0][0]
    audited = await _calls_rows(svc, gw.org["org_id"])
    assert [audited[c] for c in call_ids] == [("settled", PRICE, lease_id)] * 2  # what the callers were told
    assert await reaper.reap_orphans(svc, older_than_s=0) == 2
    audited = await _calls_rows(svc, gw.org["org_id"])
    assert [audited[c] for c in call_ids] == [("released", 0, lease_id)] * 2
    books = await check_books(svc, gw.org["org_id"])
    assert books["open"] == 0 and books["settled"] == 0 and books["balance"] == 500 * PRICE


def _leasing_env(tmp_path: Any, dsn: str, settings: Any, up_url: str, **more: str) -> dict[str, str]:
    return example_provider_env(tmp_path, dsn, settings.secret_key.reveal(), up_url, TREG_MONEY_LEASE_AFTER="1",
                                TREG_MONEY_LEASE_CALLS=str(LEASE_CALLS),
                                **{"TREG_MONEY_LEASE_MAX_CALLS": str(LEASE_CALLS), **more})


async def test_sixteen_calls_on_credit_for_ten_across_two_leasing_processes_charge_exactly_ten(dsn, settings,
                                                                                               tmp_path):
    """issue 23's rule with every key leasing from its first hold: credit for 10 leaves no headroom for a
    lease, so each call holds its own and the last credits go one by one, whichever process asks."""
    async with raw_upstream() as up:
        env = _leasing_env(tmp_path, dsn, settings, up.url)
        org = await credited_org(env, "tenner", 10 * PRICE)
        async with served_pair(env, tmp_path) as (A, B):
            await sixteen_calls_on_credit_for_ten(A, B, org["token"], PRICE)
    svc = await open_services(dsn, settings)
    try:
        books = await check_books(svc, org["org_id"])
        assert books["open"] == 0 and books["settled"] == 10 * PRICE and books["balance"] == 0
        assert not any(h["lease"] for h in books["holds"])
    finally:
        await svc.db.close()


@pytest.mark.parametrize("credit, sent, max_calls", [(60, 100, LEASE_CALLS), (600, 700, 64)],
                         ids=["fixed-size", "grown"])
async def test_two_processes_leasing_one_balance_never_overspend_it(dsn, settings, tmp_path, credit, sent, max_calls):
    """Credit for ``credit`` calls, ``sent`` calls through two processes that both lease, 16 at a time each
    (``grown``: leases placed ahead grow to 64 calls' worth): never more than the credit charged, every
    charge on the books exactly once, and nothing left held after both stop."""
    async with raw_upstream() as up:
        env = _leasing_env(tmp_path, dsn, settings, up.url, TREG_MONEY_LEASE_MAX_CALLS=str(max_calls))
        org = await credited_org(env, "pair", credit * PRICE)
        async with served_pair(env, tmp_path) as apis_ab:
            gates = {"a": asyncio.Semaphore(16), "b": asyncio.Semaphore(16)}
            apis = dict(zip("ab", apis_ab))

            async def one(i: int) -> tuple[int, Any, Any]:
                side = "ab"[i % 2]
                async with gates[side]:
                    return await apis[side].req("GET", f"/catalog/call/acme.items.get?item_id=p{i}", org["token"])
            results = await asyncio.gather(*(one(i) for i in range(sent)))
    ok = [int(h["X-Treg-Cost-Micro"]) for status, _, h in results if status == 200]
    refused = [body["error"] for status, body, _ in results if status == 402]
    assert len(ok) + len(refused) == sent and set(refused) <= {"insufficient_balance"}
    # at most the credit; at least what the leases still parked at the very end could not take (two a
    # process: the one serving and the one placed ahead)
    assert credit - 2 * 2 * max_calls <= len(ok) <= credit and sum(ok) == len(ok) * PRICE
    svc = await open_services(dsn, settings)
    try:
        books = await check_books(svc, org["org_id"])
        assert books["open"] == 0 and books["settled"] == len(ok) * PRICE
        assert books["balance"] == (credit - len(ok)) * PRICE
    finally:
        await svc.db.close()


async def test_killed_with_a_lease_open_the_reaper_releases_it_and_the_calls_say_so(dsn, settings, tmp_path):
    """``kill -9`` after the callers got their answers and before their leased closes were written: the
    lease stays held; a restarted treg's reaper releases it once, in the callers' favour, and those
    calls' audit rows say released, cost 0; the call closed before the kill stays charged."""
    async with raw_upstream() as up:
        env = _leasing_env(tmp_path, dsn, settings, up.url, TREG_REAPER_INTERVAL_S="0.5")
        org = await credited_org(env, "killed", 100 * PRICE)
        first = await asyncio.to_thread(Served, env, tmp_path / "first.log")
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
                api = Api(session, first.base)
                _, _, warm = await api.req("GET", "/catalog/call/acme.items.get?item_id=warm", org["token"], 200)

                async def warm_closed() -> bool:
                    return await asyncio.to_thread(run_sql, dsn, "SELECT state FROM holds WHERE id = %s",
                                                   warm["X-Treg-Call-Id"]) == [("settled",)]
                await within(10, warm_closed)
                await asyncio.to_thread(hold_close_fault, dsn, "57014")  # leased closes cannot be written from here on
                killed = []
                for i in range(3):
                    status, _, headers = await api.req("GET", f"/catalog/call/acme.items.get?item_id=k{i}",
                                                       org["token"])
                    assert status == 200 and headers["X-Treg-Cost-Micro"] == str(PRICE)
                    killed.append(headers["X-Treg-Call-Id"])

                async def audited() -> bool:
                    rows = await asyncio.to_thread(run_sql, dsn, "SELECT hold_state, lease_id FROM calls "
                                                                 "WHERE id = ANY(%s)", killed)
                    return len(rows) == 3 and all(s == "settled" and lease for s, lease in rows)
                await within(10, audited)
            first.signal(signal.SIGKILL)
            assert first.wait(10) == -signal.SIGKILL
        finally:
            first.kill()
            await asyncio.to_thread(hold_close_fault, dsn, None)
        open_leases = await asyncio.to_thread(run_sql, dsn, "SELECT id FROM holds WHERE lease AND state = 'held' "
                                                            "AND org_id = %s", org["org_id"])
        assert open_leases
        assert await asyncio.to_thread(run_sql, dsn, "SELECT id FROM holds WHERE id = ANY(%s)", killed) == []
        # the leases end (TREG_HOLD_TTL_S later: moved here instead of waited for)
        await asyncio.to_thread(run_sql, dsn, "UPDATE holds SET expires_at = now() WHERE lease AND org_id = %s",
                                org["org_id"])
        second = await asyncio.to_thread(Served, env, tmp_path / "second.log")  # its reaper runs at startup
        try:
            async def released() -> bool:
                rows = await asyncio.to_thread(run_sql, dsn, "SELECT hold_state, cost_micro FROM calls "
                                                             "WHERE id = ANY(%s)", killed)
                return rows == [("released", 0)] * 3
            await within(20, released)
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
                api = Api(session, second.base)
                _, detail, _ = await api.req("GET", f"/api/v1/calls/{killed[0]}", org["token"], 200)
                assert (detail["hold_state"], detail["cost_micro"]) == ("released", 0)
                _, detail, _ = await api.req("GET", f"/api/v1/calls/{warm['X-Treg-Call-Id']}", org["token"], 200)
                assert (detail["hold_state"], detail["cost_micro"]) == ("settled", PRICE)
                _, balance, _ = await api.req("GET", "/api/v1/balance", org["token"], 200)
                assert (balance["balance_micro"], balance["held_micro"]) == (100 * PRICE - PRICE, 0)
        finally:
            codes = await stop_all(second)
    assert_clean_exits(codes, second)
    svc = await open_services(dsn, settings)
    try:
        books = await check_books(svc, org["org_id"])
        assert books["open"] == 0 and books["settled"] == PRICE  # the warm-up call; the killed ones released
        assert await reaper.reap_orphans(svc, older_than_s=0) == 0  # a second sweep finds nothing more
    finally:
        await svc.db.close()


async def _lease_figures(gw: Gateway) -> dict[str, float]:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{gw.client.port}/metrics") as resp:
            assert resp.status == 200
            text = await resp.text()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "treg_credit_leases_total":
                out[s.labels["event"]] = s.value
            elif s.name == "treg_credit_leases_live":
                out["live"] = s.value
    return out


async def test_metrics_count_the_leases_placed_returned_and_live(leasing):
    """/metrics reports the process's leases: four placed by ten calls (one waited for, three placed
    ahead), live until the drain returns them, then returned; none refused."""
    gw = leasing
    assert await _lease_figures(gw) == {"placed": 0, "refused": 0, "returned": 0, "live": 0}
    for _ in range(10):
        assert (await gw.client.get(PATH, headers=gw.owner)).status == 200
    await gw.services.settler.leases.placements()
    mid = await _lease_figures(gw)
    assert mid["placed"] == 4 and mid["refused"] == 0
    assert mid["live"] == 4 - mid["returned"] and mid["live"] >= 2  # the last two serve calls for a second
    await gw.services.settler.drain()
    assert await _lease_figures(gw) == {"placed": 4, "refused": 0, "returned": 4, "live": 0}


async def test_metrics_count_a_refused_lease(aiohttp_client, make_app):
    """Credit for 20 calls leaves no headroom for a lease of four: the refusal is counted, and the call
    places its own hold."""
    async with _leasing_gateway(aiohttp_client, make_app, credit_calls=20) as gw:
        assert (await gw.client.get(PATH, headers=gw.owner)).status == 200
        assert await _lease_figures(gw) == {"placed": 0, "refused": 1, "returned": 0, "live": 0}


async def test_credit_parked_in_another_process_lease_comes_back_instead_of_a_402(dsn, settings, tmp_path):
    """Credit for 40 calls. Process A leases four calls' worth on its first call and would keep the lease
    for a minute (``TREG_MONEY_LEASE_S=60``); process B, without leases, spends the other 36. B's 37th
    call meets the balance's limit while A's lease still parks three calls' worth: it asks for the lease
    back (NOTIFY), A returns it, and the call is charged instead of refused. The 41st call is a real 402,
    and the books hold exactly 40 charges."""
    async with raw_upstream() as up:
        env_a = _leasing_env(tmp_path, dsn, settings, up.url, TREG_MONEY_LEASE_S="60")
        env_b = dict(env_a, TREG_MONEY_LEASE_CALLS="0")
        org = await credited_org(env_a, "parked", 40 * PRICE)
        async with served_pair(env_a, tmp_path, env_b) as (A, B):
            status, _, _ = await A.req("GET", PATH, org["token"])
            assert status == 200
            [(lease_state, lease_amount)] = await asyncio.to_thread(
                run_sql, dsn, "SELECT state, amount_micro FROM holds WHERE org_id = %s AND lease", org["org_id"])
            assert (lease_state, lease_amount) == ("held", LEASE_CALLS * PRICE)
            statuses = [(await B.req("GET", PATH, org["token"]))[0] for _ in range(39)]
            assert statuses == [200] * 39  # 36 on free credit, 3 on the credit A's lease gave back
            status, body, _ = await B.req("GET", PATH, org["token"])
            assert (status, body["error"]) == (402, "insufficient_balance")
    svc = await open_services(dsn, settings)
    try:
        books = await check_books(svc, org["org_id"])
        assert books["open"] == 0 and books["settled"] == 40 * PRICE and books["balance"] == 0
        assert [h["state"] for h in books["holds"] if h["lease"]] == ["released"]
    finally:
        await svc.db.close()


@pytest.mark.parametrize("leasable", [False, True], ids=["own-holds", "leased"])
@pytest.mark.parametrize("code", ["22003", "23514"], ids=["data-exception", "constraint"])
async def test_a_close_the_database_refuses_costs_only_itself(leasing, dsn, leasable, code):
    """One close in a batch that the database refuses for what it carries (a data exception, a
    constraint: retrying cannot help) once failed the whole statement, so the reaper released every hold
    of the batch, calls whose callers were told they were charged. The settler writes the batch by halves
    until the refused close is alone: the others are settled once, only it is the reaper's."""
    gw = leasing
    svc = gw.services
    org_id = gw.org["org_id"]
    calls = [f"call_batch{i}" for i in range(6)]
    placed = [await money.place_hold(svc, org_id=org_id, member_id=None, call_id=c, amount_micro=PRICE,
                                     leasable=leasable) for c in calls]
    assert [h is not None and (h.lease_id is not None) == leasable for h in placed] == [True] * 6
    refused = calls[2]
    await asyncio.to_thread(hold_close_fault, dsn, code, refused)
    try:
        for h in placed:  # queued together: one batch
            assert h is not None and await svc.settler.close(h, Close(h.call_id, SETTLED, PRICE))
        await asyncio.wait_for(svc.settler.drain(), 10)
        states = {c: await money.hold_state(svc, c) for c in calls}
    finally:
        await asyncio.to_thread(hold_close_fault, dsn, None)
    assert {c: s for c, s in states.items() if c != refused} == {c: "settled" for c in calls if c != refused}
    assert states[refused] == (None if leasable else "held")  # a leased call's row is written by its close
    # leased: its lease is never returned by the process (the reaper's, as a crashed process's)
    assert svc.settler.left_to_reaper == (2 if leasable else 1)
    books = await check_books(svc, org_id)
    assert books["settled"] == 5 * PRICE and books["open"] == 1
    assert await reaper.reap_orphans(svc, older_than_s=0) == 1
    books = await check_books(svc, org_id)
    assert books["settled"] == 5 * PRICE and books["open"] == 0 and books["balance"] == (500 - 5) * PRICE


def _now(coro: Any) -> Any:
    """What ``coro`` returns when it finishes without waiting for anything; fails the test if it waits."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    pytest.fail("the call waited")


async def test_a_busy_key_has_its_next_lease_placed_ahead_and_no_call_waits_for_it(leasing):
    """Once half of a lease is spent the next one is placed in the background: while its placement is
    held up (another transaction holds the org's balance row), the calls that spend the rest of the first
    take their holds without waiting; the first call past it waits for the placement under way (none is
    started twice), and takes its hold from the lease placed ahead."""
    gw = leasing
    svc, leases = gw.services, gw.services.settler.leases
    org_id = gw.org["org_id"]

    def take(call_id: str) -> Any:
        return leases.take(svc, org_id=org_id, member_id=None, tag=None, call_id=call_id, amount_micro=PRICE)
    first = await take("call_a1")  # the key's first lease (TREG_MONEY_LEASE_AFTER=1)
    assert first is not None and leases.placed == 1
    async with svc.db.tx() as tx:
        await tx.execute("SELECT 1 FROM org_balances WHERE org_id = %(o)s FOR UPDATE", {"o": org_id})
        second = _now(take("call_a2"))  # half spent: the next placement starts, and waits for the row
        assert not leases._placing[(org_id, None, None)].done()
        rest = [_now(take(f"call_a{i}")) for i in (3, 4)]
        assert {h.lease_id for h in [second, *rest]} == {first.lease_id}
        waiting = asyncio.ensure_future(take("call_a5"))  # the first lease is spent: this call waits
        await asyncio.sleep(0.2)
        assert not waiting.done() and leases.placed == 1
        # a drain's wait for the placements under way is bounded: a database that does not answer holds
        # no drain (nor a shutdown) for longer
        await asyncio.wait_for(leases.placements(timeout=0.1), 5)
        assert not waiting.done() and leases.placed == 1
    fifth = await asyncio.wait_for(waiting, 10)
    assert fifth is not None and fifth.lease_id not in (None, first.lease_id) and leases.placed == 2
    for h in [first, second, *rest, fifth]:
        assert await svc.settler.close(h, Close(h.call_id, SETTLED, PRICE))
    await svc.settler.drain()
    assert leases.live == 0
    books = await check_books(svc, org_id)
    assert books["open"] == 0 and books["settled"] == 5 * PRICE


async def _takes(gw: Gateway, n: int) -> list[Any]:
    """``n`` holds taken from the key's leases one after another, as fast as memory gives them."""
    leases = gw.services.settler.leases
    out = [await leases.take(gw.services, org_id=gw.org["org_id"], member_id=None, tag=None, call_id=f"call_g{i}",
                             amount_micro=PRICE) for i in range(n)]
    await leases.placements()
    return out


async def _lease_amounts(gw: Gateway) -> list[int]:
    rows = await asyncio.to_thread(run_sql, gw.services.db.dsn, "SELECT amount_micro FROM holds WHERE org_id = %s "
                                   "AND lease ORDER BY created_at", gw.org["org_id"])
    return [amount for (amount,) in rows]


async def _settled(gw: Gateway, taken: list[Any]) -> dict[str, Any]:
    assert all(h is not None and h.lease_id is not None for h in taken)  # every call on a lease
    for h in taken:
        assert await gw.services.settler.close(h, Close(h.call_id, SETTLED, PRICE))
    await gw.services.settler.drain()
    return await check_books(gw.services, gw.org["org_id"])


async def test_the_lease_placed_ahead_grows_with_the_rate(aiohttp_client, make_app):
    """A key that spends half its first lease (four calls) fast has the next one sized for a quarter of
    TREG_MONEY_LEASE_S at that rate, up to TREG_MONEY_LEASE_MAX_CALLS (64 calls here). The books stay exact."""
    async with _leasing_gateway(aiohttp_client, make_app, credit_calls=5000, money_lease_max_calls=64) as gw:
        taken = await _takes(gw, 3)
        assert await _lease_amounts(gw) == [LEASE_CALLS * PRICE, 64 * PRICE]  # two calls in well under 250 ms
        books = await _settled(gw, taken)
        assert books["open"] == 0 and books["settled"] == 3 * PRICE


async def test_a_grown_lease_the_limits_refuse_leaves_the_key_leasing_at_its_base_size(aiohttp_client, make_app):
    """With credit for 500 calls the limits leave no headroom for a lease of 64 calls (8 leases' worth
    beside it): that one is refused, and the key goes on leasing four calls' worth, placed ahead each
    time, never on calls' own holds. The books stay exact."""
    async with _leasing_gateway(aiohttp_client, make_app, credit_calls=500, money_lease_max_calls=64) as gw:
        leases = gw.services.settler.leases
        taken = await _takes(gw, 10)
        assert leases.refused == 1  # the grown one
        assert await _lease_amounts(gw) == [LEASE_CALLS * PRICE] * leases.placed and leases.placed >= 3
        books = await _settled(gw, taken)
        assert books["open"] == 0 and books["settled"] == 10 * PRICE
