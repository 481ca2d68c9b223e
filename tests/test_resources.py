"""Owned resources on the platform tier (docs/lifecycle.md "Owned resources"), over real HTTP hops: two
orgs share treg's key at a fake vendor on 127.0.0.1; every rule, the money to the micro-dollar, and
every hold closed once."""

from __future__ import annotations

import asyncio
import json

import pytest

from treg import idempotency
from treg.infra import upstream as upstream_mod
from treg.settings import SecretStr
from treg.testing import Gateway, ProviderPlugin, open_org, org_holds, raw_upstream
from treg.testing.vendors.resources import PLATFORM_KEY, TEAM_KEY, FakeVendor, hooky_provider

CREATE = "/catalog/call/hooky.webhooks.create"


def update(wid: str) -> str:
    return f"/catalog/call/hooky.webhooks.update?webhook_id={wid}"


def delete(wid: str) -> str:
    return f"/catalog/call/hooky.webhooks.delete?webhook_id={wid}"


def ping(wid: str) -> str:
    return f"/catalog/call/hooky.webhooks.ping?webhook_id={wid}"


@pytest.fixture
async def two(aiohttp_client, make_app):
    """(org A's gateway, org B's gateway, the vendor, its upstream): each org granted 100,000 micro-USD."""
    vendor = FakeVendor()
    async with raw_upstream(vendor) as up:
        app = make_app(extra_plugins=(ProviderPlugin([hooky_provider(up.url + "/v1")]),),
                       ssrf_allow=("127.0.0.0/8",), platform={"TREG_PLATFORM_KEY_HOOKY": SecretStr(PLATFORM_KEY)})
        client = await aiohttp_client(app)
        a = await open_org(client, "alpha", "a@alpha.test", credits=100_000)
        b = await open_org(client, "beta", "b@beta.test", credits=100_000)
        yield a, b, vendor, up
        await client.close()


async def create(gw: Gateway, **kw) -> tuple[int, dict, dict]:
    r = await gw.call("POST", CREATE, json={"url": "https://example.test/hook"}, **kw)
    return r.status, await r.json(), dict(r.headers)


async def balance(gw: Gateway) -> tuple[int, int]:
    b = await gw.api("GET", "/api/v1/balance", expect=200)
    return b["balance_micro"], b["held_micro"]


async def listed(gw: Gateway, query: str = "") -> list[dict]:
    return (await gw.api("GET", "/api/v1/resources" + query, expect=200))["resources"]


async def assert_holds_closed(gw: Gateway, settled: list[int]) -> None:
    """Every hold of the org is closed (none left held), and the settled ones charged exactly ``settled``."""
    rows = await org_holds(gw.services, gw.org["org_id"])
    assert [r["state"] for r in rows if r["state"] == "held"] == []
    assert [r["settled_micro"] for r in rows if r["state"] == "settled"] == settled


async def test_create_relays_with_no_connection_held_then_records_and_lists(two, monkeypatch):
    a, b, vendor, up = two
    svc = a.services
    held_while_sending = []
    real_send = upstream_mod.send

    async def watched_send(session, req, **kw):
        held_while_sending.append(asyncio.current_task() in svc.db.holders)
        return await real_send(session, req, **kw)

    monkeypatch.setattr(upstream_mod, "send", watched_send)
    status, body, headers = await create(a)
    assert status == 201 and body["data"]["id"] == "wh_1"
    assert headers["X-Treg-Credential-Tier"] == "platform" and headers["X-Treg-Cost-Micro"] == "5000"
    assert held_while_sending == [False]
    assert up.last.header("Authorization") == f"Bearer {PLATFORM_KEY}" and up.last.header("X-Hooky-Version") == "7"
    rows = await listed(a)
    assert [(r["kind"], r["provider"], r["id"], r["state"], r["tag"]) for r in rows] == [
        ("webhook", "hooky", "wh_1", "active", None)]
    assert rows[0]["created_at"] and rows[0]["call_id"] == headers["X-Treg-Call-Id"]
    assert await listed(b) == []
    assert await balance(a) == (95_000, 0)
    await assert_holds_closed(a, [5000])


async def test_other_org_and_unknown_ids_are_refused_alike_without_vendor_io(two):
    a, b, vendor, up = two
    await create(a)
    sent = len(up.exchanges)
    answers = {}
    for name, wid in (("foreign", "wh_1"), ("unknown", "wh_999")):
        for method, path in (("PATCH", update(wid)), ("POST", ping(wid)), ("DELETE", delete(wid)),
                             ("GET", f"/catalog/call/hooky.webhooks.get?hook={wid}")):
            r = await b.call(method, path, json={"url": "x"} if method == "PATCH" else None)
            body = await r.json()
            assert r.status == 403 and body["error"] == "resource_not_owned" and body["blame"] == "caller", body
            assert r.headers["X-Treg-Error"] == "1" and r.headers["X-Treg-Cost-Micro"] == "0"
            answers[(name, method)] = (r.status, json.dumps(body).replace(wid, "<id>"))
    for method in ("PATCH", "POST", "DELETE", "GET"):
        assert answers[("foreign", method)] == answers[("unknown", method)]
    assert len(up.exchanges) == sent  # the vendor saw nothing
    assert await balance(b) == (100_000, 0)
    assert await org_holds(b.services, b.org["org_id"]) == []  # refused before any hold
    rows = [c for c in await b.calls() if c["status"] == 403]
    assert len(rows) == 8 and {c["refused_by"] for c in rows} == {"ownership"}
    assert vendor.objects["wh_1"] == {"url": "https://example.test/hook"}


async def test_update_and_use_need_an_active_object_and_local_state_follows_the_vendor(two):
    a, b, vendor, up = two
    await create(a)
    before = (await listed(a))[0]["updated_at"]
    vendor.fail_next = 500
    r = await a.call("PATCH", update("wh_1"), json={"url": "https://example.test/v2"})
    assert r.status == 500 and r.headers["X-Treg-Cost-Micro"] == "0"
    assert (await listed(a))[0]["updated_at"] == before  # no 2xx: local state unchanged
    r = await a.call("PATCH", update("wh_1"), json={"url": "https://example.test/v2"})
    assert r.status == 200 and r.headers["X-Treg-Cost-Micro"] == "1000"
    assert (await listed(a))[0]["updated_at"] > before
    assert vendor.objects["wh_1"]["url"] == "https://example.test/v2"
    r = await a.call("POST", ping("wh_1"))  # a free use: read whole, no hold
    assert r.status == 200 and await r.json() == {"pinged": "wh_1"} and r.headers["X-Treg-Cost-Micro"] == "0"
    r = await a.call("GET", "/catalog/call/hooky.webhooks.get?hook=wh_1")  # the id in a query parameter
    assert r.status == 200 and r.headers["X-Treg-Cost-Micro"] == "300"
    assert await balance(a) == (100_000 - 5000 - 1000 - 300, 0)
    await assert_holds_closed(a, [5000, 1000, 300])


async def test_delete_tombstones_then_a_retry_is_safe_and_updates_are_refused(two):
    a, b, vendor, up = two
    await create(a)
    r = await a.call("DELETE", delete("wh_1"))
    assert r.status == 204 and r.headers["X-Treg-Cost-Micro"] == "0"
    assert [(x["id"], x["state"]) for x in await listed(a)] == [("wh_1", "deleted")]
    assert "wh_1" not in vendor.objects
    sent = len(up.exchanges)
    r = await a.call("PATCH", update("wh_1"), json={"url": "y"})
    body = await r.json()
    assert r.status == 403 and body["error"] == "resource_not_owned" and "deleted" in body["detail"]
    r = await a.call("POST", ping("wh_1"))
    assert r.status == 403
    assert len(up.exchanges) == sent
    r = await a.call("DELETE", delete("wh_1"))  # a retried delete: allowed, the vendor's 404 relayed
    assert r.status == 404 and len(up.exchanges) == sent + 1
    assert [(x["id"], x["state"]) for x in await listed(a)] == [("wh_1", "deleted")]
    r = await b.call("DELETE", delete("wh_1"))  # another org: still not theirs, tombstone or not
    assert r.status == 403 and len(up.exchanges) == sent + 1
    assert await balance(a) == (95_000, 0)
    await assert_holds_closed(a, [5000])


async def test_vendor_404_on_an_owned_delete_marks_it_deleted(two):
    a, b, vendor, up = two
    await create(a)
    del vendor.objects["wh_1"]  # gone at the vendor by other means
    r = await a.call("DELETE", delete("wh_1"))
    assert r.status == 404
    assert [(x["id"], x["state"]) for x in await listed(a)] == [("wh_1", "deleted")]
    assert await listed(a, "?state=active") == [] and len(await listed(a, "?state=deleted")) == 1


async def _inject_record_fault(svc, resource_id: str) -> None:
    """A real database failure on the ownership insert of one id (a trigger raising)."""
    async with svc.db.tx() as tx:
        await tx.execute("CREATE FUNCTION treg_test_fault() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                         f"IF NEW.resource_id = '{resource_id}' THEN RAISE EXCEPTION 'injected fault'; END IF; "
                         "RETURN NEW; END $$")
        await tx.execute("CREATE TRIGGER treg_test_fault BEFORE INSERT OR UPDATE ON provider_resources "
                         "FOR EACH ROW EXECUTE FUNCTION treg_test_fault()")


async def test_recording_failure_deletes_at_the_vendor_and_answers_502_without_the_id(two, caplog):
    a, b, vendor, up = two
    await _inject_record_fault(a.services, "wh_1")
    status, body, headers = await create(a)
    assert status == 502 and body["error"] == "resource_record_failed" and body["blame"] == "treg"
    assert body["cleanup"] == "deleted" and headers["X-Treg-Error"] == "1"
    assert "wh_1" not in json.dumps(body) and headers["X-Treg-Cost-Micro"] == "0"
    create_ex, delete_ex = up.exchanges[-2:]
    assert create_ex.method == "POST"
    assert delete_ex.method == "DELETE" and delete_ex.target == "/v1/webhooks/wh_1"
    assert delete_ex.header("Authorization") == f"Bearer {PLATFORM_KEY}" and delete_ex.header("X-Hooky-Version") == "7"
    assert vendor.objects == {}
    assert await listed(a) == []
    assert await balance(a) == (100_000, 0)
    await assert_holds_closed(a, [])
    rows = await org_holds(a.services, a.org["org_id"])
    assert [r["state"] for r in rows] == ["released"]
    call = await a.api("GET", f"/api/v1/calls/{headers['X-Treg-Call-Id']}", expect=200)
    assert call["error_code"] == "resource_record_failed" and call["hold_state"] == "released"
    assert call["cost_micro"] == 0
    assert "wh_1" in caplog.text  # the operator's log names the object and its cleanup
    # the next id records normally
    status, body, _ = await create(a)
    assert status == 201 and body["data"]["id"] == "wh_2"
    assert await balance(a) == (95_000, 0)


async def test_an_id_owned_by_another_org_is_neither_recorded_nor_deleted(two):
    a, b, vendor, up = two
    await create(a)
    vendor.force_id = "wh_1"  # the vendor names A's live object for B's create
    status, body, headers = await create(b)
    assert status == 502 and body["error"] == "resource_record_failed" and body["cleanup"] == "left_in_place"
    assert "wh_1" not in json.dumps(body)
    assert up.last.method == "POST"  # no delete was sent: the object is A's
    assert "wh_1" in vendor.objects
    assert [(x["id"], x["state"]) for x in await listed(a)] == [("wh_1", "active")] and await listed(b) == []
    assert await balance(b) == (100_000, 0)
    await assert_holds_closed(b, [])


async def test_a_create_answer_without_an_id_is_withheld(two):
    a, b, vendor, up = two
    vendor.omit_id = True
    status, body, headers = await create(a)
    assert status == 502 and body["error"] == "resource_record_failed" and headers["X-Treg-Cost-Micro"] == "0"
    assert await balance(a) == (100_000, 0)
    await assert_holds_closed(a, [])


async def test_own_and_team_tiers_relay_faithfully(two):
    a, b, vendor, up = two
    await create(a)
    await b.secret(TEAM_KEY, name="hooky", provider="hooky")
    r = await b.call("PATCH", update("wh_1"), json={"url": "z"})  # B's own account: no ownership check
    assert r.status == 200 and r.headers["X-Treg-Credential-Tier"] == "team"
    assert up.last.header("Authorization") == f"Bearer {TEAM_KEY}"
    r = await b.call("POST", CREATE, json={"url": "t"})
    assert r.status == 201 and r.headers["X-Treg-Credential-Tier"] == "team"
    assert await listed(b) == []  # nothing recorded for the team's own account
    r = await b.call("DELETE", delete("wh_404"))
    assert r.status == 404  # relayed, not refused
    assert await balance(b) == (100_000, 0)


async def test_pinned_calls_match_their_tag_and_are_404_otherwise(two):
    a, b, vendor, up = two
    status, body, _ = await create(a, headers={"X-Treg-Tag": "cust-1"})
    assert status == 201
    assert [(x["id"], x["tag"]) for x in await listed(a)] == [("wh_1", "cust-1")]
    sent = len(up.exchanges)
    answers = []
    for gw, tag, wid in ((a, "cust-2", "wh_1"), (b, "cust-1", "wh_1"), (a, "cust-2", "wh_77")):
        r = await gw.call("PATCH", update(wid), json={"url": "p"}, headers={"X-Treg-Tag": tag})
        body = await r.json()
        assert r.status == 404 and body["error"] == "resource_not_found", body
        answers.append(body["detail"].replace(wid, "<id>"))
    assert len(set(answers)) == 1 and len(up.exchanges) == sent
    r = await a.call("PATCH", update("wh_1"), json={"url": "p"}, headers={"X-Treg-Tag": "cust-1"})
    assert r.status == 200 and r.headers["X-Treg-Cost-Micro"] == "1000"
    r = await a.call("PATCH", update("wh_1"), json={"url": "q"})  # unpinned: the org's own objects
    assert r.status == 200
    # an object created unpinned is outside every pin
    await create(a)
    r = await a.call("DELETE", delete("wh_2"), headers={"X-Treg-Tag": "cust-1"})
    assert r.status == 404 and "wh_2" in vendor.objects
    assert await balance(a) == (100_000 - 5000 - 1000 - 1000 - 5000, 0)
    await assert_holds_closed(a, [5000, 1000, 1000, 5000])


async def test_idempotency_key_digest_and_replay_namespace_include_the_pin(two):
    a, b, vendor, up = two
    org = a.org["org_id"]
    key = {"Idempotency-Key": "make-hook-1"}
    status, body1, _ = await create(a, headers={**key, "X-Treg-Tag": "cust-1"})
    assert status == 201
    assert up.last.header("Idempotency-Key") == idempotency.shared_key_digest(org, "make-hook-1", (("tag", "cust-1"),))
    # another customer of the same org with the same label: neither treg's stored answer nor the
    # vendor's deduplication hands it customer 1's webhook
    status, body2, _ = await create(a, headers={**key, "X-Treg-Tag": "cust-2"})
    assert status == 201 and body2["data"]["id"] != body1["data"]["id"]
    assert up.last.header("Idempotency-Key") == idempotency.shared_key_digest(org, "make-hook-1", (("tag", "cust-2"),))
    status, body3, _ = await create(a, headers=key)  # unpinned: the digest of (org, label) as before
    assert status == 201 and body3["data"]["id"] not in (body1["data"]["id"], body2["data"]["id"])
    assert up.last.header("Idempotency-Key") == idempotency.shared_key_digest(org, "make-hook-1")
    sent = len(up.exchanges)
    r = await a.call("POST", CREATE, json={"url": "https://example.test/hook"}, headers={**key, "X-Treg-Tag": "cust-1"})
    assert r.status == 201 and r.headers["X-Treg-Idempotent-Replay"] == "true"
    assert (await r.json()) == body1 and r.headers["X-Treg-Cost-Micro"] == "0" and len(up.exchanges) == sent
    assert sorted((x["id"], x["tag"]) for x in await listed(a)) == [
        (body1["data"]["id"], "cust-1"), (body2["data"]["id"], "cust-2"), (body3["data"]["id"], None)]
    assert await balance(a) == (85_000, 0)
    await assert_holds_closed(a, [5000, 5000, 5000])


def test_unpinned_shared_digest_is_unchanged():
    import hashlib
    import hmac

    msg = len("org_a").to_bytes(4, "big") + b"org_a" + b"label-1"
    before = hmac.new(b"treg/platform-idempotency-key/v1", msg, hashlib.sha256).hexdigest()
    assert idempotency.shared_key_digest("org_a", "label-1") == before
    assert idempotency.shared_key_digest("org_a", "label-1", (("tag", "t"),)) != before
    assert idempotency.shared_key_digest("org_a", "label-1", (("tag", "t"),)) != \
        idempotency.shared_key_digest("org_a", "label-1", (("tag", "u"),))
    assert idempotency.pinned_key("l", (("tag", "t"),)).startswith(" ")


async def test_resources_listing_auth_and_limits(two):
    a, b, vendor, up = two
    for _ in range(3):
        await create(a)
    member = await a.member("m@alpha.test")
    rows = await listed(a)
    assert [r["id"] for r in rows] == ["wh_3", "wh_2", "wh_1"]
    assert [r["id"] for r in (await a.api("GET", "/api/v1/resources", as_=member["headers"], expect=200))["resources"]] \
        == ["wh_3", "wh_2", "wh_1"]
    assert [r["id"] for r in await listed(a, "?limit=2")] == ["wh_3", "wh_2"]
    assert await listed(a, "?kind=other") == [] and len(await listed(a, "?provider=hooky")) == 3
    r = await a.client.get("/api/v1/resources")
    assert r.status == 401 and r.headers["X-Treg-Error"] == "1"
    for bad in ("?limit=0", "?limit=x", "?state=gone"):
        r = await a.client.get("/api/v1/resources" + bad, headers=a.owner)
        body = await r.json()
        assert r.status == 400 and body["error"] in ("invalid_limit", "invalid_filter") and body["blame"] == "caller"


async def test_the_catalog_shows_the_descriptor(two):
    a, b, vendor, up = two
    body = await a.api("GET", "/api/v1/catalog/endpoints/hooky.webhooks.update", expect=200)
    assert body["managed_resource"] == {"kind": "webhook", "role": "update", "id_param": "webhook_id"}
    body = await a.api("GET", "/api/v1/catalog/endpoints/hooky.status", expect=200)
    assert body["managed_resource"] is None


async def test_an_id_in_the_body_is_checked_too(two):
    a, b, vendor, up = two
    await create(a)
    sent = len(up.exchanges)
    r = await b.call("POST", "/catalog/call/hooky.webhooks.test_event", json={"webhook_id": "wh_1"})
    assert r.status == 403 and (await r.json())["error"] == "resource_not_owned" and len(up.exchanges) == sent
    r = await a.call("POST", "/catalog/call/hooky.webhooks.test_event", json={"webhook_id": "wh_1"})
    assert r.status == 202 and await r.json() == {"sent_to": "wh_1"} and r.headers["X-Treg-Cost-Micro"] == "200"
    assert await balance(a) == (94_800, 0) and await balance(b) == (100_000, 0)
    await assert_holds_closed(a, [5000, 200])


async def test_concurrent_creates_naming_one_id_record_one_owner_and_delete_nothing(two):
    a, b, vendor, up = two
    vendor.force_id = "wh_shared"
    (sa, ba, _), (sb, bb, _) = await asyncio.gather(create(a), create(b))
    assert sorted([sa, sb]) == [201, 502]
    loser = bb if sb == 502 else ba
    assert loser["error"] == "resource_record_failed" and loser["cleanup"] == "left_in_place"
    assert [ex.method for ex in up.exchanges] == ["POST", "POST"]  # no cleanup delete of the winner's object
    owners = [gw for gw in (a, b) if await listed(gw)]
    assert len(owners) == 1 and [r["id"] for r in await listed(owners[0])] == ["wh_shared"]
    assert sorted([(await balance(a))[0], (await balance(b))[0]]) == [95_000, 100_000]
    for gw in (a, b):
        assert (await balance(gw))[1] == 0
        await assert_holds_closed(gw, [5000] if gw is owners[0] else [])


async def test_a_reused_id_of_a_deleted_object_belongs_to_its_new_creator(two):
    a, b, vendor, up = two
    await create(a)
    assert (await a.call("DELETE", delete("wh_1"))).status == 204
    vendor.force_id = "wh_1"  # the vendor hands the freed id to B's new webhook
    status, body, _ = await create(b)
    assert status == 201 and body["data"]["id"] == "wh_1"
    assert [(r["id"], r["state"]) for r in await listed(b)] == [("wh_1", "active")]
    assert await listed(a) == []
    sent = len(up.exchanges)
    r = await a.call("DELETE", delete("wh_1"))  # A's old tombstone no longer authorizes a delete
    assert r.status == 403 and len(up.exchanges) == sent and "wh_1" in vendor.objects


async def test_a_cleanup_the_vendor_refuses_is_reported(two, caplog):
    a, b, vendor, up = two
    await _inject_record_fault(a.services, "wh_1")
    vendor.delete_status = 503
    status, body, headers = await create(a)
    assert status == 502 and body["cleanup"] == "delete_failed" and "wh_1" not in json.dumps(body)
    assert up.last.method == "DELETE" and "wh_1" in vendor.objects
    assert any(r.levelname == "ERROR" and "delete_failed" in r.getMessage() for r in caplog.records)
    assert await balance(a) == (100_000, 0)
    await assert_holds_closed(a, [])
