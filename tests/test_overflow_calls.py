"""Overflow wired into real calls (contract § "Overflow to aggregators"): a fake vendor, fake Orthogonal
and fake Monid on 127.0.0.1 (treg/testing/vendors/overflow.py), every rule over real HTTP."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiohttp import web

from treg.settings import SecretStr
from treg.testing.vendors.overflow import (CREDITS, DIRECT_PRICE, MONID_KEY, MONID_PRICE, ORTH_KEY,
                                           ORTH_PRICE, PLATFORM_KEY, make_world, orth_ok, vendor_402)

pytestmark = pytest.mark.usefixtures("fake_dns")


@pytest.fixture
async def world(make_app, aiohttp_server, aiohttp_client):
    return await make_world(make_app, aiohttp_server, aiohttp_client)


def _keys_absent(text: str) -> None:
    for key in (ORTH_KEY, MONID_KEY, PLATFORM_KEY):
        assert key not in text


async def test_a_balance_answer_is_served_through_the_first_aggregator(world, caplog):
    caplog.set_level(logging.DEBUG)
    r, body = await world.call()
    call_id = r.headers["X-Treg-Call-Id"]
    assert r.status == 200 and body == b'{"via":"orthogonal"}'
    assert r.headers["X-Treg-Served-Via"] == "overflow:orthogonal"
    assert r.headers["X-Treg-Cost-Micro"] == "11000"  # the aggregator's price, not the route's 12000
    assert r.headers["Content-Type"].startswith("application/json")
    assert len(world.vendor.seen) == 1  # the direct attempt happened
    assert world.orth.seen == [{"method": "POST", "path": "/v1/run", "auth": f"Bearer {ORTH_KEY}",
                                "json": {"api": "acme", "path": "/items/a%2Fb", "query": {"fields": "all"}}}]
    assert world.monid.seen == []  # at most one aggregator per call

    holds = await world.holds()
    assert holds[call_id]["state"] == "released" and holds[call_id]["settled_micro"] == 0
    assert holds[call_id + ":overflow"]["state"] == "settled"
    assert holds[call_id + ":overflow"]["amount_micro"] == ORTH_PRICE
    assert holds[call_id + ":overflow"]["settled_micro"] == 11000
    bal = await world.balance()
    assert bal.balance_micro == bal.granted_micro - 11000 and bal.held_micro == 0

    rows = await world.rows()
    direct, child = rows[call_id], rows[call_id + ":overflow"]
    assert (direct["status"], direct["cost_micro"], direct["credential_tier"], direct["hold_state"]) == \
        (402, 0, "platform", "released")
    assert (child["status"], child["cost_micro"], child["credential_tier"], child["served_via"],
            child["parent_call_id"], child["hold_state"], child["outcome"]) == \
        (200, 11000, "platform-overflow", "overflow:orthogonal", call_id, "settled", "ok")
    # one product event, for the final answer
    assert [(e["call_id"], e["status"], e["cost_micro"]) for e in world.events.tool_called] == \
        [(call_id + ":overflow", 200, 11000)]

    got = await world.gw.api("GET", f"/api/v1/calls/{call_id}", expect=200)
    assert got["overflow"] == {"aggregator": "orthogonal", "status": 200, "cost_micro": 11000}
    assert got["status"] == 402 and got["cost_micro"] == 0
    assert await world.spend("orthogonal") == 11000
    _keys_absent(caplog.text)
    _keys_absent(repr(rows))


@pytest.mark.parametrize("reply", [
    (429, {"x-quota": "daily"}, {"error": "daily quota reached"}),        # quota
    (429, {"Retry-After": "30"}, {"error": "slow down"}),                 # a burst 429 smoothing did not absorb
])
async def test_quota_and_burst_429_overflow(world, reply):
    world.vendor.reply = reply
    r, body = await world.call()
    assert r.status == 200 and r.headers["X-Treg-Served-Via"] == "overflow:orthogonal"
    assert len(world.orth.seen) == 1


@pytest.mark.parametrize("reply", [
    (404, {}, {"error": "no such item"}),                   # caller-caused
    (400, {}, {"error": "bad fields"}),                     # caller-caused
    (401, {}, {"error": "account suspended"}),              # a 401, even when a signature calls it balance
    (500, {}, {"error": "boom"}),                           # not a capacity answer
    (429, {"Retry-After": "120"}, {"error": "slow"}),       # no row claims it (the generic burst row: <= 60 s)
])
async def test_answers_that_never_overflow(world, reply):
    world.vendor.reply = reply
    r, body = await world.call()
    assert r.status == reply[0] and "X-Treg-Served-Via" not in r.headers
    assert world.orth.seen == [] and world.monid.seen == []
    assert r.headers["X-Treg-Cost-Micro"] == "0"


async def test_a_timeout_never_overflows(make_app, aiohttp_server, aiohttp_client):
    w = await make_world(make_app, aiohttp_server, aiohttp_client, upstream_read_timeout_s=0.3)

    async def slow(request, n):
        await asyncio.sleep(2)
        return web.json_response({"error": "insufficient credits"}, status=402)

    w.vendor.reply = slow
    r, _ = await w.call()
    assert r.status == 502 and (await r.json())["error"] == "upstream_timeout" and w.orth.seen == []
    assert all(h["state"] == "released" for h in (await w.holds()).values())


async def test_the_team_tier_never_overflows(world):
    await world.gw.secret("team-acme-key", name="acme", provider="acme")
    r, _ = await world.call()
    assert r.status == 402 and r.headers["X-Treg-Credential-Tier"] == "team" and world.orth.seen == []


async def test_an_org_that_opted_out_never_overflows(world):
    got = await world.gw.api("PATCH", "/api/v1/org", json={"platform_overflow": False}, expect=200)
    assert got["platform_overflow"] is False
    r, body = await world.call()
    assert r.status == 402 and b"insufficient credits" in body and world.orth.seen == []
    listed = await world.gw.api("GET", "/api/v1/catalog/endpoints?provider=acme", expect=200)
    row = next(e for e in listed["endpoints"] if e["id"] == "acme.items.get")
    assert row["overflow_aggregator"] is None and row["overflow_price_micro"] is None


async def test_mode_off_never_overflows(make_app, aiohttp_server, aiohttp_client):
    w = await make_world(make_app, aiohttp_server, aiohttp_client, overflow_mode="off")
    r, _ = await w.call()
    assert r.status == 402 and w.orth.seen == [] and "X-Treg-Served-Via" not in r.headers


async def test_a_post_body_is_wrapped_for_the_aggregator(world):
    world.orth.reply = orth_ok("0.004", {"created": True})
    r, body = await world.call("", endpoint="acme.items.create", method="POST", json={"name": "widget"})
    assert r.status == 200 and body == b'{"created":true}' and r.headers["X-Treg-Cost-Micro"] == "4000"
    assert world.vendor.seen[0]["json"] == {"name": "widget"}  # the direct attempt got the body too
    assert world.orth.seen[0]["json"] == {"api": "acme", "path": "/items", "body": {"name": "widget"}}


# -- an aggregator failure is data ------------------------------------------------------------------
@pytest.mark.parametrize("reply,mark", [
    ((401, {}, {"success": False, "error": "bad key", "code": "UNAUTHORIZED"}), "overflow:orthogonal"),
    ((402, {}, {"success": False, "error": "top up", "code": "INSUFFICIENT_CREDITS"}), "overflow:orthogonal"),
    ((429, {}, {"success": False, "error": "slow", "code": "RATE_LIMITED"}), "overflow:orthogonal"),
    ((500, {"Content-Type": "text/html"}, "<html>oops</html>"), "overflow:orthogonal"),
    ((502, {}, {"success": False, "error": "vendor said no", "code": "UPSTREAM_ERROR", "upstreamStatus": 402,
                "data": {"error": "insufficient credits"}}), "overflow:orthogonal:acme"),
])
async def test_an_aggregator_failure_marks_it_and_answers_503(world, reply, mark):
    world.orth.reply = reply
    r, body = await world.call()
    call_id = r.headers["X-Treg-Call-Id"]
    assert r.status == 503 and r.headers["X-Treg-Error"] == "1"
    err = await r.json()
    assert err["error"] == "provider_capacity" and err["blame"] == "treg" and err["provider"] == "acme"
    assert [a["id"] for a in err["alternatives"]] == ["acme.items.other"]
    assert "overflow_refused" not in err
    assert r.headers["X-Treg-Cost-Micro"] == "0"
    assert await world.marks() == {mark}
    assert world.monid.seen == []  # never a second aggregator on the same call
    holds = await world.holds()
    assert {k: v["state"] for k, v in holds.items()} == {call_id: "released", call_id + ":overflow": "released"}
    rows = await world.rows()
    assert rows[call_id]["status"] == 402
    assert (rows[call_id + ":overflow"]["status"], rows[call_id + ":overflow"]["error_code"]) == \
        (503, "provider_capacity")
    assert [e["call_id"] for e in world.events.tool_called] == [call_id + ":overflow"]
    bal = await world.balance()
    assert bal.balance_micro == bal.granted_micro

    # the next call skips what is marked: the whole aggregator, or only this vendor through it
    world.orth.seen.clear()
    r2, body2 = await world.call()
    assert r2.status == 200 and r2.headers["X-Treg-Served-Via"] == "overflow:monid" and world.orth.seen == []
    assert r2.headers["X-Treg-Cost-Micro"] == str(MONID_PRICE)


async def test_an_aggregator_refusal_leaves_the_direct_answer(world):
    world.orth.reply = (422, {}, {"success": False, "error": "field 'fields' is not allowed", "code": "INVALID"})
    r, body = await world.call()
    call_id = r.headers["X-Treg-Call-Id"]
    assert r.status == 402 and b"insufficient credits" in body and "X-Treg-Served-Via" not in r.headers
    assert r.headers["X-Treg-Cost-Micro"] == "0"
    assert await world.marks() == set()
    holds = await world.holds()
    assert {k: v["state"] for k, v in holds.items()} == {call_id: "released", call_id + ":overflow": "released"}
    rows = await world.rows()
    assert rows[call_id]["status"] == 402 and rows[call_id]["outcome"] == "upstream_error"
    assert rows[call_id + ":overflow"]["refused_by"] == "overflow"
    assert [e["call_id"] for e in world.events.tool_called] == [call_id]  # the direct answer is the final one


async def test_monid_is_polled_when_orthogonal_has_no_key(make_app, aiohttp_server, aiohttp_client):
    w = await make_world(make_app, aiohttp_server, aiohttp_client, overflow_keys={"MONID": SecretStr(MONID_KEY)})
    r, body = await w.call()
    assert r.status == 200 and body == b'{"via":"monid"}' and r.headers["X-Treg-Served-Via"] == "overflow:monid"
    assert r.headers["X-Treg-Cost-Micro"] == str(MONID_PRICE)
    assert w.orth.seen == []
    assert [(s["method"], s["path"]) for s in w.monid.seen] == [("POST", "/v1/run"), ("GET", "/v1/runs/run-7"),
                                                                ("GET", "/v1/runs/run-7")]
    assert w.monid.seen[0]["json"] == {"provider": "acme", "endpoint": "items-get", "input": {
        "body": None, "queryParams": {"fields": "all"}, "pathParams": {"item_id": "a/b"}}}
    assert w.monid.seen[0]["auth"] == f"Bearer {MONID_KEY}"


async def test_an_aggregator_over_its_daily_budget_is_skipped(make_app, aiohttp_server, aiohttp_client):
    w = await make_world(make_app, aiohttp_server, aiohttp_client,
                         overflow_budgets={"ORTHOGONAL": ORTH_PRICE - 1, "MONID": MONID_PRICE - 1})
    r, body = await w.call()
    assert r.status == 402 and w.orth.seen == [] and w.monid.seen == []  # no usable route: the direct answer


async def test_an_empty_balance_is_the_normal_402(make_app, aiohttp_server, aiohttp_client):
    # enough for the direct hold, not for the overflow hold
    w = await make_world(make_app, aiohttp_server, aiohttp_client, credits=0, trial_micro=DIRECT_PRICE)
    r, body = await w.call()
    call_id = r.headers["X-Treg-Call-Id"]
    err = await r.json()
    assert r.status == 402 and err["error"] == "insufficient_balance" and w.orth.seen == []
    holds = await w.holds()
    assert holds[call_id]["state"] == "released" and call_id + ":overflow" not in holds
    rows = await w.rows()
    assert rows[call_id]["status"] == 402 and rows[call_id + ":overflow"]["error_code"] == "insufficient_balance"


async def test_an_idempotent_retry_replays_the_overflow_answer(world):
    r1, b1 = await world.call(headers={"Idempotency-Key": "k-1"})
    r2, b2 = await world.call(headers={"Idempotency-Key": "k-1"})
    assert (r1.status, b1) == (r2.status, b2) == (200, b'{"via":"orthogonal"}')
    assert r2.headers["X-Treg-Idempotent-Replay"] == "true" and r2.headers["X-Treg-Cost-Micro"] == "0"
    assert len(world.orth.seen) == 1 and len(world.vendor.seen) == 1
    bal = await world.balance()
    assert bal.balance_micro == bal.granted_micro - 11000


# -- a locked key: the direct attempt is skipped ----------------------------------------------------
async def test_a_locked_keys_probe_still_goes_to_the_vendor_and_then_overflows(world):
    """The breaker's probe and overflow together: the lock's first call in this process is its probe
    (the vendor is asked: only a 2xx clears the lock); still out, so that caller is served through the
    aggregator. The next call skips the direct attempt."""
    await world.lock(probe_spent=False)
    r, body = await world.call()
    assert r.status == 200 and r.headers["X-Treg-Capacity-Probe"] == "1"
    assert r.headers["X-Treg-Served-Via"] == "overflow:orthogonal" and len(world.vendor.seen) == 1
    r, body = await world.call()
    assert r.status == 200 and "X-Treg-Capacity-Probe" not in r.headers
    assert r.headers["X-Treg-Served-Via"] == "overflow:orthogonal" and len(world.vendor.seen) == 1


async def test_a_locked_key_skips_the_direct_attempt(world):
    await world.lock()
    r, body = await world.call()
    call_id = r.headers["X-Treg-Call-Id"]
    assert r.status == 200 and r.headers["X-Treg-Served-Via"] == "overflow:orthogonal"
    assert world.vendor.seen == []  # no vendor call
    holds = await world.holds()
    assert call_id not in holds and holds[call_id + ":overflow"]["state"] == "settled"  # no direct hold
    rows = await world.rows()
    assert (rows[call_id]["refused_by"], rows[call_id]["cost_micro"], rows[call_id]["hold_state"]) == \
        ("capacity", 0, None)
    assert rows[call_id + ":overflow"]["credential_tier"] == "platform-overflow"
    got = await world.gw.api("GET", f"/api/v1/calls/{call_id}", expect=200)
    assert got["overflow"] == {"aggregator": "orthogonal", "status": 200, "cost_micro": 11000}


async def test_a_locked_key_and_a_refusing_aggregator(world):
    await world.lock()
    world.orth.reply = (400, {}, {"success": False, "error": "api acme is not enabled", "code": "BAD_REQUEST"})
    r, _ = await world.call()
    err = await r.json()
    assert r.status == 503 and err["error"] == "provider_capacity"
    assert err["overflow_refused"] == "api acme is not enabled"
    assert world.vendor.seen == [] and await world.marks() == set()
    assert all(h["state"] == "released" for h in (await world.holds()).values())


async def test_a_locked_key_without_overflow_is_503_with_alternatives(world):
    await world.gw.api("PATCH", "/api/v1/org", json={"platform_overflow": False}, expect=200)
    # a quota lock covers its endpoint only: the sibling stays an alternative (a balance lock covers the
    # whole provider, and an alternative the same lock would refuse is left out)
    await world.lock("quota")
    r, _ = await world.call()
    err = await r.json()
    assert r.status == 503 and err["error"] == "provider_capacity" and err["kind"] == "quota"
    assert [a["id"] for a in err["alternatives"]] == ["acme.items.other"]
    assert world.vendor.seen == [] and world.orth.seen == [] and await world.holds() == {}


# -- shadow mode ------------------------------------------------------------------------------------
async def test_shadow_mode_calls_the_aggregator_and_relays_the_vendor(make_app, aiohttp_server, aiohttp_client,
                                                                      caplog):
    caplog.set_level(logging.INFO)
    w = await make_world(make_app, aiohttp_server, aiohttp_client, overflow_mode="shadow")
    r, body = await w.call()
    call_id = r.headers["X-Treg-Call-Id"]
    assert r.status == 402 and b"insufficient credits" in body and "X-Treg-Served-Via" not in r.headers
    assert r.headers["X-Treg-Cost-Micro"] == "0"
    assert len(w.orth.seen) == 1  # called where `on` would call it
    assert await w.spend("orthogonal") == 11000  # treg pays: it counts against the budget
    assert set(await w.holds()) == {call_id}  # no overflow hold: the caller is charged nothing
    bal = await w.balance()
    assert bal.balance_micro == bal.granted_micro
    assert "overflow shadow" in caplog.text and "would serve" in caplog.text
    _keys_absent(caplog.text)
    # shadow never skips the direct attempt: a locked key answers as without overflow
    await w.lock()
    w.vendor.seen.clear()
    r2, _ = await w.call()
    assert r2.status == 503 and w.vendor.seen == [] and len(w.orth.seen) == 2


# -- org opt-out, catalog listing, metrics ----------------------------------------------------------
async def test_org_overflow_setting_is_owner_only(world):
    gw = world.gw
    assert (await gw.api("GET", "/api/v1/org", expect=200))["platform_overflow"] is True
    admin = await gw.member("admin@acme.test", role="admin")
    member = await gw.member("m@acme.test")
    assert (await gw.api("GET", "/api/v1/org", as_=member["headers"], expect=200))["platform_overflow"] is True
    for who in (admin, member):
        err = await gw.api("PATCH", "/api/v1/org", as_=who["headers"], json={"platform_overflow": False}, expect=403)
        assert err["error"] == "forbidden_role"
    assert (await gw.api("PATCH", "/api/v1/org", json={"platform_overflow": "no"}, expect=400))["error"] == \
        "invalid_value"
    assert (await gw.api("PATCH", "/api/v1/org", json={"slug": "x"}, expect=400))["error"] == "invalid_field"
    assert (await gw.api("PATCH", "/api/v1/org", json={"platform_overflow": False}, expect=200))[
        "platform_overflow"] is False
    assert (await gw.api("GET", "/api/v1/org", expect=200))["platform_overflow"] is False


async def test_catalog_listing_shows_the_first_usable_route(world):
    async def shown():
        listed = await world.gw.api("GET", "/api/v1/catalog/endpoints?provider=acme", expect=200)
        row = next(e for e in listed["endpoints"] if e["id"] == "acme.items.get")
        one = await world.gw.api("GET", "/api/v1/catalog/endpoints/acme.items.get", expect=200)
        assert (one["overflow_aggregator"], one["overflow_price_micro"]) == \
            (row["overflow_aggregator"], row["overflow_price_micro"])
        return row["overflow_aggregator"], row["overflow_price_micro"]

    assert await shown() == ("orthogonal", ORTH_PRICE)
    from treg.overflow.store import OverflowStore

    await OverflowStore(world.svc.db, world.svc.settings).mark_unhealthy("overflow:orthogonal:acme", "test")
    assert await shown() == ("monid", MONID_PRICE)
    await OverflowStore(world.svc.db, world.svc.settings).record_spend("monid", 10_000_000)
    assert await shown() == (None, None)


async def test_mode_off_listing_shows_no_route(make_app, aiohttp_server, aiohttp_client):
    w = await make_world(make_app, aiohttp_server, aiohttp_client, overflow_mode="off")
    listed = await w.gw.api("GET", "/api/v1/catalog/endpoints?provider=acme", expect=200)
    row = next(e for e in listed["endpoints"] if e["id"] == "acme.items.get")
    assert row["overflow_aggregator"] is None


async def test_metric_counts_real_outcomes(world):
    await world.call()
    world.orth.reply = (422, {}, {"success": False, "error": "no", "code": "INVALID"})
    await world.call()
    r = await world.gw.client.get("/metrics")
    text = await r.text()
    assert 'treg_overflow_total{aggregator="orthogonal",result="served"} 1.0' in text
    assert 'treg_overflow_total{aggregator="orthogonal",result="refused"} 1.0' in text


async def test_an_mcp_catalog_call_discloses_the_overflow(world):
    from treg.testing import Mcp

    out = await Mcp(world.gw).call("catalog_call", {"endpoint": "acme.items.get", "params": {"item_id": "7"}})
    sc = out["structuredContent"]
    assert out["isError"] is False and sc["body"] == {"via": "orthogonal"}
    assert sc["served_via"] == "overflow:orthogonal" and sc["cost_micro"] == 11000
    assert world.orth.seen[0]["json"]["path"] == "/items/7"


async def test_an_aggregator_echoing_its_key_never_hands_it_to_the_caller(world):
    """The aggregator's key is treg's account there: a vendor answer (or an aggregator) echoing it has it
    masked in what the caller gets, as treg's own vendor key is (treg/call/answer_mask.py)."""
    world.orth.reply = orth_ok("0.011", {"echo": f"Bearer {ORTH_KEY}", "raw": ORTH_KEY})
    r, body = await world.call()
    assert r.status == 200 and r.headers["X-Treg-Served-Via"] == "overflow:orthogonal"
    assert ORTH_KEY not in body.decode() and b"[REDACTED]" in body
    _keys_absent(repr(dict(r.headers)))
