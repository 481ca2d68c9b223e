"""The call-time SSRF guard without the resolve-vs-connect race: a real aiohttp ClientSession whose
connector uses treg's VettingResolver dials only addresses that passed the check.

Upstreams listen on 127.0.0.1 and 127.0.0.2 (both loopback); only 127.0.0.1/32 is exempted by
TREG_SSRF_ALLOW, so 127.0.0.2 stands for "an internal address": a server there must see nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp
import pytest

from treg import membership
from treg.errors import GatewayFailed
from treg.infra.dns import SsrfRefused, VettingResolver
from treg.infra.ssrf import SsrfPolicy
from treg.keys import SERVICES
from treg.testing import ALLOW_ONE, FakeDns, make_settings, upstream_pair


@pytest.fixture
async def dns_server():
    async with FakeDns() as server:
        yield server


@pytest.fixture
async def resolver(tmp_path: Path, dns_server: FakeDns) -> AsyncIterator[VettingResolver]:
    s = make_settings(tmp_path / "home", dns_nameservers=(dns_server.nameserver,), ssrf_allow=ALLOW_ONE)
    r = VettingResolver(s, SsrfPolicy.from_settings(True, s.ssrf_allow))
    yield r
    await r.close()


@pytest.fixture
async def session(resolver: VettingResolver) -> AsyncIterator[aiohttp.ClientSession]:
    # the connector settings the app uses: no DNS cache of aiohttp's, every new connection asks us
    connector = aiohttp.TCPConnector(resolver=resolver, use_dns_cache=False)
    async with aiohttp.ClientSession(connector=connector, trust_env=False) as s:
        yield s


async def test_a_name_resolving_to_an_allowed_address_is_dialled(session, dns_server):
    async with upstream_pair() as (allowed, inside):
        dns_server.records["up.test"] = [("127.0.0.1", 60)]
        async with session.get(f"http://up.test:{allowed.port}/v1") as resp:
            assert resp.status == 200 and await resp.read() == b"ok"
        assert allowed.last.header("Host") == f"up.test:{allowed.port}"
        assert inside.connections == 0


async def test_a_name_resolving_outside_the_allowance_is_refused_and_nothing_connects(session, dns_server):
    async with upstream_pair() as (allowed, inside):
        dns_server.records["evil.test"] = [("127.0.0.2", 60)]
        with pytest.raises(SsrfRefused) as info:  # unwrapped: not an OSError, aiohttp lets it through
            await session.get(f"http://evil.test:{inside.port}/")
        assert info.value.code == "ssrf_refused" and "evil.test" in info.value.detail
        assert inside.connections == 0 and inside.exchanges == []
        assert allowed.connections == 0


async def test_a_mixed_answer_dials_no_address_at_all(session, dns_server):
    async with upstream_pair() as (allowed, inside):
        dns_server.records["mixed.test"] = [("127.0.0.1", 60), ("127.0.0.2", 60)]
        with pytest.raises(SsrfRefused):
            await session.get(f"http://mixed.test:{allowed.port}/")
        assert allowed.connections == 0 and inside.connections == 0


async def test_rebinding_between_the_check_and_the_connect_is_caught(session, resolver, dns_server):
    """The seed's race: the relay's check passes, then the name changes before the connector resolves.
    The connector's resolution is itself vetted, so the new internal address is never dialled."""
    async with upstream_pair() as (allowed, inside):
        dns_server.records["rebind.test"] = [("127.0.0.1", 0)]
        assert [str(a) for a in await resolver.vet("rebind.test")] == ["127.0.0.1"]
        dns_server.records["rebind.test"] = [("127.0.0.2", 0)]
        with pytest.raises(SsrfRefused):
            await session.get(f"http://rebind.test:{inside.port}/")
        assert inside.connections == 0 and allowed.connections == 0


async def test_a_kept_alive_connection_skips_the_resolver_so_the_relay_must_vet(session, resolver, dns_server):
    """Why the relay calls ``vet`` before every send: aiohttp reuses a pooled connection without asking
    the resolver, so only ``vet`` sees that the name now points inside."""
    async with upstream_pair() as (allowed, inside):
        dns_server.records["keep.test"] = [("127.0.0.1", 0)]
        url = f"http://keep.test:{allowed.port}/"
        async with session.get(url) as resp:
            await resp.read()
        asked = dns_server.count("keep.test", "A")
        dns_server.records["keep.test"] = [("169.254.169.254", 0)]
        with pytest.raises(SsrfRefused):
            await resolver.vet("keep.test")
        async with session.get(url) as resp:  # the pooled connection: no resolution happened
            await resp.read()
        assert dns_server.count("keep.test", "A") == asked + 1  # only vet's query
        assert allowed.connections == 1 and len(allowed.exchanges) == 2


async def test_numeric_hosts_never_reach_the_resolver_so_vet_is_their_guard(session, resolver, dns_server):
    async with upstream_pair() as (allowed, inside):
        with pytest.raises(SsrfRefused):
            await resolver.vet("127.0.0.2")
        with pytest.raises(SsrfRefused):
            await resolver.vet("0x7f000002")
        # aiohttp dials a literal as is, without the resolver: the relay must have vetted it
        async with session.get(f"http://127.0.0.2:{inside.port}/") as resp:
            assert resp.status == 200
        assert inside.connections == 1
        assert dns_server.queries == []


async def test_a_numeric_hosts_verdict_is_kept_only_when_it_allows(resolver, dns_server):
    """A host that needs no DNS is vetted once (its addresses cannot change), but a refusal is never kept:
    it is refused, and logged, every time, in every spelling; a caller changing the list it got changes
    nothing kept."""
    for _ in range(3):
        for spelling in ("127.0.0.2", "0x7f000002", "2130706434"):
            with pytest.raises(SsrfRefused):
                await resolver.vet(spelling)
    first = await resolver.vet("127.0.0.1")
    assert [str(a) for a in first] == ["127.0.0.1"]
    first.clear()
    assert [str(a) for a in await resolver.vet("127.0.0.1")] == ["127.0.0.1"]
    assert dns_server.queries == []


async def test_a_names_verdict_is_kept_only_for_the_answer_it_judged(tmp_path, dns_server):
    """While a name's records are fresh, ``vet`` answers from the verdict on that very answer (no query, no
    second judgement); once they expire, the new answer is judged: a name that moved inside is refused."""
    now = [1000.0]
    s = make_settings(tmp_path / "home", dns_nameservers=(dns_server.nameserver,), ssrf_allow=ALLOW_ONE)
    r = VettingResolver(s, SsrfPolicy.from_settings(True, s.ssrf_allow), clock=lambda: now[0])
    try:
        dns_server.records["moving.test"] = [("127.0.0.1", 60)]
        for _ in range(3):
            assert [str(a) for a in await r.vet("moving.test")] == ["127.0.0.1"]
        assert dns_server.count("moving.test", "A") == 1
        dns_server.records["moving.test"] = [("127.0.0.2", 60)]
        now[0] += 30  # still fresh: the answer judged before
        assert [str(a) for a in await r.vet("moving.test")] == ["127.0.0.1"]
        now[0] += 31  # expired: asked again, and the new answer refused, every time
        for _ in range(2):
            with pytest.raises(SsrfRefused):
                await r.vet("moving.test")
        dns_server.records["moving.test"] = [("127.0.0.1", 60)]
        now[0] += 61
        assert [str(a) for a in await r.vet("moving.test")] == ["127.0.0.1"]
    finally:
        await r.close()


async def test_an_unresolvable_name_is_dns_failed_through_the_connector(session, dns_server):
    with pytest.raises(GatewayFailed) as info:
        await session.get("http://nowhere.test/")
    assert not isinstance(info.value, SsrfRefused)
    assert (info.value.status, info.value.code, info.value.blame) == (502, "dns_failed", "upstream")


# -- the running app ------------------------------------------------------------------------------

async def test_the_app_installs_the_resolver_on_its_upstream_session(aiohttp_client, make_app, fake_dns):
    client = await aiohttp_client(make_app(ssrf_allow=ALLOW_ONE))
    svc = client.app[SERVICES]
    assert isinstance(svc.resolver, VettingResolver)
    async with upstream_pair() as (allowed, inside):
        fake_dns.records["up.test"] = [("127.0.0.1", 60)]
        fake_dns.records["evil.test"] = [("127.0.0.2", 60)]
        async with svc.client.get(f"http://up.test:{allowed.port}/") as resp:
            assert resp.status == 200
        with pytest.raises(SsrfRefused):
            await svc.client.get(f"http://evil.test:{inside.port}/")
        assert inside.connections == 0


async def test_registration_check_uses_the_resolver(aiohttp_client, make_app, fake_dns):
    client = await aiohttp_client(make_app())
    org = await membership.create_org(client.app[SERVICES], slug="acme", email="owner@acme.test")
    headers = {"X-Treg-Token": org["token"]}
    fake_dns.records["meta.test"] = [("169.254.169.254", 60)]
    fake_dns.records["public.test"] = [("8.8.8.8", 60)]

    async def register(name: str, base_url: str) -> Any:
        resp = await client.post("/api/v1/tools", json={"name": name, "base_url": base_url, "bindings": []},
                                 headers=headers)
        return resp.status, await resp.json()

    status, body = await register("meta", "http://meta.test/latest")
    assert (status, body["error"]) == (422, "ssrf_refused")
    assert (await register("pub", "https://public.test/v1"))[0] == 201
    assert fake_dns.count("meta.test", "A") == 1 and fake_dns.count("public.test", "A") == 1
