"""The public demo gate over real HTTP (docs/sharing.md "The public demo"): a demo token reaches only the
demo's endpoints (GET, on treg's key or keyless), never a management route, the dashboard or MCP, from any
address; its hourly limit per client address (the peer, or what a trusted proxy's X-Forwarded-For says, read from the right);
its daily budget counted when the hold is placed; ``X-Treg-Demo: 1`` on every answer; refused before any
hold or vendor contact."""

from __future__ import annotations

import json

import pytest

from treg import money, public_demo
from treg.testing import audit_row, check_books, post_login, vendor_gateway
from treg.testing.vendors.tables import PLATFORM, PLATFORM_KEY, PRICE, crm_provider, vendor_upstream
from treg.web import openapi

DEMO = ("crm.contacts", "crm.status", "crm.dear", "crm.create", "crm.people", "treg.nothing")


@pytest.fixture
def demo_settings():
    return {"demo_endpoints": DEMO, "demo_calls_per_hour": 50, "demo_daily_budget_micro": 1_000_000}


@pytest.fixture
async def demo(aiohttp_client, make_app, demo_settings):
    """(gateway, upstream, demo token headers): org ``v`` runs the demo, ``crm`` on treg's key."""
    vendor, up = vendor_upstream()
    async with up, vendor_gateway(aiohttp_client, make_app, [crm_provider(up.url + "/v1")], platform=PLATFORM,
                                  anonymous_providers=("crm",), credits=5_000_000, **demo_settings) as gw:
        await public_demo.set_enabled(gw.services, "v", True)
        token = (await public_demo.issue_token(gw.services, "v"))["token"]
        yield gw, up, {"X-Treg-Token": token}


async def spent_today(gw) -> int:
    bal = await money.balance(gw.services, gw.org["org_id"])
    return bal.spent_today_micro + bal.held_today_micro


async def test_a_demo_call_is_marked_audited_and_runs_on_treg_key_only(demo):
    gw, up, visitor = demo
    await gw.secret("team-key-of-the-org", name="crm key", provider="crm")  # the org's own key: never the demo's
    r = await gw.call("GET", "/catalog/call/crm.contacts", as_=visitor)
    assert r.status == 200 and r.headers.getall("X-Treg-Demo") == ["1"]
    assert r.headers["X-Treg-Credential-Tier"] == "platform" and r.headers["X-Treg-Cost-Micro"] == str(PRICE)
    assert up.last.header("Authorization") == f"Bearer {PLATFORM_KEY}"
    row = await audit_row(gw, r.headers["X-Treg-Call-Id"])
    assert row["demo"] is True and row["surface"] == "catalog"
    # the owner's own call of the same endpoint uses the team key, and is not a demo call
    r = await gw.call("GET", "/catalog/call/crm.contacts")
    assert "X-Treg-Demo" not in r.headers and up.last.header("Authorization") == "Bearer team-key-of-the-org"
    assert (await audit_row(gw, r.headers["X-Treg-Call-Id"]))["demo"] is False
    # the other call surfaces: /call/<id> and /table/<id>; the keyless tier too
    for path in ("/call/crm.contacts", "/table/crm.contacts?format=csv", "/table/crm.status"):
        r = await gw.call("GET", path, as_=visitor)
        assert r.status == 200 and r.headers.getall("X-Treg-Demo") == ["1"], path
    assert r.headers["X-Treg-Credential-Tier"] == "anonymous"
    assert (await audit_row(gw, r.headers["X-Treg-Call-Id"]))["surface"] == "table"


async def test_anything_but_a_listed_get_is_refused_before_any_vendor_contact(demo):
    gw, up, visitor = demo
    await gw.tool("crm-tool", up.url + "/v1")  # an org tool: a demo token never reaches it
    before = await spent_today(gw)
    refused = [("GET", "/catalog/call/crm.bulk"),  # not listed
               ("GET", "/catalog/call/crm.nope"),  # not even an endpoint
               ("POST", "/catalog/call/crm.create"),  # listed, not a GET
               ("HEAD", "/catalog/call/crm.contacts"),
               ("GET", "/call/crm-tool/contacts"),  # an org tool
               ("GET", f"/call/{up.url}/v1/contacts"),  # a passthrough URL
               ("GET", "/call/crm.contacts/extra"),  # a path behind the id
               ("GET", "/redirect/abc")]
    for method, path in refused:
        r = await gw.call(method, path, as_=visitor)
        assert r.status == 403, (method, path, r.status)
        assert r.headers.getall("X-Treg-Demo") == ["1"] and r.headers["X-Treg-Error"] == "1"
        if method != "HEAD":
            assert (await r.json())["error"] == "demo_not_allowed", (method, path)
    assert up.exchanges == [] and await spent_today(gw) == before


async def test_listed_endpoint_the_demo_cannot_run_keyless_or_on_treg_key(demo):
    gw, up, visitor = demo
    # crm.people is listed but the deployment has no key for it on this gateway? It has: so take the key away
    gw.services.settings = gw.services.settings.replace(platform={})
    r = await gw.call("GET", "/catalog/call/crm.people", as_=visitor)
    assert r.status == 403 and (await r.json())["error"] == "demo_not_allowed" and up.exchanges == []


@pytest.mark.parametrize("path", sorted({p for _, p in openapi.OPERATIONS if p != openapi.PATH}))
async def test_no_management_route_from_any_address(demo, path):
    gw, up, visitor = demo
    concrete = path.replace("{", "").replace("}", "")
    methods = sorted({m for m, p in openapi.OPERATIONS if p == path})
    for forged in ({}, {"X-Forwarded-For": "127.0.0.1"}, {"X-Forwarded-For": "10.0.0.1, 127.0.0.1"}):
        for method in methods:
            r = await gw.call(method, concrete, as_={**visitor, **forged}, json={})
            assert r.status == 403, (method, path, r.status)
            assert (await r.json())["error"] == "demo_not_allowed" and r.headers["X-Treg-Demo"] == "1"


async def test_no_dashboard_and_no_mcp(demo):
    gw, up, visitor = demo
    token = visitor["X-Treg-Token"]
    r = await post_login(gw.client, {"token": token}, allow_redirects=False)
    assert r.status == 403 and "public demo token" in await r.text() and "treg_session" not in r.cookies
    for path in ("/mcp", "/catalog/mcp"):
        r = await gw.client.post(path, headers={**visitor, "Accept": "application/json",
                                                "Content-Type": "application/json"},
                                 json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert r.status == 403 and (await r.json())["error"] == "demo_not_allowed"
        r = await gw.client.post(path, headers={"Authorization": f"Bearer {token}", "Accept": "application/json",
                                                "Content-Type": "application/json"},
                                 json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
        assert r.status == 403


async def test_disabled_demo_tokens_answer_demo_disabled_and_enabling_revives_them(demo):
    gw, up, visitor = demo
    assert (await gw.call("GET", "/catalog/call/crm.contacts", as_=visitor)).status == 200  # cached now
    assert (await gw.api("GET", "/api/v1/org", expect=200))["public_demo"] is True
    assert await public_demo.set_enabled(gw.services, "v", False) == {"org": "v", "public_demo": False}
    assert (await gw.api("GET", "/api/v1/org", expect=200))["public_demo"] is False
    sent = len(up.exchanges)
    for path in ("/catalog/call/crm.contacts", "/table/crm.contacts", "/api/v1/me"):
        r = await gw.call("GET", path, as_=visitor)
        assert r.status == 403 and (await r.json())["error"] == "demo_disabled", path
        assert r.headers.getall("X-Treg-Demo") == ["1"]
    assert len(up.exchanges) == sent
    # a token issued while disabled is born disabled
    later = {"X-Treg-Token": (await public_demo.issue_token(gw.services, "v"))["token"]}
    assert (await gw.call("GET", "/catalog/call/crm.contacts", as_=later)).status == 403
    await public_demo.set_enabled(gw.services, "v", True)
    for who in (visitor, later):
        assert (await gw.call("GET", "/catalog/call/crm.contacts", as_=who)).status == 200


@pytest.mark.parametrize("demo_settings", [{"demo_endpoints": DEMO, "demo_calls_per_hour": 3}])
async def test_hourly_limit_per_peer_ignores_forwarded_for_from_an_untrusted_peer(demo):
    gw, up, visitor = demo
    for i in range(3):
        r = await gw.call("GET", "/catalog/call/crm.status", as_={**visitor, "X-Forwarded-For": f"198.51.100.{i}"})
        assert r.status == 200
    r = await gw.call("GET", "/catalog/call/crm.status", as_={**visitor, "X-Forwarded-For": "203.0.113.9"})
    body = await r.json()
    assert r.status == 429 and body["error"] == "demo_rate_limited" and body["limit"] == 3
    assert 3500 <= body["retry_after_s"] <= 3600 and r.headers["Retry-After"] == str(body["retry_after_s"])
    assert r.headers.getall("X-Treg-Demo") == ["1"]
    assert len(up.exchanges) == 3
    row = await audit_row(gw, r.headers["X-Treg-Call-Id"])
    assert row["outcome"] == "refused" and row["refused_by"] == "demo" and row["demo"] is True
    # the owner's calls are not the demo's
    assert (await gw.call("GET", "/catalog/call/crm.status")).status == 200


@pytest.mark.parametrize("demo_settings", [{"demo_endpoints": DEMO, "demo_calls_per_hour": 2,
                                            "trusted_proxies": ("127.0.0.1",)}])
async def test_behind_a_trusted_proxy_the_forwarded_client_address_counts(demo):
    gw, up, visitor = demo

    async def call(xff: str | None) -> int:
        headers = {**visitor, **({"X-Forwarded-For": xff} if xff is not None else {})}
        return (await gw.call("GET", "/catalog/call/crm.status", as_=headers)).status

    assert [await call("192.0.2.1, 127.0.0.1"), await call("192.0.2.1")] == [200, 200]
    # what a visitor wrote before the proxy's own entry does not pick its bucket (read from the right)
    assert await call("198.51.100.5, 192.0.2.1") == 429
    assert await call("192.0.2.2") == 200  # another client
    assert [await call(None), await call(None), await call(None)] == [200, 200, 429]  # the proxy itself
    assert await call("192.0.2.7, garbage") == 429  # no address where the proxy wrote: the proxy's bucket
    # an IPv6 client counts by its /64
    assert [await call("2001:db8::1"), await call("2001:db8::2")] == [200, 200]
    assert await call("2001:db8::ffff:1") == 429
    assert await call("2001:db8:0:1::1") == 200


@pytest.mark.parametrize("demo_settings", [{"demo_endpoints": DEMO, "demo_calls_per_hour": 2,
                                            "demo_daily_budget_micro": 1_000_000}])
async def test_refused_calls_do_not_count(demo):
    gw, up, visitor = demo
    # refused by the daily budget (a call whose hold would pass it), after the hour counted it: given back
    r = await gw.call("GET", "/catalog/call/crm.dear", as_=visitor)  # 400 000
    assert r.status == 200
    r = await gw.call("GET", "/catalog/call/crm.dear", as_=visitor)  # 800 000
    assert r.status == 200
    # the hour is full now (2): a third is refused by the hour, not counted either
    r = await gw.call("GET", "/catalog/call/crm.status", as_=visitor)
    assert r.status == 429 and (await r.json())["error"] == "demo_rate_limited"
    async with gw.services.db.tx() as tx:
        await tx.execute("DELETE FROM demo_calls")  # a new hour
    r = await gw.call("GET", "/catalog/call/crm.dear", as_=visitor)  # would be 1 200 000
    assert r.status == 429 and (await r.json())["error"] == "demo_budget_spent"
    r = await gw.call("GET", "/catalog/call/crm.bulk", as_=visitor)  # not listed: never counted
    assert r.status == 403
    statuses = [(await gw.call("GET", "/catalog/call/crm.status", as_=visitor)).status for _ in range(3)]
    assert statuses == [200, 200, 429]


@pytest.mark.parametrize("demo_settings", [{"demo_endpoints": DEMO, "demo_calls_per_hour": 100,
                                            "demo_daily_budget_micro": 1_000_000,
                                            "trusted_proxies": ("127.0.0.1",)}])
async def test_no_address_spends_more_than_the_day_budget(demo):
    gw, up, visitor = demo
    statuses = []
    for i in range(6):  # a new forged address each time, through the trusted proxy and around it
        xff = f"192.0.2.{i}" if i % 2 else f"198.51.100.{i}, 127.0.0.1"
        r = await gw.call("GET", "/catalog/call/crm.dear", as_={**visitor, "X-Forwarded-For": xff})
        statuses.append(r.status)
        if r.status == 429:
            body = await r.json()
            assert body["error"] == "demo_budget_spent" and body["available_micro"] == 200_000
            assert body["resets_at"].endswith("T00:00:00Z") and r.headers.getall("X-Treg-Demo") == ["1"]
            assert r.headers["X-Treg-Cost-Micro"] == "0"
    assert statuses == [200, 200, 429, 429, 429, 429]
    assert len(up.exchanges) == 2 and await spent_today(gw) == 800_000 <= 1_000_000
    # cheaper calls fit in what is left, exactly: 200 000 / 1 000 each
    for _ in range(5):
        assert (await gw.call("GET", "/catalog/call/crm.contacts", as_=visitor)).status == 200
    assert await spent_today(gw) == 805_000
    await check_books(gw.services, gw.org["org_id"])


@pytest.mark.parametrize("demo_settings", [{"demo_endpoints": DEMO, "demo_daily_budget_micro": 1_000_000}])
async def test_the_budget_counts_every_concurrent_hold(demo):
    import asyncio

    gw, up, visitor = demo
    rs = await asyncio.gather(*(gw.call("GET", "/catalog/call/crm.dear", as_=visitor) for _ in range(8)))
    assert sorted(r.status for r in rs) == [200, 200] + [429] * 6
    assert await spent_today(gw) == 800_000 and len(up.exchanges) == 2


async def test_the_cli_enables_disables_and_issues_tokens_once(demo, tmp_path):
    gw, up, visitor = demo
    out = await public_demo.issue_token(gw.services, "v")
    assert set(out) == {"token", "org", "public_demo"} and out["token"].startswith("treg_")
    tokens = (await gw.api("GET", "/api/v1/tokens", expect=200))["tokens"]
    demo_rows = [t for t in tokens if t["scope"] == "demo"]
    assert len(demo_rows) == 2 and all(out["token"] not in json.dumps(t, default=str) for t in tokens)
    with pytest.raises(Exception) as exc:
        await public_demo.set_enabled(gw.services, "no-such-org", True)
    assert getattr(exc.value, "code", None) == "org_not_found"
