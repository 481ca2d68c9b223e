"""The SSRF registration check: a tool's base_url must be http(s) and not point at an internal address.

Over HTTP (POST /api/v1/tools answers 422 ``ssrf_refused`` with the error body) and as unit tests of
:mod:`treg.infra.ssrf`. Names are resolved by the test's FakeDns, never real DNS.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from treg import membership
from treg.infra import ssrf
from treg.keys import SERVICES

REFUSED = [
    "http://127.0.0.1/", "http://127.0.0.1:8080/v1", "https://user:pw@127.0.0.1/", "http://127.255.255.254/",
    "http://localhost/", "http://LOCALHOST./", "http://api.localhost/",
    "http://10.0.0.1/", "http://10.255.255.255/",
    "http://172.16.0.1/", "http://172.31.255.255/",
    "http://192.168.0.1/", "http://192.168.255.255/",
    "http://169.254.169.254/latest/meta-data/", "http://169.254.0.1/",
    "http://100.64.0.1/", "http://100.100.100.200/", "http://100.127.255.255/",
    "http://0.0.0.0/", "http://0/", "http://[::]/",
    "http://[::1]/", "http://[0:0:0:0:0:0:0:1]/",
    "http://[::ffff:127.0.0.1]/", "http://[::ffff:7f00:1]/", "http://[::ffff:10.0.0.1]/",
    "http://[::ffff:169.254.169.254]/",
    "http://[64:ff9b::7f00:1]/", "http://[64:ff9b::127.0.0.1]/", "http://[64:ff9b::a00:1]/",
    "http://[64:ff9b::6464:64c8]/",  # NAT64 of 100.100.100.200
    "http://[fc00::1]/", "http://[fd12:3456:789a::1]/",
    "http://[fe80::1]/", "http://[fe80::1%25eth0]/",
    "http://224.0.0.1/", "http://239.255.255.250/", "http://[ff02::1]/",
    "http://2130706433/", "http://0x7f000001/", "http://0X7F000001/", "http://0177.0.0.1/",
    "http://017700000001/", "http://127.1/", "http://127.0.1/", "http://10.1/", "http://0xa.1/",
    "http://167772161/",  # 10.0.0.1 in decimal
    "http://255.255.255.255/", "http://240.0.0.1/", "http://192.0.0.8/", "http://198.18.0.1/",
    "http://192.0.2.1/",  # TEST-NET-1: documentation, not global
    "http://192.0.0.9/", "http://192.88.99.1/", "http://[fec0::1]/", "http://[2001:db8::1]/",
]

ACCEPTED = [
    "http://8.8.8.8/", "https://1.1.1.1/dns-query", "http://[2001:4860:4860::8888]/",
    "http://[64:ff9b::808:808]/",  # NAT64 of 8.8.8.8 is as public as 8.8.8.8
    "http://[::ffff:8.8.8.8]/",
    "http://100.63.255.255/", "http://100.128.0.1/",  # just outside CGNAT 100.64/10
    "https://api.example.com/v1", "https://public.example.com/",
]


async def assert_error(resp: Any, status: int, code: str | None = None) -> dict[str, Any]:
    assert resp.status == status, (resp.status, await resp.text())
    assert resp.headers.get("X-Treg-Error") == "1"
    body = await resp.json()
    assert {"error", "detail", "blame"} <= set(body)
    if code is not None:
        assert body["error"] == code, body
    return body


async def register(client: Any, headers: dict[str, str], base_url: str, name: str = "t") -> Any:
    return await client.post("/api/v1/tools", json={"name": name, "base_url": base_url, "bindings": []},
                             headers=headers)


@pytest.fixture
def dns_records(fake_dns):
    fake_dns.records["public.example.com"] = [("93.184.216.34", 60)]
    fake_dns.records["internal.example.com"] = [("10.0.0.5", 60)]
    fake_dns.records["mixed.example.com"] = [("93.184.216.34", 60), ("127.0.0.1", 60)]
    fake_dns.records["meta.example.com"] = [("169.254.169.254", 60)]
    fake_dns.records["v6loop.example.com"] = [("::1", 60)]
    return fake_dns


@pytest.mark.parametrize("url", REFUSED)
async def test_internal_base_url_refused(client, owner, dns_records, url):
    body = await assert_error(await register(client, owner["headers"], url), 422, "ssrf_refused")
    assert body["blame"] == "caller" and "TREG_SSRF_ALLOW" in body["detail"]


@pytest.mark.parametrize("url", ACCEPTED)
async def test_public_base_url_accepted(client, owner, dns_records, url):
    resp = await register(client, owner["headers"], url)
    assert resp.status == 201, await resp.text()


@pytest.mark.parametrize("name", ["internal.example.com", "mixed.example.com", "meta.example.com",
                                  "v6loop.example.com"])
async def test_name_resolving_to_internal_refused(client, owner, dns_records, name):
    await assert_error(await register(client, owner["headers"], f"https://{name}/v1"), 422, "ssrf_refused")


async def test_refused_on_patch_too(client, owner, dns_records):
    resp = await register(client, owner["headers"], "https://api.example.com")
    tool = await resp.json()
    for url in ("http://127.1/", "https://internal.example.com/"):
        await assert_error(await client.patch(f"/api/v1/tools/{tool['id']}", json={"base_url": url},
                                              headers=owner["headers"]), 422, "ssrf_refused")


@pytest.mark.parametrize("url", ["ftp://api.example.com/", "file:///etc/passwd", "gopher://127.0.0.1:25/",
                                 "javascript:alert(1)", "api.example.com", "//api.example.com/v1",
                                 "http:///path-only", "ws://api.example.com/", "", "   "])
async def test_non_http_base_url_is_400(client, owner, url):
    await assert_error(await register(client, owner["headers"], url), 400, "invalid_base_url")


async def _client_for(aiohttp_client: Any, make_app: Any, **overrides: Any) -> tuple[Any, dict[str, str]]:
    client = await aiohttp_client(make_app(**overrides))
    org = await membership.create_org(client.app[SERVICES], slug="acme", email="owner@acme.test")
    return client, {"X-Treg-Token": org["token"]}


async def test_ssrf_allow_exempts_a_cidr(make_app, aiohttp_client):
    client, h = await _client_for(aiohttp_client, make_app, ssrf_allow=("127.0.0.0/8", "fd00::/8"))
    for i, url in enumerate(["http://127.0.0.1:9000/", "http://127.1/", "http://2130706433/",
                             "http://[::ffff:127.0.0.1]/", "http://[fd00::5]/", "http://localhost:8080/"]):
        resp = await register(client, h, url, name=f"t{i}")
        assert resp.status == 201, (url, await resp.text())
    # what the allow list does not name stays refused
    for url in ("http://10.0.0.1/", "http://169.254.169.254/", "http://[::1]/", "http://[fc00::1]/"):
        await assert_error(await register(client, h, url, name="x"), 422, "ssrf_refused")


async def test_ssrf_allow_is_exact_about_short_forms(make_app, aiohttp_client):
    # "10.1" means 10.0.0.1, which is not inside 10.1.0.0/16
    client, h = await _client_for(aiohttp_client, make_app, ssrf_allow=("10.1.0.0/16",))
    assert (await register(client, h, "http://10.1.2.3/", name="a")).status == 201
    await assert_error(await register(client, h, "http://10.1/", name="b"), 422, "ssrf_refused")


async def test_ssrf_check_off_accepts_internal(make_app, aiohttp_client):
    client, h = await _client_for(aiohttp_client, make_app, proxy_ssrf_check=False)
    for i, url in enumerate(["http://127.0.0.1/", "http://169.254.169.254/", "http://localhost/", "http://[::1]/"]):
        resp = await register(client, h, url, name=f"t{i}")
        assert resp.status == 201, (url, await resp.text())
    # the scheme rule still holds
    await assert_error(await register(client, h, "file:///etc/passwd", name="f"), 400, "invalid_base_url")


# -- unit tests of treg.infra.ssrf -------------------------------------------------------------------------

@pytest.mark.parametrize("spelling,expected", [
    ("127.0.0.1", "127.0.0.1"), ("2130706433", "127.0.0.1"), ("0x7f000001", "127.0.0.1"),
    ("0177.0.0.1", "127.0.0.1"), ("127.1", "127.0.0.1"), ("10.1", "10.0.0.1"), ("0", "0.0.0.0"),
    ("0x7f.0.0.1", "127.0.0.1"), ("127.0.0.1.", "127.0.0.1"), ("[::1]", "::1"), ("::1", "::1"),
    ("fe80::1%eth0", "fe80::1"), ("[::ffff:127.0.0.1]", "::ffff:7f00:1"), ("8.8.8.8", "8.8.8.8"),
])
def test_parse_numeric_host(spelling, expected):
    assert ssrf.parse_numeric_host(spelling) == ipaddress.ip_address(expected)


@pytest.mark.parametrize("name", ["api.example.com", "localhost", "deadbeef", "1e100", "", "a.b", "0x", "127.0.0.1.x",
                                  "face.b00c"])
def test_names_are_not_numeric(name):
    assert ssrf.parse_numeric_host(name) is None


@pytest.mark.parametrize("addr", [
    "127.0.0.1", "10.0.0.1", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "100.100.100.200",
    "0.0.0.0", "224.0.0.1", "255.255.255.255", "::1", "::", "::ffff:127.0.0.1", "::ffff:100.100.100.200",
    "64:ff9b::7f00:1", "64:ff9b:1::a00:1", "fc00::1", "fe80::1", "ff02::1", "::127.0.0.1",
    "2002:7f00:1::1",  # 6to4 wrapping 127.0.0.1
    "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo whose client is 127.0.0.1
])
def test_is_internal(addr):
    assert ssrf.is_internal(ipaddress.ip_address(addr))


@pytest.mark.parametrize("addr", ["8.8.8.8", "1.1.1.1", "93.184.216.34", "100.63.255.255", "100.128.0.1",
                                  "2001:4860:4860::8888", "64:ff9b::808:808", "::ffff:8.8.8.8", "2002:808:808::1"])
def test_is_public(addr):
    assert not ssrf.is_internal(ipaddress.ip_address(addr))


def test_policy_allow_and_disable():
    ip = ipaddress.ip_address
    policy = ssrf.SsrfPolicy.from_settings(True, ("127.0.0.0/8", "fd00::/8"))
    assert policy.allowed(ip("127.0.0.1")) and policy.allowed(ip("::ffff:127.0.0.1")) and policy.allowed(ip("fd00::1"))
    assert not policy.allowed(ip("10.0.0.1")) and not policy.allowed(ip("::1"))
    assert policy.allowed(ip("8.8.8.8"))
    assert policy.refused([ip("8.8.8.8"), ip("10.0.0.1"), ip("127.0.0.2")]) == [ip("10.0.0.1")]
    off = ssrf.SsrfPolicy.from_settings(False, ())
    assert off.allowed(ip("127.0.0.1")) and off.allowed(ip("169.254.169.254")) and off.refused([ip("::1")]) == []
    default = ssrf.SsrfPolicy()
    assert not default.allowed(ip("127.0.0.1")) and default.allowed(ip("1.1.1.1"))
