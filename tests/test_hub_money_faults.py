"""Hub money under faults (docs/money.md "Hub"): the caller's debit and the publisher's credit are one
statement, so a database fault at the close moves neither (and, once it clears, both); a close that
never lands is released by the reaper, neither org moving; a burst of hub calls with failing, broken
and cancelled answers leaves both orgs' books exact and every slot given back."""

from __future__ import annotations

import asyncio
import random

from treg import money, reaper
from treg.testing import check_books, http_response
from treg.testing.vendors.hub import hub_pair

PRICE = 2500
FAULT = """
CREATE OR REPLACE FUNCTION treg_test_fault() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'injected fault at close'; END $$;
CREATE TRIGGER treg_test_fault BEFORE INSERT ON credit_grants FOR EACH ROW WHEN (NEW.kind = 'earning')
    EXECUTE FUNCTION treg_test_fault();
"""


async def _state(pair, call_id):
    svc = pair.services
    async with svc.db.tx() as tx:
        hold = await tx.fetch_one("SELECT state, settled_micro FROM holds WHERE id = %(c)s", {"c": call_id})
        earned = await tx.scalar("SELECT count(*) FROM credit_grants WHERE kind = 'earning'")
        caller = await tx.fetch_one("SELECT granted_micro, settled_micro, held_micro FROM org_balances "
                                    "WHERE org_id = %(o)s", {"o": pair.caller.org["org_id"]})
        publisher = await tx.fetch_one("SELECT granted_micro, settled_micro FROM org_balances WHERE org_id = %(o)s",
                                       {"o": pair.publisher.org["org_id"]})
    return hold, earned, caller, publisher


async def _fault(pair, on: bool) -> None:
    async with pair.services.db.tx() as tx:
        await tx.execute(FAULT if on else "DROP TRIGGER treg_test_fault ON credit_grants")


async def _answered(pair) -> str:
    r = await pair.caller.client.get(f"/call/{pair.ref}/x", headers=pair.caller_member["headers"])
    await r.read()
    assert r.status == 200 and r.headers["X-Treg-Cost-Micro"] == str(PRICE)  # what the caller was told
    return r.headers["X-Treg-Call-Id"]


async def test_a_fault_at_the_close_moves_neither_org_then_both_together(aiohttp_client, make_app):
    async with hub_pair(aiohttp_client, make_app, price=PRICE) as pair:
        await _fault(pair, True)
        call_id = await _answered(pair)
        await asyncio.sleep(0.4)  # the settler's statement failed (and is retried)
        hold, earned, caller, publisher = await _state(pair, call_id)
        assert hold["state"] == "held" and earned == 0
        assert caller["settled_micro"] == 0 and caller["held_micro"] == PRICE and publisher["granted_micro"] == 0
        await _fault(pair, False)
        await pair.services.settler.drain()  # the retry lands: debit and credit in one statement
        hold, earned, caller, publisher = await _state(pair, call_id)
        assert hold["state"] == "settled" and hold["settled_micro"] == PRICE and earned == 1
        assert caller["settled_micro"] == PRICE and caller["held_micro"] == 0 and publisher["granted_micro"] == PRICE
        for org in (pair.caller.org, pair.publisher.org):
            await check_books(pair.services, org["org_id"])


async def test_a_close_that_never_lands_is_released_by_the_reaper_and_neither_org_moves(aiohttp_client, make_app):
    async with hub_pair(aiohttp_client, make_app, price=PRICE) as pair:
        svc = pair.services
        svc.settler.retry_for_s = 0.3  # the settler gives up quickly: the hold is the reaper's
        await _fault(pair, True)
        call_id = await _answered(pair)
        await svc.settler.drain()
        assert svc.settler.left_to_reaper == 1
        await _fault(pair, False)
        assert await reaper.reap_orphans(svc, older_than_s=0) == 1
        hold, earned, caller, publisher = await _state(pair, call_id)
        assert hold["state"] == "released" and earned == 0
        assert caller["settled_micro"] == 0 and caller["held_micro"] == 0 and publisher["granted_micro"] == 0
        assert (await money.balance(svc, pair.caller.org["org_id"])).balance_micro == 1_000_000
        for org in (pair.caller.org, pair.publisher.org):
            await check_books(svc, org["org_id"])


async def test_a_burst_with_failures_cuts_and_cancellations_keeps_both_books_exact(aiohttp_client, make_app):
    rng = random.Random(11)

    async def chaos(ex):
        kind = ex.target.rsplit("/", 1)[-1]
        await asyncio.sleep(rng.random() * 0.03)
        if kind.startswith("ok"):
            return http_response(200, b'{"fine": true}')
        if kind.startswith("fail"):
            return http_response(rng.choice([400, 401, 429, 500, 503]), b'{"error": "x"}')
        if kind.startswith("cut"):
            ex.writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789")
            await ex.writer.drain()
            return None
        await asyncio.sleep(1.0)  # slow: the caller gives up first
        return http_response(200, b"{}")

    async with hub_pair(aiohttp_client, make_app, chaos, price=PRICE, credits=40 * PRICE,
                        hub_max_runs_per_team=6) as pair:
        plan = [rng.choice(["ok", "ok", "ok", "fail", "cut", "slow"]) for _ in range(80)]

        seen: list[int] = []  # every attempt's status, a refused one's too

        async def one(i, kind):
            """A caller as a client of the contract acts: a 429 ``hub_busy`` is retried after a moment (at most
            three times), so the burst's calls keep arriving while its first ones finish and free their slots
            (all 80 arrive within the same instant: without the retries, whether any ``ok`` call finds a slot
            free depended on which six came first)."""
            path = f"/call/{pair.ref}/{kind}{i}"
            for attempt in range(4):
                try:
                    r = await asyncio.wait_for(pair.caller.client.get(path, headers=pair.caller_member["headers"]),
                                               0.3 if kind == "slow" else 30)
                    await r.read()
                except (asyncio.TimeoutError, Exception):
                    return None
                seen.append(r.status)
                if r.status != 429 or attempt == 3:
                    return r.status, int(r.headers.get("X-Treg-Cost-Micro", "0") or 0)
                await asyncio.sleep(0.05 + (i % 10) * 0.03)  # spread: not all retried at once again

        results = await asyncio.gather(*(one(i, k) for i, k in enumerate(plan)))
        svc = pair.services
        for _ in range(300):  # handlers whose callers left finish server-side (their answers, then their slots)
            await svc.hub.drain()
            async with svc.db.tx() as tx:
                open_holds = await tx.scalar("SELECT count(*) FROM holds WHERE state = 'held'")
                runs = await tx.scalar("SELECT count(*) FROM hub_runs")
            if open_holds == 0 and runs == 0:
                break
            await asyncio.sleep(0.05)
        assert (open_holds, runs) == (0, 0)
        async with svc.db.tx() as tx:
            settled = await tx.scalar("SELECT coalesce(sum(settled_micro), 0) FROM holds")
            earned = await tx.scalar("SELECT coalesce(sum(amount_micro), 0) FROM credit_grants WHERE kind = 'earning'")
        caller = await check_books(svc, pair.caller.org["org_id"])
        publisher = await check_books(svc, pair.publisher.org["org_id"])
        assert caller["settled"] == settled == earned == publisher["granted"] and settled % PRICE == 0
        told = sum(c for r in results if r is not None for _, c in [r])
        # every caller told it paid did (a caller that left may have paid for an answer it did not read)
        assert told <= settled and told == PRICE * sum(1 for r in results if r == (200, PRICE))
        statuses = set(seen)
        assert 200 in statuses and 429 in statuses and settled > 0
