"""Member call caps (sharing.md "Member caps cover unbilled calls", docs/money.md "Call caps"): the limits
route, the 429 over real HTTP on every kind of call, refusals not counted, the UTC day's reset, and a
member without a cap costing a call no query.

Exactness across two real ``treg serve`` processes is tests/test_member_call_caps_processes.py."""

from __future__ import annotations

import datetime
import re

import pytest

from treg import membership
from treg.keys import SERVICES
from treg.testing import Gateway, example_provider, http_response, login, open_org, raw_upstream, run_sql, vendor_gateway


def _next_midnight() -> str:
    today = datetime.datetime.now(datetime.timezone.utc).date()
    return (datetime.datetime.combine(today + datetime.timedelta(days=1), datetime.time(),
                                      tzinfo=datetime.timezone.utc).isoformat().replace("+00:00", "Z"))


async def _cap(gw, member_id: str, n, *, as_=None, expect: int = 200):
    return await gw.api("PUT", f"/api/v1/members/{member_id}/limits", json={"calls_per_day": n}, as_=as_,
                        expect=expect)


async def test_limits_route_owner_admin_and_refusals(gateway):
    gw = gateway
    admin = await gw.member("admin@acme.test", role="admin")
    bob = await gw.member("bob@acme.test")
    out = await _cap(gw, bob["member_id"], 3)
    assert out == {"member_id": bob["member_id"], "calls_per_day": 3, "calls_today": 0,
                   "resets_at": out["resets_at"], "daily_cap_micro": None}
    assert out["resets_at"] == _next_midnight()
    # an admin may cap a member, not an owner; a member may cap nobody, but reads their own limits
    assert (await _cap(gw, bob["member_id"], 5, as_=admin["headers"]))["calls_per_day"] == 5
    body = await _cap(gw, gw.org["member_id"], 1, as_=admin["headers"], expect=403)
    assert body["error"] == "forbidden_role"
    assert (await _cap(gw, admin["member_id"], 1, as_=bob["headers"], expect=403))["error"] == "forbidden_role"
    mine = await gw.api("GET", f"/api/v1/members/{bob['member_id']}/limits", as_=bob["headers"], expect=200)
    assert mine["calls_per_day"] == 5
    await gw.api("GET", f"/api/v1/members/{admin['member_id']}/limits", as_=bob["headers"], expect=403)
    # bad input: the error body, never a 500
    for bad in (-1, 1.5, True, "3", 10 ** 10):
        assert (await _cap(gw, bob["member_id"], bad, expect=400))["error"] == "invalid_limit"
    r = await gw.api("PUT", f"/api/v1/members/{bob['member_id']}/limits", json={}, expect=400)
    assert r["error"] == "invalid_limit"
    r = await gw.api("PUT", f"/api/v1/members/{bob['member_id']}/limits", json={"calls_per_day": 1, "x": 1},
                     expect=400)
    assert r["error"] == "invalid_field"
    assert (await _cap(gw, "mem_nobody", 1, expect=404))["error"] == "member_not_found"
    # null clears it; the members list shows the cap
    assert (await _cap(gw, bob["member_id"], None))["calls_per_day"] is None
    await _cap(gw, admin["member_id"], 7)
    listed = {m["member_id"]: m["calls_per_day"] for m in (await gw.api("GET", "/api/v1/members"))["members"]}
    assert listed == {gw.org["member_id"]: None, admin["member_id"]: 7, bob["member_id"]: None}


async def test_another_orgs_member_is_not_found(gateway):
    gw = gateway
    other = await open_org(gw.client, "other", "o@other.test")
    body = await _cap(gw, other.org["member_id"], 1, expect=404)
    assert body["error"] == "member_not_found"
    await gw.api("GET", f"/api/v1/members/{other.org['member_id']}/limits", expect=404)


async def test_cap_counts_own_tool_calls_and_refuses_with_resets_at(gateway, up, tool, dsn):
    gw = gateway
    bob = await gw.member("bob@acme.test")
    await _cap(gw, bob["member_id"], 2)
    for _ in range(2):
        r = await gw.call("GET", "/call/up/x", as_=bob["headers"])
        assert r.status == 200
    sent = len(up.exchanges)
    r = await gw.call("GET", "/call/up/x", as_=bob["headers"])
    body = await r.json()
    assert r.status == 429 and r.headers["X-Treg-Error"] == "1"
    assert body["error"] == "member_call_cap" and body["blame"] == "caller"
    assert body["limit"] == 2 and body["used"] == 2 and body["resets_at"] == _next_midnight()
    assert 0 < int(r.headers["Retry-After"]) <= 86_401
    assert len(up.exchanges) == sent  # refused before the upstream heard anything
    # the owner (no cap) is untouched; the refusal is audited with refused_by
    assert (await gw.call("GET", "/call/up/x")).status == 200
    rows = await gw.wait_calls(4)
    refused = [c for c in rows if c["outcome"] == "refused"]
    assert [c["refused_by"] for c in refused] == ["member_cap"]
    # refused calls do not count: still 2
    limits = await gw.api("GET", f"/api/v1/members/{bob['member_id']}/limits", expect=200)
    assert limits["calls_today"] == 2
    # the next UTC day resets it (the day moved in the database, not by sleeping)
    run_sql(dsn, "UPDATE member_calls SET day = day - 1 WHERE member_id = %s", bob["member_id"])
    assert (await gw.call("GET", "/call/up/x", as_=bob["headers"])).status == 200
    counts = run_sql(dsn, "SELECT calls FROM member_calls WHERE member_id = %s ORDER BY day", bob["member_id"])
    assert counts == [(2,), (1,)]


async def test_a_cap_of_zero_refuses_every_call_and_a_change_takes_effect_at_once(gateway, up, tool):
    gw = gateway
    bob = await gw.member("bob@acme.test")
    assert (await gw.call("GET", "/call/up/x", as_=bob["headers"])).status == 200  # cached identity, no cap
    await _cap(gw, bob["member_id"], 0)
    r = await gw.call("GET", "/call/up/x", as_=bob["headers"])
    assert r.status == 429 and (await r.json())["used"] == 0
    await _cap(gw, bob["member_id"], None)
    assert (await gw.call("GET", "/call/up/x", as_=bob["headers"])).status == 200


async def test_refused_calls_give_their_count_back(gateway, up, tool):
    gw = gateway
    bob = await gw.member("bob@acme.test")
    await _cap(gw, bob["member_id"], 1)
    # refused before the cap (ACL: an unknown tool) and after it (a deny rule is before; a 402 after)
    r = await gw.call("GET", "/call/nope/x", as_=bob["headers"])
    assert r.status == 404
    await gw.api("POST", "/api/v1/deny-rules", json={"host": up.url.split("//")[1], "path": "/v1/blocked"},
                 expect=201)
    r = await gw.call("GET", "/call/up/blocked", as_=bob["headers"])
    assert r.status == 403
    limits = await gw.api("GET", f"/api/v1/members/{bob['member_id']}/limits", expect=200)
    assert limits["calls_today"] == 0
    assert (await gw.call("GET", "/call/up/x", as_=bob["headers"])).status == 200
    assert (await gw.call("GET", "/call/up/x", as_=bob["headers"])).status == 429


@pytest.fixture
async def acme(aiohttp_client, make_app):
    """(gateway, upstream): the acme catalog on a raw upstream, a platform key, little credit."""
    async with raw_upstream(lambda ex: http_response(200, b'{"ok": true}', [("Content-Type", "application/json")])) \
            as up, vendor_gateway(aiohttp_client, make_app, [example_provider(up.url + "/v1")],
                                  platform={"TREG_PLATFORM_KEY_ACME": "pk"}, credits=2000,
                                  anonymous_providers=("acme",)) as gw:
        yield gw, up


async def test_every_tier_counts_and_a_402_gives_back(acme):
    gw, up = acme
    bob = await gw.member("bob@v.test")
    await _cap(gw, bob["member_id"], 3)
    # platform (billed, 2000 of the 2000 credits), anonymous (free): both count
    r = await gw.call("GET", "/catalog/call/acme.items.get?item_id=1", as_=bob["headers"])
    assert r.status == 200 and r.headers["X-Treg-Credential-Tier"] == "platform"
    r = await gw.call("GET", "/catalog/call/acme.status", as_=bob["headers"])
    assert r.status == 200 and r.headers["X-Treg-Credential-Tier"] == "anonymous"
    # the balance is spent: refused with a 402 after the cap counted it, which gives the count back
    r = await gw.call("GET", "/catalog/call/acme.items.get?item_id=1", as_=bob["headers"])
    assert r.status == 402
    limits = await gw.api("GET", f"/api/v1/members/{bob['member_id']}/limits", expect=200)
    assert limits["calls_today"] == 2
    # team tier (free, the team's key): counts too, and is the third and last
    await gw.secret("team-key", provider="acme")
    r = await gw.call("GET", "/catalog/call/acme.items.get?item_id=1", as_=bob["headers"])
    assert r.status == 200 and r.headers["X-Treg-Credential-Tier"] == "team"
    r = await gw.call("GET", "/catalog/call/acme.items.get?item_id=1", as_=bob["headers"])
    assert r.status == 429 and (await r.json())["error"] == "member_call_cap"


async def test_no_cap_costs_a_call_no_round_trip(aiohttp_client, make_app, up):
    # no audit batch in the middle of a count (the writer flushes on demand only)
    client = await aiohttp_client(make_app(ssrf_allow=("127.0.0.0/8",), audit_flush_ms=600_000))
    gw = Gateway(client, await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test"))
    await gw.tool("up", up.url + "/v1")
    svc = gw.services
    bob = await gw.member("bob@acme.test")
    carol = await gw.member("carol@acme.test")
    await _cap(gw, carol["member_id"], 100)
    for who in (bob, carol):  # warm the caches: identity, tools, deny rules
        assert (await gw.call("GET", "/call/up/x", as_=who["headers"])).status == 200

    async def trips(who) -> tuple[int, int]:
        before, caps = svc.db.round_trips, svc.db.round_trips_of.get("call_caps", 0)
        r = await gw.client.get("/call/up/x", headers=who["headers"])
        assert r.status == 200
        await r.read()
        return svc.db.round_trips - before, svc.db.round_trips_of.get("call_caps", 0) - caps

    uncapped = await trips(bob)
    capped = await trips(carol)
    await client.close()
    assert uncapped == (0, 0)  # a warm own-tool call without a cap: no query at all
    assert capped == (1, 1)  # with one: the one counting statement


async def test_members_page_sets_and_clears_a_cap(gateway, up, tool):
    gw = gateway
    bob = await gw.member("bob@acme.test")
    csrf = await login(gw.client, gw.org["token"])
    page = await (await gw.client.get("/ui/members")).text()
    assert f'action="/ui/members/{bob["member_id"]}/limits"' in page
    resp = await gw.client.post(f"/ui/members/{bob['member_id']}/limits", data={"calls_per_day": "1", "csrf": csrf},
                                allow_redirects=False)
    assert resp.status == 303
    page = await (await gw.client.get(resp.headers["Location"])).text()
    assert re.search(rf'id="cap-{bob["member_id"]}"[^>]*value="1"', page) and "Call cap set to 1 a day." in page
    assert (await gw.call("GET", "/call/up/x", as_=bob["headers"])).status == 200
    assert (await gw.call("GET", "/call/up/x", as_=bob["headers"])).status == 429
    # a bad value is shown beside the member's field, the cap unchanged; without the CSRF token, refused
    for bad in ("-1", "1.5", "ten", "99999999999", "9" * 5000):  # (more digits than Python converts: not a 500)
        resp = await gw.client.post(f"/ui/members/{bob['member_id']}/limits",
                                    data={"calls_per_day": bad, "csrf": csrf})
        assert resp.status == 400, bad
        assert f'id="calls_per_day-{bob["member_id"]}-error"' in await resp.text()
    resp = await gw.client.post(f"/ui/members/{bob['member_id']}/limits", data={"calls_per_day": ""})
    assert resp.status == 403
    assert (await gw.api("GET", f"/api/v1/members/{bob['member_id']}/limits"))["calls_per_day"] == 1
    # blank clears it
    resp = await gw.client.post(f"/ui/members/{bob['member_id']}/limits", data={"calls_per_day": "", "csrf": csrf},
                                allow_redirects=False)
    assert resp.status == 303
    assert (await gw.api("GET", f"/api/v1/members/{bob['member_id']}/limits"))["calls_per_day"] is None
    assert (await gw.call("GET", "/call/up/x", as_=bob["headers"])).status == 200
