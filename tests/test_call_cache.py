"""In-process caches stay correct when ANOTHER treg process on the same database changes the data."""

import asyncio

from treg import membership, org_changes
from treg.infra.crypto import SecretBox
from treg.keys import SERVICES
from treg.testing import Gateway, raw_upstream


async def _two_processes(aiohttp_client, make_app):
    a = await aiohttp_client(make_app(ssrf_allow=("127.0.0.0/8",)))
    b = await aiohttp_client(make_app(ssrf_allow=("127.0.0.0/8",)))
    org = await membership.create_org(a.app[SERVICES], slug="acme", email="o@acme.test")
    return Gateway(a, org), Gateway(b, org)


async def _eventually(fn, expect, tries=100):
    for _ in range(tries):
        got = await fn()
        if got == expect:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"expected {expect}, last got {got}")


async def test_changes_in_one_process_reach_the_other(aiohttp_client, make_app):
    ga, gb = await _two_processes(aiohttp_client, make_app)
    async with raw_upstream() as up:
        s1 = await ga.secret("first-secret-1")
        tool = await ga.tool("t", up.url, [{"location": "header", "name": "X-K", "secret_id": s1}])

        async def b_key():
            r = await gb.call("GET", "/call/t/x")
            return up.last.header("X-K") if r.status == 200 else r.status

        await _eventually(b_key, "first-secret-1")
        assert gb.services.caches.tools.hits >= 0
        # warm B's caches, then change the binding through A
        await b_key()
        s2 = await ga.secret("second-secret-2", name="k2")
        await ga.api("PATCH", f"/api/v1/tools/{tool['id']}", expect=200,
                     json={"bindings": [{"location": "header", "name": "X-K", "secret_id": s2}]})
        await _eventually(b_key, "second-secret-2")
        # revoking a token in A stops it in B
        m = await ga.member("m@acme.test")
        assert (await gb.call("GET", "/call/t/x", as_=m["headers"])).status == 200
        tokens = await ga.api("GET", "/api/v1/tokens", expect=200)
        tok = next(t for t in tokens["tokens"] if t["member_id"] == m["member_id"])
        await ga.api("DELETE", f"/api/v1/tokens/{tok['id']}", expect=204)

        async def member_status():
            return (await gb.call("GET", "/call/t/x", as_=m["headers"])).status

        await _eventually(member_status, 401)
    await ga.client.close()
    await gb.client.close()


async def test_caches_are_hit_in_steady_state(gateway):
    async with raw_upstream() as up:
        sid = await gateway.secret("k-123456")
        await gateway.tool("t", up.url, [{"location": "header", "name": "X-K", "secret_id": sid}])
        # the setup's own change notifications may still arrive during the first calls (their loads are
        # then not stored); after that every call is a hit
        for _ in range(10):
            assert (await gateway.call("GET", "/call/t/x")).status == 200
        caches = gateway.services.caches
        for cache in (caches.identity, caches.tools, caches.secrets):
            assert cache.hits >= 6, (cache.name, cache.hits, cache.misses)


async def test_lost_listener_bypasses_caches(gateway):
    async with raw_upstream() as up:
        await gateway.tool("t", up.url + "/one")
        assert (await gateway.call("GET", "/call/t/x")).status == 200
        svc = gateway.services
        async with svc.db.tx() as tx:
            await tx.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                             "WHERE query LIKE 'LISTEN%%' AND datname = current_database()")
        await _eventually(lambda: _enabled(svc), False)
        # a change made without any NOTIFY is still seen: the caches are bypassed while deaf
        async with svc.db.tx() as tx:
            await tx.execute("UPDATE tools SET base_url = %(u)s", {"u": up.url + "/two"})
        assert (await gateway.call("GET", "/call/t/x")).status == 200
        assert up.last.target == "/two/x"
        await _eventually(lambda: _enabled(svc), True)  # and the listener comes back


async def _enabled(svc):
    return svc.caches.tools.enabled


def test_a_cache_switched_off_holds_nothing_so_a_lookup_misses():
    """``get`` does not ask whether the cache is on: switching it off empties it, and nothing is stored until
    it is on again (a value kept from before a lost listener would be served stale)."""
    from treg.cache import OrgCache

    cache = OrgCache("t", ttl_s=30)
    cache.enabled = True
    cache.put("k", "v", org_id="org")
    assert cache.get("k") == "v"
    cache.enabled = False
    assert cache.get("k") is None
    cache.put("k", "v2", org_id="org")
    cache.enabled = True
    assert cache.get("k") is None


async def test_a_load_racing_a_change_is_not_cached_and_misses_share_one_load():
    from treg.cache import OrgCache

    cache = OrgCache("t", ttl_s=30)
    cache.enabled = True
    loads = 0
    gate = asyncio.Event()

    async def slow_load():
        nonlocal loads
        loads += 1
        await gate.wait()
        return f"v{loads}"

    first = asyncio.create_task(cache.get_or_load("k", "org", slow_load))
    others = [asyncio.create_task(cache.get_or_load("k", "org", slow_load)) for _ in range(10)]
    await asyncio.sleep(0)
    cache.drop_org("org")  # a change arrives while the old data is being read
    gate.set()
    results = await asyncio.gather(first, *others)
    assert loads == 1 and set(results) == {"v1"}  # single flight
    assert cache.get("k") is None  # the raced load was not stored
    assert await cache.get_or_load("k", "org", slow_load) == "v2" and cache.get("k") == "v2"


async def test_memoized_plaintext_goes_with_its_row(aiohttp_client, make_app):
    """B keeps the decrypted value beside its cached rows. When the stored row changes (here: its
    blob re-encrypted under a key B does not have, as a key rotation in another process would leave
    it), the change notification drops both, so B fails closed instead of injecting what it remembered."""
    ga, gb = await _two_processes(aiohttp_client, make_app)
    async with raw_upstream() as up:
        sid = await ga.secret("remembered-secret-1")
        await ga.tool("t", up.url, [{"location": "header", "name": "X-K", "secret_id": sid}])

        async def b_call():
            r = await gb.call("GET", "/call/t/x")
            return up.last.header("X-K") if r.status == 200 else (r.status, (await r.json())["error"])

        await _eventually(b_call, "remembered-secret-1")
        assert await b_call() == "remembered-secret-1"  # warm: injected from B's memo
        foreign = SecretBox(b"F" * 32).encrypt(b"remembered-secret-1", org_id=ga.org["org_id"], secret_id=sid)
        async with ga.services.db.tx() as tx:
            await tx.execute("UPDATE secrets SET blob = %(b)s WHERE id = %(id)s", {"b": foreign, "id": sid})
            await org_changes.notify(tx, "secrets", ga.org["org_id"])
        await _eventually(b_call, (502, "secret_undecryptable"))
    await ga.client.close()
    await gb.client.close()
