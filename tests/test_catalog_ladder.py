"""The credential ladder against the real database: secrets and tools made through the management API."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest

import treg
from treg import authentication, membership, org_changes, org_data
from treg.catalog import enforce, ladder
from treg.catalog.errors import NoCredential
from treg.infra.db import Tx
from treg.keys import SERVICES
from treg.settings import SecretStr


class AcmeProviders:
    """A test provider plugin (the same shape a third party writes)."""

    @treg.hookimpl
    def treg_register_providers(self):
        return [{
            "id": "acme",
            "base_url": "https://api.acme.example/v1",
            "auth": [{"location": "header", "name": "Authorization", "format": "Bearer {secret}"}],
            "required_headers": {"X-Api-Version": "2025-11-01"},
            "endpoints": [
                {"id": "acme.items.get", "method": "GET", "path": "/items/{item_id}",
                 "params": [{"name": "item_id", "in": "path"}], "price": {"per_call_micro": 2000},
                 "capability": "items.lookup"},
                {"id": "acme.ping", "method": "GET", "path": "/ping", "params": [], "price": {"per_call_micro": 0},
                 "platform_auth": "anonymous"},
            ],
        }, {
            "id": "zeta",
            "base_url": "https://zeta.example",
            "auth": [{"location": "query", "name": "key"}],
            "endpoints": [{"id": "zeta.items", "method": "GET", "path": "/i", "params": [],
                           "price": {"per_call_micro": 500}, "capability": "items.lookup"}],
        }]


@pytest.fixture
def build(make_app, aiohttp_client):
    async def start(**overrides: Any):
        client = await aiohttp_client(make_app(extra_plugins=(AcmeProviders(),), **overrides))
        svc = client.app[SERVICES]
        org = await membership.create_org(svc, slug="acme", email="owner@acme.test")
        org["headers"] = {"X-Treg-Token": org["token"]}
        org["ident"] = await authentication.authenticate(svc, org["token"], None)
        return client, svc, org
    return start


async def post(client, org, path: str, body: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post(path, json=body, headers=org["headers"])
    assert resp.status == 201, await resp.text()
    return await resp.json()


async def secret(client, org, name: str, provider: str | None = "acme") -> str:
    return (await post(client, org, "/api/v1/secrets", {"name": name, "value": f"value-{name}",
                                                         "provider": provider}))["id"]


async def tool(client, org, name: str, secret_id: str, **extra: Any) -> dict[str, Any]:
    return await post(client, org, "/api/v1/tools", {
        "name": name, "base_url": "https://api.acme.example/v1",
        "bindings": [{"location": "header", "name": "Authorization", "format": "token {secret}",
                      "secret_id": secret_id}], **extra})


async def target(svc, ident, endpoint_id: str = "acme.items.get", query=(("item_id", "7"),)):
    reg = svc.catalog
    ep = reg.get(endpoint_id)
    creds = await org_data.load_org_credentials(svc, ident, [ep.provider])
    checked = enforce.check_request(ep, method="GET", query=list(query))
    return ladder.plan_call(reg, ep, checked, creds, svc.settings)


async def test_no_credential_at_all(build):
    client, svc, org = await build()
    with pytest.raises(NoCredential) as info:
        await target(svc, org["ident"])
    body = info.value.body()
    assert body["error"] == "no_credential" and body["alternatives"] == [
        {"id": "zeta.items", "price_micro": 500, "tier": "team", "callable": False}]
    creds = await org_data.load_org_credentials(svc, org["ident"])
    assert dict(creds.own_tools) == {} and dict(creds.team_secrets) == {}


async def test_platform_tier_from_settings(build):
    client, svc, org = await build(platform={"TREG_PLATFORM_KEY_ACME": SecretStr("platform-key")})
    t = await target(svc, org["ident"])
    assert t.tier == "platform" and t.billed and t.hold_micro == 2000
    assert t.bindings[0].platform_setting == "TREG_PLATFORM_KEY_ACME" and t.bindings[0].secret_id is None
    assert t.upstream_url == "https://api.acme.example/v1/items/7"


async def test_anonymous_tier_needs_the_allow_list(build):
    client, svc, org = await build(anonymous_providers=("acme",),
                                   platform={"TREG_PLATFORM_KEY_ACME": SecretStr("platform-key")})
    t = await target(svc, org["ident"], "acme.ping", ())
    assert t.tier == "anonymous" and t.bindings == () and not t.billed  # free beats paid
    assert (await target(svc, org["ident"])).tier == "platform"          # not an anonymous row


async def test_team_tier_uses_the_newest_secret_of_the_provider(build):
    client, svc, org = await build(anonymous_providers=("acme",),
                                   platform={"TREG_PLATFORM_KEY_ACME": SecretStr("platform-key")})
    await secret(client, org, "old")
    newest = await secret(client, org, "new")
    await secret(client, org, "unrelated", provider="zeta")
    await secret(client, org, "plain", provider=None)
    t = await target(svc, org["ident"])
    assert t.tier == "team" and t.secret_id == newest and not t.billed and t.hold_micro == 0
    assert [b.secret_id for b in t.bindings] == [newest]
    assert t.bindings[0].format == "Bearer {secret}"  # the provider's auth
    assert (await target(svc, org["ident"], "acme.ping", ())).tier == "team"  # team beats anonymous


async def test_own_tier_wins_with_the_tools_bindings(build):
    client, svc, org = await build(platform={"TREG_PLATFORM_KEY_ACME": SecretStr("platform-key")})
    sid = await secret(client, org, "acme-key")
    await tool(client, org, "zz-acme", sid)
    first = await tool(client, org, "acme-api", sid)
    other = await secret(client, org, "other", provider=None)
    await tool(client, org, "not-acme", other)
    t = await target(svc, org["ident"])
    assert t.tier == "own" and t.tool_id == first["id"] and t.tool_name == "acme-api"
    assert t.bindings[0].format == "token {secret}" and t.bindings[0].secret_id == sid
    assert t.upstream_url == "https://api.acme.example/v1/items/7"   # the endpoint's URL, not the tool's
    assert t.required_headers == (("X-Api-Version", "2025-11-01"),)


async def test_own_tier_respects_the_tool_acl(build):
    client, svc, org = await build()
    sid = await secret(client, org, "acme-key")
    member = await post(client, org, "/api/v1/members", {"email": "m@acme.test", "role": "member"})
    await tool(client, org, "acme-api", sid, allowed_member_ids=[org["member_id"]])
    member_ident = await authentication.authenticate(svc, member["token"], None)
    assert (await target(svc, org["ident"])).tier == "own"
    t = await target(svc, member_ident)  # the member may not use the tool, but the team's credential is theirs
    assert t.tier == "team" and t.tool_id is None and t.secret_id == sid


async def test_another_orgs_credentials_never_count(build):
    client, svc, org = await build()
    other = await membership.create_org(svc, slug="other", email="o@other.test")
    other["headers"] = {"X-Treg-Token": other["token"]}
    sid = await secret(client, other, "theirs")
    await tool(client, other, "acme-api", sid)
    with pytest.raises(NoCredential):
        await target(svc, org["ident"])


async def test_load_org_credentials_filters_by_provider(build):
    client, svc, org = await build()
    a = await secret(client, org, "a")
    z = await secret(client, org, "z", provider="zeta")
    await tool(client, org, "acme-api", a)
    everything = await org_data.load_org_credentials(svc, org["ident"])
    assert dict(everything.team_secrets) == {"acme": a, "zeta": z}
    assert [t.name for t in everything.own_for("acme")] == ["acme-api"] and everything.own_for("zeta") == ()
    only = await org_data.load_org_credentials(svc, org["ident"], ["zeta"])
    assert dict(only.team_secrets) == {"zeta": z} and only.own_for("acme") == ()
    assert dict((await org_data.load_org_credentials(svc, org["ident"], [])).team_secrets) == {}


_READS_CREDENTIALS = re.compile(r"\b(?:FROM|JOIN)\s+(?:secrets|tools)\b", re.I)


@pytest.fixture
def credential_reads(monkeypatch) -> list[str]:
    """Every statement that reads the tools or secrets table, whoever issues it (a spy on the db adapter)."""
    seen: list[str] = []
    for name in ("execute", "fetch_all", "fetch_one", "scalar"):
        def spy(self, stmt, params=None, _original=getattr(Tx, name)):
            try:
                text = str(stmt)
            except Exception:  # a statement only PostgreSQL's dialect compiles
                text = repr(stmt)
            if _READS_CREDENTIALS.search(text):
                seen.append(text)
            return _original(self, stmt, params)
        monkeypatch.setattr(Tx, name, spy)
    return seen


async def _warm(read, credential_reads: list[str], tries: int = 25) -> None:
    """Read until a read costs no credential query (the setup's own notifications may drop the first loads)."""
    for _ in range(tries):
        credential_reads.clear()
        await read()
        if not credential_reads:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"every read queried the credentials: {credential_reads[:2]}")


async def test_a_warm_catalog_read_issues_no_credential_query_and_notify_invalidates_it(build, credential_reads):
    """The ladder reads the resolver's per-org caches: on a warm cache a catalog listing, a credential
    load and a catalog call read neither tools nor secrets, and a secret change another process makes
    (its NOTIFY) is what the next call sees."""
    client, svc, org = await build()
    sid = await secret(client, org, "first")

    async def tier() -> Any:
        resp = await client.get("/api/v1/catalog/endpoints", headers=org["headers"])
        assert resp.status == 200
        return {e["id"]: e["credential_tier"] for e in (await resp.json())["endpoints"]}["acme.items.get"]

    await _warm(tier, credential_reads)
    assert await tier() == "team" and credential_reads == []
    creds = await org_data.load_org_credentials(svc, org["ident"], ["acme"])
    assert creds.team_secret_for("acme") == sid and credential_reads == []
    # the call gets as far as dialling (the test host does not resolve): past the ladder and the relay
    resp = await client.get("/catalog/call/acme.items.get?item_id=7", headers=org["headers"])
    assert resp.status == 502 and (await resp.json())["error"] == "dns_failed"
    assert resp.headers["X-Treg-Credential-Tier"] == "team"
    assert credential_reads == [], credential_reads

    # another process deletes the secret: unseen until its notification arrives (the cache is what is read)
    async with svc.db.tx() as tx:
        await tx.execute("DELETE FROM secrets WHERE id = %(id)s", {"id": sid})
    assert await tier() == "team"
    async with svc.db.tx() as tx:
        await org_changes.notify(tx, "secrets", org["ident"].org_id)
    for _ in range(100):
        if await tier() is None:
            break
        await asyncio.sleep(0.02)
    assert await tier() is None
    assert (await org_data.load_org_credentials(svc, org["ident"], ["acme"])).team_secret_for("acme") is None


async def test_own_tools_come_from_the_tools_cache(build, credential_reads):
    client, svc, org = await build()
    a = await secret(client, org, "a")
    await tool(client, org, "b-api", a)
    await tool(client, org, "a-api", a)
    await tool(client, org, "plain", await secret(client, org, "p", provider=None))

    async def read() -> None:
        await org_data.load_org_credentials(svc, org["ident"], ["acme"])

    await _warm(read, credential_reads)
    creds = await org_data.load_org_credentials(svc, org["ident"], ["acme"])
    assert [t.name for t in creds.own_for("acme")] == ["a-api", "b-api"] and credential_reads == []
