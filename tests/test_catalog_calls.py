"""Catalog calls over real HTTP hops: every ladder tier, every refusal, money and idempotency.

A provider plugin built per test points at a raw-socket upstream on 127.0.0.1 standing in for the
provider.
"""

import asyncio
import json

import pytest

from treg import membership, money
from treg.keys import SERVICES
from treg.settings import SecretStr
from treg.testing import Gateway, ProviderPlugin as Plugin, example_provider as provider, http_response, raw_upstream


@pytest.fixture
async def cat(aiohttp_client, make_app):
    """(gateway, upstream) with the acme provider on a raw upstream; a platform key configured."""
    async with raw_upstream(lambda ex: http_response(200, b'{"ok": true}', [("Content-Type", "application/json")])) as up:
        app = make_app(extra_plugins=(Plugin([provider(up.url + "/v1")]),), ssrf_allow=("127.0.0.0/8",),
                       platform={"TREG_PLATFORM_KEY_ACME": SecretStr("platform-key-123")},
                       anonymous_providers=("acme",))
        client = await aiohttp_client(app)
        org = await membership.create_org(client.app[SERVICES], slug="acme-org", email="o@acme.test")
        gw = Gateway(client, org)
        yield gw, up
        await client.close()


async def grant(gw, micro):
    await money.grant(gw.services, org_id=gw.org["org_id"], amount_micro=micro, actor="test")


async def test_platform_tier_bills_and_injects_platform_key(cat):
    gw, up = cat
    await grant(gw, 10_000)
    r = await gw.call("GET", "/catalog/call/acme.items.get?item_id=7&fields=all")
    assert r.status == 200, await r.text()
    assert r.headers["X-Treg-Credential-Tier"] == "platform" and r.headers["X-Treg-Cost-Micro"] == "2000"
    assert up.last.target == "/v1/items/7?fields=all"
    assert up.last.header("Authorization") == "Bearer platform-key-123"
    assert up.last.header("X-Api-Version") == "2025-11-01"
    bal = await gw.api("GET", "/api/v1/balance", expect=200)
    assert bal["balance_micro"] == 8000 and bal["held_micro"] == 0
    detail = await gw.api("GET", f"/api/v1/calls/{r.headers['X-Treg-Call-Id']}", expect=200)
    assert detail["credential_tier"] == "platform" and detail["cost_micro"] == 2000
    assert detail["hold_state"] == "settled"


async def test_team_tier_beats_platform_and_is_free(cat):
    gw, up = cat
    await gw.secret("team-key-456", name="acme key", provider="acme")
    r = await gw.call("GET", "/call/acme.items.get?item_id=1")
    assert r.status == 200
    assert r.headers["X-Treg-Credential-Tier"] == "team" and r.headers["X-Treg-Cost-Micro"] == "0"
    assert up.last.header("Authorization") == "Bearer team-key-456"


async def test_own_tier_uses_the_tools_bindings_and_own_tool_name_wins(cat):
    gw, up = cat
    sid = await gw.secret("own-key-789", name="mine", provider="acme")
    await gw.tool("acme-tool", up.url + "/elsewhere", [{"location": "header", "name": "X-Own", "secret_id": sid}])
    r = await gw.call("GET", "/catalog/call/acme.items.get?item_id=1")
    assert r.headers["X-Treg-Credential-Tier"] == "own"
    assert up.last.header("X-Own") == "own-key-789" and up.last.target == "/v1/items/1"
    # an org tool named exactly like a catalog id wins on /call/
    await gw.tool("acme.items.get", up.url + "/shadow")
    r = await gw.call("GET", "/call/acme.items.get/x")
    assert r.status == 200 and up.last.target == "/shadow/x" and "X-Treg-Credential-Tier" not in r.headers
    # but never on /catalog/call/
    r = await gw.call("GET", "/catalog/call/acme.items.get?item_id=2")
    assert up.last.target == "/v1/items/2"


async def test_anonymous_tier_is_free_and_injects_nothing(cat):
    gw, up = cat
    r = await gw.call("GET", "/catalog/call/acme.status", headers={"Authorization": "Bearer callers-own"})
    assert r.headers["X-Treg-Credential-Tier"] == "anonymous" and r.headers["X-Treg-Cost-Micro"] == "0"
    assert up.last.header("Authorization") == "Bearer callers-own"  # relayed, not stripped or replaced


async def test_no_credential_404_with_alternatives(aiohttp_client, make_app):
    async with raw_upstream() as up:
        client = await aiohttp_client(make_app(extra_plugins=(Plugin([provider(up.url)]),),
                                               ssrf_allow=("127.0.0.0/8",)))
        org = await membership.create_org(client.app[SERVICES], slug="o", email="o@o.test")
        gw = Gateway(client, org)
        r = await gw.call("GET", "/catalog/call/acme.items.get?item_id=1")
        body = await r.json()
        assert r.status == 404 and body["error"] == "no_credential"
        assert "provider" in body["detail"] and "TREG_PLATFORM_KEY_ACME" in body["detail"]
        assert [a["id"] for a in body["alternatives"]][:1] == ["acme.items.cheap"]
        assert "X-Treg-Credential-Tier" not in r.headers
        assert len(up.exchanges) == 0
        await client.close()


async def test_refusals(cat):
    gw, up = cat
    r = await gw.call("GET", "/catalog/call/acme.items.old")
    body = await r.json()
    assert r.status == 410 and body["superseded_by"] == "acme.items.get" and body["status_note"] == "v0 is gone"
    r = await gw.call("GET", "/call/acme.items.get/7")
    body = await r.json()
    assert r.status == 400 and body["error"] == "catalog_path_not_allowed" and "item_id" in body["detail"]
    r = await gw.call("GET", "/catalog/call/acme.itemz.get")
    body = await r.json()
    assert r.status == 404 and body["error"] == "endpoint_not_found" and "acme.items.get" in body["did_you_mean"]
    r = await gw.call("GET", "/call/acme.itemz.get")
    assert r.status == 404 and (await r.json())["error"] == "endpoint_not_found"
    r = await gw.call("GET", "/catalog/call/acme.search?q=a&extra=1")
    body = await r.json()
    assert r.status == 400 and body["error"] == "invalid_parameters" and "extra" in body["detail"]
    r = await gw.call("GET", "/catalog/call/acme.items.get?item_id=1&fields=bogus")
    assert r.status == 400 and "fields" in (await r.json())["detail"]
    assert len(up.exchanges) == 0


@pytest.mark.parametrize("raw,expected", [
    ("sc-domain%3Aexample.com", "/v1/items/sc-domain%3Aexample.com"),
    ("a%40b.c", "/v1/items/a@b.c"),
    ("a@b.c", "/v1/items/a@b.c"),
    ("a%2Fb", "/v1/items/a%2Fb"),
    ("x%3Fy%23z", "/v1/items/x%3Fy%23z"),
])
async def test_placeholder_encoding_over_http(cat, raw, expected):
    gw, up = cat
    await gw.secret("team-key-456", provider="acme")
    r = await gw.call("GET", f"/catalog/call/acme.items.get?item_id={raw}")
    assert r.status == 200 and up.last.target == expected


async def test_402_names_the_limit_and_nothing_is_sent(cat):
    gw, up = cat
    await grant(gw, 1999)
    r = await gw.call("GET", "/catalog/call/acme.items.get?item_id=1")
    body = await r.json()
    assert r.status == 402 and body["error"] == "insufficient_balance" and body["limit"] == "balance"
    assert body["needed_micro"] == 2000 and body["available_micro"] == 1999
    assert r.headers["X-Treg-Credential-Tier"] == "platform" and r.headers["X-Treg-Cost-Micro"] == "0"
    assert len(up.exchanges) == 0


async def test_failed_answer_releases_and_charges_zero(cat):
    gw, up = cat
    await grant(gw, 10_000)
    up.responder = lambda ex: http_response(500, b'{"error":"boom"}', reason="Internal Server Error")
    r = await gw.call("GET", "/catalog/call/acme.items.get?item_id=1")
    assert r.status == 500 and await r.read() == b'{"error":"boom"}'
    assert r.headers["X-Treg-Cost-Micro"] == "0" and "X-Treg-Error" not in r.headers
    bal = await gw.api("GET", "/api/v1/balance", expect=200)
    assert bal["balance_micro"] == 10_000 and bal["held_micro"] == 0
    detail = await gw.api("GET", f"/api/v1/calls/{r.headers['X-Treg-Call-Id']}", expect=200)
    assert detail["hold_state"] == "released" and detail["cost_micro"] == 0


async def test_usage_price_settles_from_the_answer(cat):
    gw, up = cat
    await grant(gw, 100_000)
    up.responder = lambda ex: http_response(200, json.dumps({"usage": {"total_tokens": 1000}}).encode())
    r = await gw.call("POST", "/catalog/call/acme.chat", json={"m": "hi"})
    assert r.status == 200 and r.headers["X-Treg-Cost-Micro"] == "3000"
    assert (await gw.api("GET", "/api/v1/balance"))["balance_micro"] == 97_000


@pytest.mark.parametrize("size,ok", [(64 * 1024, True), (64 * 1024 + 1, False)])
async def test_response_buffer_limit_boundary(cat, monkeypatch, size, ok):
    from treg.call import metered

    monkeypatch.setattr(metered, "BUFFER_MAX", 64 * 1024)
    gw, up = cat
    await grant(gw, 10_000)
    up.responder = lambda ex: http_response(200, b"x" * size)
    r = await gw.call("GET", "/catalog/call/acme.items.get?item_id=1")
    if ok:
        assert r.status == 200 and len(await r.read()) == size and r.headers["X-Treg-Cost-Micro"] == "2000"
    else:
        body = await r.json()
        assert r.status == 502 and body["error"] == "response_buffer_limit" and body["blame"] == "treg"
        assert r.headers["X-Treg-Cost-Micro"] == "0"
        assert (await gw.api("GET", "/api/v1/balance"))["balance_micro"] == 10_000


async def test_idempotent_retry_replays_without_second_charge(cat):
    gw, up = cat
    await grant(gw, 10_000)
    h = {"Idempotency-Key": "order-42"}
    r1 = await gw.call("GET", "/catalog/call/acme.items.get?item_id=1", headers=h)
    assert r1.status == 200 and r1.headers["X-Treg-Cost-Micro"] == "2000"
    sent_key = up.last.header("Idempotency-Key")
    assert sent_key and sent_key != "order-42"  # the platform account sees a digest of (org, label)
    r2 = await gw.call("GET", "/catalog/call/acme.items.get?item_id=1", headers=h)
    assert r2.status == 200 and r2.headers["X-Treg-Idempotent-Replay"] == "true"
    assert await r2.read() == await r1.read() and r2.headers["X-Treg-Cost-Micro"] == "0"
    assert len(up.exchanges) == 1
    assert (await gw.api("GET", "/api/v1/balance"))["balance_micro"] == 8000
    r3 = await gw.call("GET", "/catalog/call/acme.items.get?item_id=2", headers=h)
    assert r3.status == 422 and (await r3.json())["error"] == "idempotency_mismatch"


async def test_a_replay_stored_before_private_caching_is_said_private(cat):
    """An answer stored for replay before treg made relayed answers private still holds the vendor's
    ``Cache-Control: public`` and its CDN field: its replay says it as a relayed answer is said now,
    so no cache shared between callers keeps it (docs/clients.md)."""
    gw, up = cat
    await grant(gw, 10_000)
    up.responder = lambda ex: http_response(200, b'{"item": 1}', [("Cache-Control", "public, max-age=600")])
    h = {"Idempotency-Key": "order-43"}
    r1 = await gw.call("GET", "/catalog/call/acme.items.get?item_id=1", headers=h)
    assert r1.status == 200 and r1.headers.getall("Cache-Control") == ["private, max-age=600"]
    stored = [["Content-Type", "application/json"], ["Cache-Control", "public, max-age=600"],
              ["CDN-Cache-Control", "max-age=600"], ["Surrogate-Control", "max-age=600"], ["X-Vendor", "v"]]
    async with gw.services.db.tx() as tx:  # as an entry stored by the treg before this one
        await tx.execute("UPDATE idempotency_keys SET headers = %(h)s::jsonb WHERE org_id = %(o)s",
                         {"h": json.dumps(stored), "o": gw.org["org_id"]})
    r2 = await gw.call("GET", "/catalog/call/acme.items.get?item_id=1", headers=h)
    assert r2.status == 200 and r2.headers["X-Treg-Idempotent-Replay"] == "true"
    assert r2.headers.getall("Cache-Control") == ["private, max-age=600"]
    assert "CDN-Cache-Control" not in r2.headers and "Surrogate-Control" not in r2.headers
    assert r2.headers["X-Vendor"] == "v" and len(up.exchanges) == 1


async def test_idempotency_in_progress_is_409(cat):
    gw, up = cat
    await grant(gw, 10_000)
    gate = asyncio.Event()

    async def slow(ex):
        await asyncio.wait_for(gate.wait(), 10)
        return http_response(200, b"{}")

    up.responder = slow
    h = {"Idempotency-Key": "k1"}
    first = asyncio.create_task(gw.call("GET", "/catalog/call/acme.items.get?item_id=1", headers=h))
    for _ in range(100):
        if up.exchanges:
            break
        await asyncio.sleep(0.01)
    r = await gw.call("GET", "/catalog/call/acme.items.get?item_id=1", headers=h)
    assert r.status == 409 and (await r.json())["error"] == "idempotency_in_progress"
    gate.set()
    assert (await first).status == 200


async def test_concurrent_idempotent_retries_never_charge_twice(cat):
    gw, up = cat
    await grant(gw, 100_000)

    async def slowish(ex):
        await asyncio.sleep(0.05)
        return http_response(200, b"{}")

    up.responder = slowish
    h = {"Idempotency-Key": "same"}
    results = await asyncio.gather(*(gw.call("GET", "/catalog/call/acme.items.get?item_id=1", headers=h)
                                     for _ in range(20)))
    statuses = sorted(r.status for r in results)
    assert set(statuses) <= {200, 409} and statuses.count(200) >= 1
    charged = sum(int(r.headers.get("X-Treg-Cost-Micro", "0")) for r in results)
    assert charged == 2000
    assert (await gw.api("GET", "/api/v1/balance"))["balance_micro"] == 98_000
    assert len(up.exchanges) == 1


async def test_402_for_each_limit_over_http(cat):
    gw, up = cat
    await grant(gw, 1_000_000)
    url = "/catalog/call/acme.items.get?item_id=1"
    # daily cap: one call fits, the second does not
    await gw.api("PUT", "/api/v1/limits/daily-cap", json={"micro": 3000}, expect=200)
    assert (await gw.call("GET", url)).status == 200
    r = await gw.call("GET", url)
    body = await r.json()
    assert r.status == 402 and body["error"] == "daily_cap" and body["limit"] == "daily_cap"
    assert body["needed_micro"] == 2000 and body["available_micro"] == 1000
    await gw.api("PUT", "/api/v1/limits/daily-cap", json={"micro": None}, expect=200)
    # tag budget: calls tagged with X-Treg-Tag
    await gw.api("PUT", "/api/v1/limits/tags/campaign-a", json={"budget_micro": 2500}, expect=200)
    tagged = {"X-Treg-Tag": "campaign-a"}
    assert (await gw.call("GET", url, headers=tagged)).status == 200
    r = await gw.call("GET", url, headers=tagged)
    body = await r.json()
    assert r.status == 402 and body["error"] == "tag_budget" and body["limit"] == "tag_budget"
    assert (await gw.call("GET", url, headers={"X-Treg-Tag": "campaign-b"})).status == 200
    # member cap
    m = await gw.member("m@acme.test")
    await gw.api("PUT", f"/api/v1/limits/members/{m['member_id']}", json={"daily_cap_micro": 1000}, expect=200)
    r = await gw.call("GET", url, as_=m["headers"])
    body = await r.json()
    assert r.status == 402 and body["error"] == "member_cap" and body["limit"] == "member_cap"
    assert "X-Treg-Error" in r.headers
    sent = len(up.exchanges)
    assert sent == 3  # no refused call reached the provider


async def test_body_allowlist_and_broken_endpoint_over_http(cat):
    gw, up = cat
    await gw.secret("team-key-456", provider="acme")
    r = await gw.call("POST", "/catalog/call/acme.items.create", json={"name": "x", "tags": ["a"]})
    assert r.status == 200 and json.loads(up.last.body) == {"name": "x", "tags": ["a"]}
    for body, param in (({"name": "x", "extra": 1}, "extra"), ({"tags": ["a"]}, "name"),
                        ({"name": "x", "tags": ["a", "b", "a"]}, "tags"), ({"name": "x", "tags": ["z"]}, "tags")):
        r = await gw.call("POST", "/catalog/call/acme.items.create", json=body)
        err = await r.json()
        assert r.status == 400 and err["error"] == "invalid_parameters" and param in err["detail"], (body, err)
    r = await gw.call("GET", "/catalog/call/acme.items.legacy")
    err = await r.json()
    assert r.status == 410 and err["superseded_by"] is None and err["status_note"] == "the provider turned it off"
    assert [a["id"] for a in err["alternatives"]] == ["acme.items.cheap", "acme.items.get"]
    assert all({"id", "price_micro", "tier"} <= set(a) for a in err["alternatives"])
    detail = await gw.api("GET", f"/api/v1/calls/{r.headers['X-Treg-Call-Id']}", expect=200)
    assert detail["refused_by"] == "retired"
    assert len(up.exchanges) == 1
