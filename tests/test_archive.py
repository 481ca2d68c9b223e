"""Result classifiers and the archive over real HTTP hops (docs/lifecycle.md "Result classifiers and the archive"): a fake vendor on
127.0.0.1 counts what it is asked, so a hit is proven to reach nobody; money to the micro-dollar and
every hold closed once; the classifier comes from a plugin file in TREG_PLUGINS_DIR."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from treg import membership, money
from treg.infra.schema import archive_entries, holds
from treg.keys import SERVICES
from treg.settings import SecretStr
from treg.testing import Events, Gateway, ProviderPlugin, open_org, raw_upstream
from treg.testing.vendors.archive import (PLATFORM_KEY, PRICE, PeopleVendor, people_app, people_provider,
                                          write_classifier_plugin)

GRANT = 100_000


@pytest.fixture
async def world(aiohttp_client, make_app, tmp_path):
    """(gateway of org ``acme``, gateway of org ``beta``, vendor, upstream, events)."""
    vendor = PeopleVendor()
    events = Events()
    async with raw_upstream(vendor) as up:
        app = people_app(make_app, up, tmp_path / "plugins", events,
                         platform={"TREG_PLATFORM_KEY_PEOPLE": SecretStr(PLATFORM_KEY)})
        client = await aiohttp_client(app)
        gws = [await open_org(client, slug, f"o@{slug}.test", credits=GRANT) for slug in ("acme", "beta")]
        yield gws[0], gws[1], vendor, up, events
        await client.close()


async def _get(gw, endpoint, q, **headers):
    r = await gw.call("GET", f"/catalog/call/{endpoint}?q={q}", headers=headers)
    return r, await r.read()


async def _detail(gw, r):
    return await gw.api("GET", f"/api/v1/calls/{r.headers['X-Treg-Call-Id']}", expect=200)


async def _holds(gw):
    async with gw.services.db.tx() as tx:
        return await tx.fetch_all(select(holds.c.state, holds.c.amount_micro, holds.c.settled_micro)
                                  .where(holds.c.org_id == gw.org["org_id"]).order_by(holds.c.created_at))


async def _balance(gw):
    return (await money.balance(gw.services, gw.org["org_id"]))


async def test_a_hit_answers_without_the_vendor_at_the_full_price(world):
    acme, _, vendor, up, events = world
    r1, b1 = await _get(acme, "people.find", "ada")
    assert r1.status == 200 and r1.headers["X-Treg-Cache"] == "stored" and r1.headers["X-Treg-Cost-Micro"] == "2000"
    assert "X-Treg-Cache-Age" not in r1.headers
    r2, b2 = await _get(acme, "people.find", "ada")
    assert vendor.hits["ada"] == 1 and len(up.exchanges) == 1  # the vendor saw nothing of the second call
    assert r2.status == 200 and r2.headers["X-Treg-Cache"] == "hit" and int(r2.headers["X-Treg-Cache-Age"]) >= 0
    assert b2 == b1 and r2.headers["Content-Type"] == "application/json"
    assert r2.headers["X-Treg-Cost-Micro"] == str(PRICE) and r2.headers["X-Treg-Credential-Tier"] == "platform"
    assert "X-Vendor" not in r2.headers  # the stored status, body and content type, not the vendor's headers
    d1, d2 = await _detail(acme, r1), await _detail(acme, r2)
    assert (d1["result_state"], d1["cache_state"], d1["cost_micro"]) == ("hit", "stored", PRICE)
    assert (d2["result_state"], d2["cache_state"], d2["cost_micro"], d2["hold_state"]) == ("hit", "hit", PRICE,
                                                                                         "settled")
    assert await _holds(acme) == [{"state": "settled", "amount_micro": PRICE, "settled_micro": PRICE}] * 2
    bal = await _balance(acme)
    assert bal.balance_micro == GRANT - 2 * PRICE and bal.held_micro == 0
    states = [(e["result_state"], e["cache_state"]) for e in events.tool_called]
    assert states == [("hit", "stored"), ("hit", "hit")]
    assert all(PLATFORM_KEY not in repr(e) for e in events.tool_called)


@pytest.mark.parametrize("endpoint,hit_price", [("people.find", PRICE), ("people.find_repeat", 500),
                                                ("people.find_free", 0)])
async def test_each_cache_price_to_the_micro_dollar(world, endpoint, hit_price):
    acme, _, vendor, _, _ = world
    r1, _ = await _get(acme, endpoint, "bob")
    costs = [int(r1.headers["X-Treg-Cost-Micro"])]
    for _ in range(3):
        r, _ = await _get(acme, endpoint, "bob")
        assert r.headers["X-Treg-Cache"] == "hit"
        costs.append(int(r.headers["X-Treg-Cost-Micro"]))
    assert vendor.hits["bob"] == 1
    assert costs == [PRICE, hit_price, hit_price, hit_price]
    rows = await _holds(acme)
    # every hold placed as usual (the full estimate) and closed once, settled at what the caller was told
    assert [r["state"] for r in rows] == ["settled"] * 4 and [r["amount_micro"] for r in rows] == [PRICE] * 4
    assert [r["settled_micro"] for r in rows] == costs
    bal = await _balance(acme)
    assert bal.balance_micro == GRANT - sum(costs) and bal.held_micro == 0 and bal.settled_micro == sum(costs)


async def test_scope_org_keeps_orgs_apart_and_global_shares(world):
    acme, beta, vendor, _, _ = world
    await _get(acme, "people.find", "cy")
    r, _ = await _get(beta, "people.find", "cy")
    assert r.headers["X-Treg-Cache"] == "stored" and vendor.hits["cy"] == 2  # another org: the vendor again
    vendor.hits.clear()
    await _get(acme, "people.public", "dee")
    r, body = await _get(beta, "people.public", "dee")
    assert r.headers["X-Treg-Cache"] == "hit" and vendor.hits["dee"] == 1
    assert r.headers["X-Treg-Cost-Micro"] == str(PRICE)  # beta pays for its own hit
    assert (await _balance(beta)).balance_micro == GRANT - 2 * PRICE
    async with acme.services.db.tx() as tx:
        orgs = {(row["endpoint"], row["org_id"]) for row in await tx.fetch_all(
            select(archive_entries.c.endpoint, archive_entries.c.org_id))}
    assert orgs == {("people.find", acme.org["org_id"]), ("people.find", beta.org["org_id"]),
                    ("people.public", None)}


async def test_refresh_stores_the_fresh_answer_and_bypass_does_neither(world):
    acme, _, vendor, up, _ = world
    _, first = await _get(acme, "people.find", "eve")
    r, fresh = await _get(acme, "people.find", "eve", **{"X-Treg-Cache": "refresh"})
    assert r.headers["X-Treg-Cache"] == "stored" and vendor.hits["eve"] == 2 and fresh != first
    assert up.last.header("X-Treg-Cache") is None  # treg's control header never reaches the vendor
    r, again = await _get(acme, "people.find", "eve")
    assert r.headers["X-Treg-Cache"] == "hit" and again == fresh
    r, _ = await _get(acme, "people.find", "eve", **{"X-Treg-Cache": "bypass"})
    assert r.headers["X-Treg-Cache"] == "miss" and vendor.hits["eve"] == 3
    r, _ = await _get(acme, "people.find", "fay", **{"X-Treg-Cache": "BYPASS"})
    assert r.headers["X-Treg-Cache"] == "miss"
    r, _ = await _get(acme, "people.find", "fay")
    assert r.headers["X-Treg-Cache"] == "stored" and vendor.hits["fay"] == 2  # the bypass stored nothing
    assert up.last.header("X-Treg-Cache") is None
    assert all(h["state"] == "settled" for h in await _holds(acme))


async def test_an_unknown_cache_control_is_refused_and_its_hold_released(world):
    acme, _, vendor, _, _ = world
    r, body = await _get(acme, "people.find", "gus", **{"X-Treg-Cache": "forever"})
    assert r.status == 400 and r.headers["X-Treg-Error"] == "1"
    assert __import__("json").loads(body)["error"] == "invalid_cache_control" and vendor.n == 0
    assert [h["state"] for h in await _holds(acme)] == ["released"]
    assert (await _balance(acme)).balance_micro == GRANT


async def test_unknown_is_never_stored_and_misses_only_when_admitted(world):
    acme, _, vendor, _, _ = world
    for q in ("weird", "text"):
        for _ in range(2):
            r, _ = await _get(acme, "people.find", q)
            assert r.headers["X-Treg-Cache"] == "miss"
        assert vendor.hits[q] == 2
        assert (await _detail(acme, r))["result_state"] == "unknown"
    r, _ = await _get(acme, "people.find", "nobody")
    r, _ = await _get(acme, "people.find", "nobody")
    assert r.headers["X-Treg-Cache"] == "miss" and (await _detail(acme, r))["result_state"] == "miss"
    assert vendor.hits["nobody"] == 2
    r, _ = await _get(acme, "people.admit", "nobody")
    assert r.headers["X-Treg-Cache"] == "stored"
    r, body = await _get(acme, "people.admit", "nobody")
    assert r.headers["X-Treg-Cache"] == "hit" and body == b'{"data": {"emails": []}}' and vendor.hits["nobody"] == 3
    r, _ = await _get(acme, "people.find", "fail")
    assert r.status == 503 and r.headers["X-Treg-Cache"] == "miss"
    assert (await _detail(acme, r))["result_state"] is None  # a failure is not classified
    async with acme.services.db.tx() as tx:
        assert await tx.scalar("SELECT count(*) FROM archive_entries") == 1


async def test_a_classified_endpoint_without_archive_gets_result_state_and_unchanged_bytes(world):
    acme, _, vendor, up, events = world
    r, body = await _get(acme, "people.classified", "hal")
    assert "X-Treg-Cache" not in r.headers and r.headers["X-Vendor"] == "people"
    assert body == __import__("json").dumps({"data": {"emails": ["hal@example.com"]}, "n": 1, "body": ""}).encode()
    assert (await _detail(acme, r))["result_state"] == "hit"
    r, _ = await _get(acme, "people.classified", "nobody")
    assert (await _detail(acme, r))["result_state"] == "miss"
    r, _ = await _get(acme, "people.plain", "hal")  # no classifier, no archive: neither
    d = await _detail(acme, r)
    assert d["result_state"] is None and d["cache_state"] is None and "X-Treg-Cache" not in r.headers
    assert [e["result_state"] for e in events.tool_called] == ["hit", "miss", None]


async def test_expired_entries_are_not_served_and_are_pruned(world):
    from treg.archive import store

    acme, _, vendor, _, _ = world
    await _get(acme, "people.find", "ivy")
    async with acme.services.db.tx() as tx:
        await tx.execute("UPDATE archive_entries SET expires_at = now() - interval '1 second'")
    r, _ = await _get(acme, "people.find", "ivy")
    assert r.headers["X-Treg-Cache"] == "stored" and vendor.hits["ivy"] == 2  # expired: the vendor again
    async with acme.services.db.tx() as tx:
        await tx.execute("UPDATE archive_entries SET expires_at = now() - interval '1 second'")
    await _get(acme, "people.find_repeat", "jo")  # a live entry the prune must keep
    assert await store.prune(acme.services) == 1
    async with acme.services.db.tx() as tx:
        assert [r["endpoint"] for r in await tx.fetch_all(select(archive_entries.c.endpoint))] == [
            "people.find_repeat"]
    assert await store.prune(acme.services, batch=1, max_batches=1) == 0


async def test_prune_is_bounded_per_run(world):
    from treg.archive import store

    acme, _, _, _, _ = world
    for q in ("a1", "a2", "a3"):
        await _get(acme, "people.find", q)
    async with acme.services.db.tx() as tx:
        await tx.execute("UPDATE archive_entries SET expires_at = now() - interval '1 second'")
    assert await store.prune(acme.services, batch=1, max_batches=2) == 2
    assert await store.prune(acme.services, batch=1, max_batches=2) == 1


async def test_the_key_holds_no_credential(world):
    acme, _, vendor, up, _ = world
    await _get(acme, "people.find", "kim")
    assert PLATFORM_KEY in up.last.target  # the vendor got treg's key in the query ...
    # ... a caller's own api_key is overwritten before the vendor sees it: not part of the key either
    r, _ = await _get(acme, "people.find", "kim&api_key=callers-guess")
    assert r.headers["X-Treg-Cache"] == "hit" and vendor.hits["kim"] == 1
    async with acme.services.db.tx() as tx:
        rows = await tx.fetch_all(select(archive_entries))
    assert len(rows) == 1
    stored = repr({k: (bytes(v) if isinstance(v, memoryview) else v) for k, v in rows[0].items()})
    assert PLATFORM_KEY not in stored and "callers-guess" not in stored


def test_key_material_leaves_out_binding_targets():
    from treg.catalog.archive_policy import CredentialRef, archive_key, key_material
    from treg.bindings import Binding

    binds = (Binding("query", "api_key", platform_setting="TREG_PLATFORM_KEY_PEOPLE"), Binding("json", "token"))
    base = dict(endpoint_id="people.find", method="POST", org_id="org_1", bindings=binds,
                credential=CredentialRef.of("platform"))
    a = key_material(query=[("q", "x"), ("b", "2")], body=b'{"name": "n", "token": "tok-secret"}', **base)
    b = key_material(query=[("b", "2"), ("api%5Fkey", "qk-secret"), ("q", "x")], body=b'{"token": "t2", "name": "n"}',
                     **base)
    assert a == b and b"secret" not in a and b"qk-" not in b
    assert archive_key(a) == archive_key(b) and len(archive_key(a)) == 64
    other = key_material(query=[("q", "y"), ("b", "2")], body=b'{"name": "n"}', **base)
    assert archive_key(other) != archive_key(a)
    other_org = key_material(query=[("q", "x"), ("b", "2")], body=b'{"name": "n"}',
                             **{**base, "org_id": "org_2"})
    assert archive_key(other_org) != archive_key(a)
    # without a JSON binding the body's bytes are hashed as sent
    plain = dict(endpoint_id="people.find", method="POST", org_id=None, credential=CredentialRef.of("platform"))
    assert key_material(query=[], body=b'{"a":1}', **plain) != key_material(query=[], body=b'{"a": 1}', **plain)


async def test_a_post_body_is_part_of_the_key(world):
    acme, _, vendor, up, _ = world

    async def post(body):
        r = await acme.call("POST", "/catalog/call/people.lookup", data=body,
                            headers={"Content-Type": "application/json"})
        return r, await r.read()

    r1, b1 = await post(b'{"name": "lee"}')
    r2, b2 = await post(b'{"name": "lee"}')
    r3, _ = await post(b'{"name": "max"}')
    assert [r.headers["X-Treg-Cache"] for r in (r1, r2, r3)] == ["stored", "hit", "stored"]
    assert len(up.exchanges) == 2 and up.exchanges[0].body == b'{"name": "lee"}' and b1 == b2


async def test_a_hit_with_an_idempotency_key_replays_without_a_second_charge(world):
    acme, _, vendor, _, _ = world
    await _get(acme, "people.find_repeat", "ned")
    r1, b1 = await _get(acme, "people.find_repeat", "ned", **{"Idempotency-Key": "k-1"})
    r2, b2 = await _get(acme, "people.find_repeat", "ned", **{"Idempotency-Key": "k-1"})
    assert r1.headers["X-Treg-Cache"] == "hit" and r1.headers["X-Treg-Cost-Micro"] == "500"
    assert r2.headers["X-Treg-Idempotent-Replay"] == "true" and b2 == b1 and "X-Treg-Cache" not in r2.headers
    assert vendor.hits["ned"] == 1
    assert [h["settled_micro"] for h in await _holds(acme)] == [PRICE, 500]


async def test_rollout_zero_leaves_every_call_on_the_normal_path(aiohttp_client, make_app, tmp_path):
    vendor = PeopleVendor()
    async with raw_upstream(vendor) as up:
        app = make_app(extra_plugins=(ProviderPlugin([people_provider(up.url)]),), archive_rollout_pct=0,
                       plugins_dir=write_classifier_plugin(tmp_path / "plugins"), ssrf_allow=("127.0.0.0/8",),
                       platform={"TREG_PLATFORM_KEY_PEOPLE": SecretStr(PLATFORM_KEY)})
        client = await aiohttp_client(app)
        org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
        await money.grant(client.app[SERVICES], org_id=org["org_id"], amount_micro=GRANT, actor="test")
        gw = Gateway(client, org)
        for _ in range(2):
            r, _ = await _get(gw, "people.find", "ole")
            assert r.status == 200 and "X-Treg-Cache" not in r.headers
            d = await _detail(gw, r)
            assert d["cache_state"] is None and d["result_state"] == "hit"  # classification is not rolled out
        assert vendor.hits["ole"] == 2
        await client.close()


def test_the_rollout_is_a_stable_hash_share():
    from treg.catalog.archive_policy import in_rollout

    pairs = [(f"org_{i}", f"people.ep{i % 7}") for i in range(2000)]
    picked = [p for p in pairs if in_rollout(*p, 30)]
    assert 0.25 < len(picked) / len(pairs) < 0.35
    assert picked == [p for p in pairs if in_rollout(*p, 30)]  # the same pairs every time
    assert set(picked) <= {p for p in pairs if in_rollout(*p, 60)}  # a wider rollout keeps them in
    assert all(in_rollout(*p, 100) for p in pairs[:50]) and not any(in_rollout(*p, 0) for p in pairs[:50])


async def test_the_event_says_why_the_classifier_and_the_archive_decided(world):
    """``tool_called`` carries the classifier's reason and the archive's admission decision (issue 20
    item 13; the seed's result_reason and cache_admission), beside result_state and cache_state."""
    acme, _, _, _, events = world
    calls = [("people.find", "ivy", {}), ("people.find", "ivy", {}), ("people.find", "nobody", {}),
             ("people.admit", "nobody", {}), ("people.find", "weird", {}), ("people.find", "text", {}),
             ("people.find", "jo", {"X-Treg-Cache": "bypass"}), ("people.find", "fail", {}),
             ("people.classified", "hal", {}), ("people.plain", "hal", {}),
             ("people.find", "gzip", {"Accept-Encoding": "gzip"})]
    for endpoint, q, headers in calls:
        await _get(acme, endpoint, q, **headers)
    got = [(e["result_state"], e["result_reason"], e["cache_state"], e["cache_admission"]) for e in events.tool_called]
    assert got == [
        ("hit", "hit_rule", "stored", "admitted"),
        ("hit", "hit_rule", "hit", None),  # a hit: classified from the stored body, nothing to admit
        ("miss", "miss_rule", "miss", "result_miss"),
        ("miss", "miss_rule", "stored", "admitted"),  # admit_misses
        ("unknown", "no_rule_held", "miss", "result_unknown"),
        ("unknown", "not_json", "miss", "result_unknown"),
        ("hit", "hit_rule", "miss", "bypass"),
        (None, None, "miss", "not_2xx"),
        ("hit", "hit_rule", None, None),  # classified, not archived
        (None, None, None, None),
        ("hit", "hit_rule", "miss", "encoded"),  # relayed as the vendor sent it, never stored compressed
    ]
