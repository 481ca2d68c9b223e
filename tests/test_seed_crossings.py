"""Where issue 24's parts meet: a hub call and the member's call cap, a table token and a demo token at a hub
ref (docs/sharing.md). Each part has its own suite; these are the seams between them, over real sockets."""

from __future__ import annotations

from treg import money, public_demo
from treg.testing.vendors.hub import echo_answer, hub_pair

PRICE = 700


async def _balances(pair):
    svc = pair.services
    return ((await money.balance(svc, pair.caller.org["org_id"])).balance_micro,
            (await money.balance(svc, pair.publisher.org["org_id"])).balance_micro)


async def test_a_hub_call_counts_against_the_callers_call_cap_and_a_refused_one_costs_nothing(aiohttp_client,
                                                                                            make_app):
    async with hub_pair(aiohttp_client, make_app, echo_answer(200), price=PRICE) as pair:
        member = pair.caller_member
        await pair.caller.api("PUT", f"/api/v1/members/{member['member_id']}/limits", json={"calls_per_day": 1},
                              expect=200)
        before = await _balances(pair)
        first = await pair.call("GET", "/items")
        assert first.status == 200, await first.text()
        second = await pair.call("GET", "/items")
        body = await second.json()
        assert second.status == 429 and body["error"] == "member_call_cap" and body["resets_at"], body
        caller, publisher = await _balances(pair)
        # exactly one call moved money: the caller paid the price once, the publisher got it once
        assert (before[0] - caller, publisher - before[1]) == (PRICE, PRICE)
        assert len(pair.upstream.exchanges) == 1  # the refused call never reached the publisher's upstream


async def test_a_table_token_never_calls_a_hub_ref(aiohttp_client, make_app):
    async with hub_pair(aiohttp_client, make_app, echo_answer(200), price=PRICE) as pair:
        minted = await pair.caller.api("POST", "/api/v1/tokens", json={"scope": "table"},
                                       as_=pair.caller_member["headers"], expect=201)
        before = await _balances(pair)
        r = await pair.call("GET", "/items", as_={"X-Treg-Token": minted["token"]})
        body = await r.json()
        assert r.status == 403 and body["error"] == "token_scope", body
        assert await _balances(pair) == before and pair.upstream.exchanges == []


async def test_a_demo_token_never_calls_a_hub_ref(aiohttp_client, make_app):
    async with hub_pair(aiohttp_client, make_app, echo_answer(200), price=PRICE) as pair:
        svc = pair.services
        await public_demo.set_enabled(svc, "callr", True)
        token = (await public_demo.issue_token(svc, "callr"))["token"]
        before = await _balances(pair)
        r = await pair.call("GET", "/items", as_={"X-Treg-Token": token})
        body = await r.json()
        assert r.status == 403 and body["error"] == "demo_not_allowed", body
        assert r.headers["X-Treg-Demo"] == "1"
        assert await _balances(pair) == before and pair.upstream.exchanges == []
