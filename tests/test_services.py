"""Services are typed components built by one factory; management writes go through one helper.

(issue 10, item 2: no ``extras`` dict, null objects where a component is off, ``org_changes.changes``.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import typing
from pathlib import Path

import aiohttp
import aiopg
import pytest

from treg import authentication, context, membership, org_changes
from treg.cache import CHANNEL, Caches, ChangeListener, NullCache, OrgCache
from treg.call.audit import AuditWriter
from treg.call_record import CallRecord
from treg.redaction import RedactorMemo
from treg.spool_budget import SpoolBudget
from treg.context import AuditSink, NullAuditWriter, Services
from treg.errors import GatewayFailed, NotFound
from treg.infra.dns import NullResolver, VettingResolver
from treg.infra.upstream import NotServing
from treg.metrics import Metrics


def test_services_has_no_extras_and_every_component_is_typed():
    names = [f.name for f in dataclasses.fields(Services)]
    assert "extras" not in names
    hints = typing.get_type_hints(Services, globalns=vars(context),
                                  localns={"CallRecord": CallRecord, "aiohttp": aiohttp})
    assert set(hints) == set(names)
    assert all(hint is not typing.Any for hint in hints.values()), hints
    assert hints["caches"] is Caches and hints["audit"] is AuditSink
    assert hints["spool_budget"] is SpoolBudget and hints["platform_redactors"] is RedactorMemo
    assert all(typing.get_type_hints(Caches)[f.name] == OrgCache[typing.Any] for f in dataclasses.fields(Caches))


def test_no_component_of_services_is_optional():
    """Every field is always set: a component a process may run without is a null object, never None."""
    hints = typing.get_type_hints(Services, globalns=vars(context),
                                  localns={"CallRecord": CallRecord, "aiohttp": aiohttp})
    optional = [name for name, hint in hints.items() if type(None) in typing.get_args(hint) or hint is type(None)]
    assert optional == []
    assert hints["client"] == hints["aggregator_client"] == aiohttp.ClientSession | NotServing
    assert hints["resolver"] == VettingResolver | NullResolver and hints["metrics"] is Metrics


def test_no_use_site_asks_whether_a_component_of_services_is_there():
    root = Path(context.__file__).resolve().parent
    fields = "|".join(f.name for f in dataclasses.fields(Services))
    asks = re.compile(rf"\b(svc|services)\.({fields}) (is|is not|==|!=) None\b")
    found = [f"{path.relative_to(root.parent)}:{n}" for path in sorted(root.rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if asks.search(line)]
    assert found == []


async def test_services_built_for_domain_use_have_null_components(svc):
    """The tests' services (and the CLI's: the same factory) run no listener and no writer."""
    assert all(isinstance(cache, NullCache) for cache in svc.caches)
    assert isinstance(svc.audit, NullAuditWriter) and not svc.audit.batches_token_touch
    assert isinstance(svc.platform_redactors, RedactorMemo) and isinstance(svc.spool_budget, SpoolBudget)
    assert isinstance(svc.metrics, Metrics)
    # nothing upstream: both sessions and the resolver refuse to send or dial, naming why
    assert isinstance(svc.client, NotServing) and isinstance(svc.aggregator_client, NotServing)
    assert isinstance(svc.resolver, NullResolver)
    for refuse in (lambda: svc.client.request("GET", "https://api.example.com/"),
                   lambda: svc.aggregator_client.request("POST", "https://relay.example/v1/run")):
        with pytest.raises(GatewayFailed) as info:
            refuse()
        assert info.value.code == "shutting_down" and info.value.status == 502
    with pytest.raises(GatewayFailed) as info:
        await svc.resolver.vet("api.example.com")
    assert info.value.code == "shutting_down"
    assert await svc.resolver.addresses("api.example.com") == []  # registration leaves it to the call-time guard
    org = await membership.create_org(svc, slug="acme", email="o@acme.test")
    # no batching writer: authenticate notes the token's use at once, and nothing is cached
    ident = await authentication.authenticate(svc, org["token"], None)
    async with svc.db.tx() as tx:
        used = await tx.scalar("SELECT last_used_at FROM tokens WHERE id = %(id)s", {"id": ident.token_id})
    assert used is not None
    assert authentication.cached_identity(svc, org["token"], None) is None


async def test_a_serving_gateway_has_live_components(gateway):
    svc = gateway.services
    assert all(type(cache) is OrgCache and cache.enabled for cache in svc.caches)
    assert isinstance(svc.audit, AuditWriter) and svc.audit.batches_token_touch
    assert isinstance(svc.client, aiohttp.ClientSession) and isinstance(svc.aggregator_client, aiohttp.ClientSession)
    assert isinstance(svc.resolver, VettingResolver) and isinstance(svc.metrics, Metrics)
    await gateway.client.close()
    # stopped: the null objects are back, so a late send is refused instead of meeting a closed session
    assert isinstance(svc.client, NotServing) and isinstance(svc.aggregator_client, NotServing)
    assert isinstance(svc.resolver, NullResolver) and isinstance(svc.audit, NullAuditWriter)


def test_connection_watchers_hear_each_change_once_and_a_failing_one_is_contained(caplog):
    listener = ChangeListener("postgresql://unused", [])
    heard: list[bool] = []

    def broken(up: bool) -> None:
        raise RuntimeError("watcher bug")

    listener.watch_connection(broken)
    listener.watch_connection(heard.append)
    assert heard == [False]  # told the state it is in at once
    for up in (True, True, False, False, True):
        listener._connection(up)
    assert heard == [False, True, False, True]
    assert listener.connected.is_set()
    assert caplog.text.count("a connection watcher failed") == 4


async def test_null_cache_always_misses_and_always_loads():
    cache: NullCache[str] = NullCache("t")
    ChangeListener("postgresql://unused", [cache])._set_enabled(True)  # a listener cannot switch it on
    assert not cache.enabled
    cache.put("k", "v", org_id="org")
    assert cache.get("k") is None
    loads = []

    async def load() -> str:
        loads.append(1)
        return "v"

    assert [await cache.get_or_load("k", "org", load) for _ in range(3)] == ["v"] * 3 and len(loads) == 3
    cache.drop_org("org")
    cache.clear()


def _detached_caches() -> Caches:
    """Live caches no listener feeds: only the write helper's local forget can drop their entries."""
    caches = Caches.live(30.0)
    for cache in caches:
        cache.enabled = True
    return caches


async def _listen(dsn: str) -> aiopg.Connection:
    conn = await aiopg.connect(dsn)
    async with conn.cursor() as cur:
        await cur.execute(f"LISTEN {CHANNEL}")
    return conn


async def test_changes_notifies_on_commit_and_forgets_local_entries_after_it(gateway):
    svc, org_id = gateway.services, gateway.org["org_id"]
    svc.caches = caches = _detached_caches()
    conn = await _listen(svc.db.dsn)
    try:
        for cache in caches:
            cache.put(("probe", org_id), "old", org_id=org_id)
        caches.tools.put(("probe", "org_other"), "other", org_id="org_other")
        async with org_changes.changes(svc, "tools", org_id) as tx:
            await tx.execute("SELECT 1")
            # not before the commit: a call could load the old rows back into the cache meanwhile
            assert all(cache.get(("probe", org_id)) == "old" for cache in caches)
        # at once after it (no waiting for this process's own notification), and only this org's
        assert all(cache.get(("probe", org_id)) is None for cache in caches)
        assert caches.tools.get(("probe", "org_other")) == "other"
        msg = await asyncio.wait_for(conn.notifies.get(), 5)
        assert msg.payload == f"tools:{org_id}"
    finally:
        conn.close()


async def test_changes_rolled_back_notifies_nobody_and_forgets_nothing(gateway):
    svc, org_id = gateway.services, gateway.org["org_id"]
    svc.caches = caches = _detached_caches()
    conn = await _listen(svc.db.dsn)
    try:
        caches.deny.put(("probe", org_id), "kept", org_id=org_id)
        with pytest.raises(NotFound):
            async with org_changes.changes(svc, "deny", org_id) as tx:
                await tx.execute("UPDATE orgs SET slug = slug WHERE id = %(id)s", {"id": org_id})
                raise NotFound("no such deny rule in this org", code="deny_rule_not_found")
        assert caches.deny.get(("probe", org_id)) == "kept"
        # the next committed change is the first notification to arrive: the rolled-back one never went out
        async with org_changes.changes(svc, "tokens", org_id):
            pass
        msg = await asyncio.wait_for(conn.notifies.get(), 5)
        assert msg.payload == f"tokens:{org_id}"
        assert conn.notifies.empty()
    finally:
        conn.close()
