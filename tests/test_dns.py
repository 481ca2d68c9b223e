"""treg.infra.dns.VettingResolver against a fake DNS server on 127.0.0.1 (no database, no real DNS)."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from pathlib import Path
from typing import Any

import pytest

from treg import settings as settings_mod
from treg.errors import ConfigError, GatewayFailed
from treg.infra import dns as tdns
from treg.infra.dns import SsrfRefused, VettingResolver, parse_nameservers
from treg.infra.ssrf import SsrfPolicy
from treg.testing import Clock, FakeDns, make_settings

ip = ipaddress.ip_address


@pytest.fixture
async def dns_server():
    async with FakeDns() as server:
        yield server


@pytest.fixture
def clock() -> Clock:
    """A hand-moved monotonic clock: TTL expiry without sleeping."""
    return Clock(1000.0)


@pytest.fixture
async def make_resolver(tmp_path: Path, dns_server: FakeDns, clock: Clock):
    made: list[VettingResolver] = []

    def build(*, allow: tuple[str, ...] = (), check: bool = True,
              dns_nameservers: tuple[str, ...] | None = None, **kw: Any) -> VettingResolver:
        servers = (dns_server.nameserver,) if dns_nameservers is None else dns_nameservers
        s = make_settings(tmp_path / "home", dns_nameservers=servers, ssrf_allow=allow, proxy_ssrf_check=check)
        kw.setdefault("clock", clock)
        r = VettingResolver(s, SsrfPolicy.from_settings(s.proxy_ssrf_check, s.ssrf_allow), **kw)
        made.append(r)
        return r

    yield build
    for r in made:
        await r.close()


# -- TTL ------------------------------------------------------------------------------------------

async def test_second_lookup_within_ttl_asks_no_query(make_resolver, dns_server, clock):
    dns_server.records["api.test"] = [("127.0.0.5", 30)]
    r = make_resolver(allow=("127.0.0.0/8",))
    assert await r.vet("api.test") == [ip("127.0.0.5")]
    clock.now += 29
    assert await r.vet("api.test") == [ip("127.0.0.5")]
    assert await r.addresses("API.test.") == [ip("127.0.0.5")]  # case and trailing dot: same entry
    assert dns_server.count("api.test", "A") == 1


async def test_after_expiry_asks_again(make_resolver, dns_server, clock):
    dns_server.records["api.test"] = [("127.0.0.5", 30)]
    r = make_resolver(allow=("127.0.0.0/8",))
    await r.vet("api.test")
    clock.now += 30
    dns_server.records["api.test"] = [("127.0.0.6", 30)]
    assert await r.vet("api.test") == [ip("127.0.0.6")]
    assert dns_server.count("api.test", "A") == 2


async def test_ttl_zero_is_never_cached(make_resolver, dns_server):
    dns_server.records["api.test"] = [("127.0.0.5", 0)]
    r = make_resolver(allow=("127.0.0.0/8",))
    for _ in range(3):
        await r.vet("api.test")
    assert dns_server.count("api.test", "A") == 3


async def test_cname_chain_caches_for_its_smallest_ttl(make_resolver, dns_server, clock):
    dns_server.cnames["alias.test"] = ("real.test", 5)
    dns_server.records["real.test"] = [("127.0.0.7", 300)]
    r = make_resolver(allow=("127.0.0.0/8",))
    assert await r.vet("alias.test") == [ip("127.0.0.7")]
    clock.now += 4
    await r.vet("alias.test")
    assert dns_server.count("alias.test", "A") == 1
    clock.now += 1
    await r.vet("alias.test")
    assert dns_server.count("alias.test", "A") == 2


async def test_negative_answer_cached_for_its_soa_ttl(make_resolver, dns_server, clock):
    dns_server.records["v4only.test"] = [("127.0.0.5", 300)]
    dns_server.negative_ttl = 10
    r = make_resolver(allow=("127.0.0.0/8",))
    await r.vet("v4only.test")
    await r.vet("v4only.test")
    assert dns_server.count("v4only.test", "AAAA") == 1
    clock.now += 10
    await r.vet("v4only.test")
    assert dns_server.count("v4only.test", "AAAA") == 2


async def test_negative_ttl_zero_is_asked_each_time(make_resolver, dns_server):
    dns_server.records["v4only.test"] = [("127.0.0.5", 300)]
    dns_server.negative_ttl = 0
    r = make_resolver(allow=("127.0.0.0/8",))
    await r.vet("v4only.test")
    await r.vet("v4only.test")
    assert dns_server.count("v4only.test", "AAAA") == 2
    assert dns_server.count("v4only.test", "A") == 1


async def test_concurrent_lookups_share_one_query(make_resolver, dns_server):
    dns_server.records["api.test"] = [("127.0.0.5", 0)]
    r = make_resolver(allow=("127.0.0.0/8",))
    results = await asyncio.gather(*(r.vet("api.test") for _ in range(10)))
    assert all(res == [ip("127.0.0.5")] for res in results)
    assert dns_server.count("api.test", "A") == 1


async def test_cache_is_bounded(make_resolver, dns_server):
    for name in ("a.test", "b.test"):
        dns_server.records[name] = [("127.0.0.5", 300), ("::1", 300)]
    r = make_resolver(allow=("127.0.0.0/8", "::1/128"), cache_size=2)
    await r.vet("a.test")
    await r.vet("b.test")  # two entries (A, AAAA) push a.test's two out
    await r.vet("a.test")
    assert dns_server.count("a.test", "A") == 2
    assert len(r._cache) <= 2


# -- vetting --------------------------------------------------------------------------------------

async def test_mixed_public_and_internal_answer_is_refused(make_resolver, dns_server):
    dns_server.records["mixed.test"] = [("8.8.8.8", 60), ("10.0.0.1", 60)]
    r = make_resolver()
    with pytest.raises(SsrfRefused) as info:
        await r.vet("mixed.test")
    err = info.value
    assert (err.status, err.code, err.blame, err.refused_by) == (502, "ssrf_refused", "caller", "ssrf")
    assert "mixed.test" in err.detail
    assert err.addresses == (ip("10.0.0.1"),)
    assert "10.0.0.1" not in str(err.body())  # the caller learns nothing about internal DNS
    assert isinstance(err, GatewayFailed)


async def test_mixed_allowed_and_metadata_is_refused(make_resolver, dns_server):
    dns_server.records["mixed.test"] = [("127.0.0.1", 60), ("169.254.169.254", 60)]
    r = make_resolver(allow=("127.0.0.0/8",))
    with pytest.raises(SsrfRefused):
        await r.vet("mixed.test")


async def test_internal_aaaa_beside_public_a_is_refused(make_resolver, dns_server):
    dns_server.records["mixed6.test"] = [("8.8.8.8", 60), ("fd00::1", 60)]
    with pytest.raises(SsrfRefused):
        await make_resolver().vet("mixed6.test")


async def test_public_answer_passes(make_resolver, dns_server):
    dns_server.records["pub.test"] = [("8.8.8.8", 60), ("2001:4860:4860::8888", 60)]
    assert await make_resolver().vet("pub.test") == [ip("8.8.8.8"), ip("2001:4860:4860::8888")]


async def test_dns_rebinding_ttl_zero_is_caught_on_the_next_vet(make_resolver, dns_server):
    dns_server.records["rebind.test"] = [("127.0.0.9", 0)]
    r = make_resolver(allow=("127.0.0.0/8",))
    assert await r.vet("rebind.test") == [ip("127.0.0.9")]
    dns_server.records["rebind.test"] = [("169.254.169.254", 0)]
    with pytest.raises(SsrfRefused):
        await r.vet("rebind.test")


async def test_dns_rebinding_after_ttl_expiry(make_resolver, dns_server, clock):
    dns_server.records["rebind.test"] = [("127.0.0.9", 5)]
    r = make_resolver(allow=("127.0.0.0/8",))
    await r.vet("rebind.test")
    dns_server.records["rebind.test"] = [("169.254.169.254", 5)]
    clock.now += 5
    with pytest.raises(SsrfRefused):
        await r.vet("rebind.test")


async def test_addresses_returns_internal_addresses_without_refusing(make_resolver, dns_server):
    dns_server.records["inside.test"] = [("10.0.0.1", 60)]
    assert await make_resolver().addresses("inside.test") == [ip("10.0.0.1")]


async def test_ssrf_check_off_never_refuses(make_resolver, dns_server):
    dns_server.records["inside.test"] = [("10.0.0.1", 60)]
    r = make_resolver(check=False)
    assert await r.vet("inside.test") == [ip("10.0.0.1")]
    assert await r.vet("169.254.169.254") == [ip("169.254.169.254")]
    assert await r.vet("localhost") == [ip("127.0.0.1"), ip("::1")]


@pytest.mark.parametrize("host", ["127.0.0.1", "2130706433", "0x7f000001", "0177.0.0.1", "127.1", "[::1]", "::1",
                                  "169.254.169.254", "[::ffff:169.254.169.254]", "100.100.100.200", "10.1.2.3",
                                  "[64:ff9b::a9fe:a9fe]", "0.0.0.0", "[fe80::1%eth0]"])
async def test_numeric_internal_hosts_refused_without_dns(make_resolver, dns_server, host):
    with pytest.raises(SsrfRefused):
        await make_resolver().vet(host)
    assert dns_server.queries == []


async def test_numeric_hosts_are_not_resolved(make_resolver, dns_server):
    r = make_resolver(allow=("127.0.0.0/8",))
    assert await r.vet("8.8.8.8") == [ip("8.8.8.8")]
    assert await r.vet("127.1") == [ip("127.0.0.1")]
    assert await r.vet("[2001:4860:4860::8888]") == [ip("2001:4860:4860::8888")]
    assert await r.addresses("0x0a000001") == [ip("10.0.0.1")]
    assert dns_server.queries == []


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST.", "api.localhost", "a.b.localhost"])
async def test_localhost_maps_to_loopback_without_dns(make_resolver, dns_server, host):
    r = make_resolver()
    with pytest.raises(SsrfRefused):
        await r.vet(host)
    assert await r.addresses(host) == [ip("127.0.0.1"), ip("::1")]
    # TREG_SSRF_ALLOW=127.0.0.0/8 (the usual local setup) dials IPv4 loopback only
    assert await make_resolver(allow=("127.0.0.0/8",)).vet(host) == [ip("127.0.0.1")]
    assert await make_resolver(allow=("127.0.0.0/8", "::1/128")).vet(host) == [ip("127.0.0.1"), ip("::1")]
    assert dns_server.queries == []


async def test_not_localhost_lookalike_goes_to_dns(make_resolver, dns_server):
    dns_server.records["notlocalhost"] = [("8.8.8.8", 60)]
    assert await make_resolver().vet("notlocalhost") == [ip("8.8.8.8")]
    assert dns_server.count("notlocalhost") == 2


# -- failures -------------------------------------------------------------------------------------

def _is_dns_failed(err: BaseException) -> bool:
    return (isinstance(err, GatewayFailed) and not isinstance(err, SsrfRefused)
            and (err.status, err.code) == (502, "dns_failed"))


async def test_nxdomain_is_dns_failed(make_resolver, dns_server):
    with pytest.raises(GatewayFailed) as info:
        await make_resolver().vet("nowhere.test")
    assert _is_dns_failed(info.value) and info.value.blame == "upstream"
    assert "nowhere.test" in info.value.detail and "NXDOMAIN" in info.value.detail


async def test_name_without_addresses_is_dns_failed(make_resolver, dns_server):
    dns_server.records["empty.test"] = []
    with pytest.raises(GatewayFailed) as info:
        await make_resolver().addresses("empty.test")
    assert _is_dns_failed(info.value) and "no A or AAAA" in info.value.detail


async def test_servfail_is_dns_failed(make_resolver, dns_server):
    dns_server.servfail.add("broken.test")
    with pytest.raises(GatewayFailed) as info:
        await make_resolver().vet("broken.test")
    assert _is_dns_failed(info.value)


async def test_silent_server_times_out_within_the_lifetime(make_resolver, dns_server):
    dns_server.silent.add("slow.test")
    with pytest.raises(GatewayFailed) as info:
        await make_resolver(lifetime=0.3, attempt_timeout=0.1).vet("slow.test")
    assert _is_dns_failed(info.value) and "timed out" in info.value.detail


async def test_failures_are_not_cached(make_resolver, dns_server):
    r = make_resolver(allow=("127.0.0.0/8",))
    with pytest.raises(GatewayFailed):
        await r.vet("later.test")
    dns_server.records["later.test"] = [("127.0.0.5", 60)]
    assert await r.vet("later.test") == [ip("127.0.0.5")]


async def test_invalid_name_is_a_clean_dns_failed(make_resolver, dns_server):
    with pytest.raises(GatewayFailed) as info:
        await make_resolver().vet("a" * 64 + ".test")
    assert _is_dns_failed(info.value) and info.value.blame == "caller"


async def test_truncated_udp_answer_retries_over_tcp(make_resolver, dns_server):
    dns_server.truncate_udp = True
    dns_server.records["big.test"] = [(f"127.0.1.{i}", 60) for i in range(1, 40)]
    addrs = await make_resolver(allow=("127.0.0.0/8",)).vet("big.test")
    assert len(addrs) == 39
    assert dns_server.count("big.test", "A", "udp") == 1
    assert dns_server.count("big.test", "A", "tcp") == 1


# -- aiohttp's interface --------------------------------------------------------------------------

async def test_resolve_returns_only_vetted_numeric_hosts(make_resolver, dns_server):
    dns_server.records["both.test"] = [("127.0.0.5", 60), ("::1", 60)]
    r = make_resolver(allow=("127.0.0.0/8", "::1/128"))
    out = await r.resolve("both.test", 8443, family=socket.AF_UNSPEC)
    assert out == [
        {"hostname": "both.test", "host": "127.0.0.5", "port": 8443, "family": socket.AF_INET, "proto": 0,
         "flags": socket.AI_NUMERICHOST | socket.AI_NUMERICSERV},
        {"hostname": "both.test", "host": "::1", "port": 8443, "family": socket.AF_INET6, "proto": 0,
         "flags": socket.AI_NUMERICHOST | socket.AI_NUMERICSERV},
    ]
    assert [h["host"] for h in await r.resolve("both.test", 80, family=socket.AF_INET6)] == ["::1"]
    assert [h["host"] for h in await r.resolve("both.test", 80, family=socket.AF_INET)] == ["127.0.0.5"]


async def test_resolve_refuses_like_vet(make_resolver, dns_server):
    dns_server.records["inside.test"] = [("10.0.0.1", 60)]
    with pytest.raises(SsrfRefused):
        await make_resolver().resolve("inside.test", 80, family=socket.AF_UNSPEC)


async def test_resolve_without_an_address_of_the_family_is_dns_failed(make_resolver, dns_server):
    dns_server.records["v4.test"] = [("127.0.0.5", 60)]
    with pytest.raises(GatewayFailed) as info:
        await make_resolver(allow=("127.0.0.0/8",)).resolve("v4.test", 80, family=socket.AF_INET6)
    assert _is_dns_failed(info.value)


async def test_unwrap_finds_the_refusal_in_a_wrapped_chain():
    refusal = SsrfRefused("no")
    try:
        try:
            raise refusal
        except SsrfRefused as exc:
            raise OSError("wrapped") from exc
    except OSError as outer:
        assert tdns.unwrap_treg_error(outer) is refusal
    assert tdns.unwrap_treg_error(OSError("plain")) is None


# -- configuration --------------------------------------------------------------------------------

@pytest.mark.parametrize("raw,expected", [
    ("192.0.2.1", ("192.0.2.1", 53)),
    (" 192.0.2.1:5353 ", ("192.0.2.1", 5353)),
    ("::1", ("::1", 53)),
    ("2001:db8::53", ("2001:db8::53", 53)),
    ("[::1]", ("::1", 53)),
    ("[2001:db8::53]:5353", ("2001:db8::53", 5353)),
])
def test_nameserver_forms(raw, expected):
    assert parse_nameservers((raw,)) == [expected]


@pytest.mark.parametrize("raw", ["dns.example", "192.0.2.1:0", "192.0.2.1:65536", "192.0.2.1:", "192.0.2.1:abc",
                                 "192.0.2.1:+53", "[::1", "[::1]x", "[::1]:", "[dns.example]:53", "1.2.3:53:1",
                                 "192.0.2.1: 53", ""])
def test_bad_nameserver_is_a_config_error(raw):
    with pytest.raises(ConfigError) as info:
        parse_nameservers((raw,))
    assert info.value.code == "bad_setting" and "TREG_DNS_NAMESERVERS" in info.value.detail


def test_nameservers_from_the_environment(tmp_path):
    s = settings_mod.load(environ={"TREG_HOME": str(tmp_path), "TREG_DNS_NAMESERVERS": "192.0.2.1, 192.0.2.2:5353"})
    assert parse_nameservers(s.dns_nameservers) == [("192.0.2.1", 53), ("192.0.2.2", 5353)]


async def test_setup_refuses_a_bad_nameserver(tmp_path):
    s = settings_mod.load(environ={"TREG_HOME": str(tmp_path), "TREG_DNS_NAMESERVERS": "192.0.2.1,resolver.local"})

    class Svc:
        settings = s
        ssrf = SsrfPolicy.from_settings(True, ())
        resolver = None

    with pytest.raises(ConfigError):
        await tdns.setup(None, Svc())


async def test_setup_installs_the_resolver(tmp_path, dns_server):
    s = make_settings(tmp_path / "home", dns_nameservers=(dns_server.nameserver,))

    class Svc:
        settings = s
        ssrf = SsrfPolicy.from_settings(True, ())
        resolver = None

    svc = Svc()
    close = await tdns.setup(None, svc)
    assert isinstance(svc.resolver, VettingResolver)
    await close()


async def test_only_the_configured_nameservers_are_asked(make_resolver, dns_server):
    async with FakeDns(records={"api.test": [("127.0.0.8", 60)]}) as other:
        r = make_resolver(allow=("127.0.0.0/8",), dns_nameservers=(other.nameserver,))
        assert await r.vet("api.test") == [ip("127.0.0.8")]
    assert dns_server.queries == []


async def test_unusable_resolv_conf_falls_back_to_getaddrinfo(tmp_path, make_resolver, dns_server):
    conf = tmp_path / "resolv.conf"
    conf.write_text("search example\n")  # no nameserver line: unusable
    r = make_resolver(dns_nameservers=(), resolv_conf=str(conf), allow=("127.0.0.0/8",))
    assert r.uses_system_resolver
    asked: list[str] = []

    async def fake_getaddrinfo(loop: Any, name: str) -> list[Any]:
        asked.append(name)
        if name == "gone.test":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.4", 0)),
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.4", 0)),
                (socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("fd00::4", 0, 0, 0))]

    r._getaddrinfo = fake_getaddrinfo  # type: ignore[method-assign]
    assert await r.addresses("sys.test") == [ip("127.0.0.4"), ip("fd00::4")]
    with pytest.raises(SsrfRefused):
        await r.vet("sys.test")
    with pytest.raises(GatewayFailed) as info:
        await r.vet("gone.test")
    assert _is_dns_failed(info.value)
    assert asked == ["sys.test", "sys.test", "gone.test"]  # no TTL known: nothing cached
    assert dns_server.queries == []


def test_missing_resolv_conf_falls_back(tmp_path, make_resolver):
    assert make_resolver(dns_nameservers=(), resolv_conf=str(tmp_path / "absent")).uses_system_resolver


def test_a_usable_resolv_conf_is_used(tmp_path, make_resolver):
    conf = tmp_path / "resolv.conf"
    conf.write_text("nameserver 192.0.2.53\n")
    assert not make_resolver(dns_nameservers=(), resolv_conf=str(conf)).uses_system_resolver
