"""Registration hosts are normalised before the SSRF check, special-use names refused like internal
addresses, and registration and call time read a host the same way (api.md "Registration hosts",
issue 9 item 12). ``TREG_SSRF_ALLOW`` exempts them at both ends alike."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from treg import membership
from treg.infra import ssrf
from treg.keys import SERVICES

DISGUISED = [
    "\u2460\u2461\u2466.\u24ea.\u24ea.\u2460",  # ①②⑦.⓪.⓪.① (enclosed digits)
    "\uff11\uff12\uff17.\uff10.\uff10.\uff11",  # １２７.０.０.１ (full-width digits)
    "127\u30020\u30020\u30021",  # ideographic full stops
    "\uff11\uff12\uff17\uff0e\uff10\uff0e\uff10\uff0e\uff11",  # full-width digits and dots
    "%31%32%37.0.0.1",  # percent-encoded octets
    "%2531%2532%2537.0.0.1",  # double-encoded
    "%E2%91%A0%E2%91%A1%E2%91%A6.0.0.1",  # percent-encoded enclosed digits
    "\u2469.0.0.1",  # ⑩.0.0.1 is 10.0.0.1
    "%31%36%39.254.169.254",  # metadata
    "localhost.localdomain", "LOCALHOST.LOCALDOMAIN.", "ip6-localhost", "ip6-loopback",
    "\u24dbocalhost",  # ⓛocalhost
    "%6c%6fcalhost", "x.localhost",
    "db.internal", "metadata.google.internal", "printer.local", "NAS.LOCAL.",
    "\uff44\uff42.\uff49\uff4e\uff54\uff45\uff52\uff4e\uff41\uff4c",  # ｄｂ.ｉｎｔｅｒｎａｌ
]


async def register(client: Any, headers: dict[str, str], base_url: str, name: str = "t") -> Any:
    return await client.post("/api/v1/tools", json={"name": name, "base_url": base_url, "bindings": []},
                             headers=headers)


async def refused(resp: Any) -> dict[str, Any]:
    assert resp.status == 422, (resp.status, await resp.text())
    assert resp.headers.get("X-Treg-Error") == "1"
    body = await resp.json()
    assert body["error"] == "ssrf_refused" and body["blame"] == "caller"
    assert "TREG_SSRF_ALLOW" in body["detail"]
    return body


@pytest.fixture
def public_dns(fake_dns):
    # special-use names refused whatever they resolve to: here even to a public address
    for name in ("db.internal", "metadata.google.internal", "nas.local"):
        fake_dns.records[name] = [("93.184.216.34", 60)]
    return fake_dns


@pytest.mark.parametrize("host", DISGUISED)
async def test_disguised_and_special_hosts_are_refused_at_registration(client, owner, public_dns, host):
    await refused(await register(client, owner["headers"], f"http://{host}/v1"))
    tool = await (await register(client, owner["headers"], "https://93.184.216.34/v1", name="ok")).json()
    # and on PATCH
    await refused(await client.patch(f"/api/v1/tools/{tool['id']}", json={"base_url": f"https://{host}/"},
                                     headers=owner["headers"]))


@pytest.mark.parametrize("host", ["b\u00fccher.example", "xn--bcher-kva.example", "my_host.example.com",
                                  "api.example.com", "local.example.com", "internal.example.com"])
async def test_public_names_still_register(client, owner, fake_dns, host):
    fake_dns.records["xn--bcher-kva.example"] = [("93.184.216.34", 60)]
    resp = await register(client, owner["headers"], f"https://{host}/v1")
    assert resp.status == 201, await resp.text()


def test_normalize_host():
    assert ssrf.normalize_host("\u2460\u2461\u2466.\u24ea.\u24ea.\u2460") == "127.0.0.1"
    assert ssrf.normalize_host("%2531%2532%2537.0.0.1") == "127.0.0.1"
    assert ssrf.normalize_host("B\u00fccher.Example.") == "xn--bcher-kva.example"
    assert ssrf.normalize_host("[::1]") == "[::1]"
    assert ssrf.loopback_name("ip6-localhost") and ssrf.loopback_name("a.localhost")
    assert not ssrf.loopback_name("localhost.example.com")
    assert ssrf.site_local_name("a.b.internal") and ssrf.site_local_name("local")
    assert not ssrf.site_local_name("internal.example.com")


# -- TREG_SSRF_ALLOW: registration and call time agree -------------------------------------------------

async def _client_for(aiohttp_client: Any, make_app: Any, **overrides: Any) -> tuple[Any, dict[str, str]]:
    client = await aiohttp_client(make_app(**overrides))
    org = await membership.create_org(client.app[SERVICES], slug="acme", email="owner@acme.test")
    return client, {"X-Treg-Token": org["token"]}


@pytest.mark.parametrize("host", ["localhost.localdomain", "ip6-localhost", "%31%32%37.0.0.1", "svc.internal",
                                  "printer.local"])
async def test_ssrf_allow_exempts_them_at_registration_and_call_time(make_app, aiohttp_client, fake_dns, up,
                                                                    host):
    fake_dns.records["svc.internal"] = [("127.0.0.1", 60)]
    fake_dns.records["printer.local"] = [("127.0.0.1", 60)]
    client, h = await _client_for(aiohttp_client, make_app, ssrf_allow=("127.0.0.0/8",))
    resp = await register(client, h, f"http://{host}:{up.port}/v1")
    assert resp.status == 201, await resp.text()
    r = await client.get("/call/t/x", headers=h)
    assert r.status == 200, await r.text()
    assert up.last.target == "/v1/x"


async def test_ssrf_allow_does_not_exempt_a_site_local_name_resolving_elsewhere(make_app, aiohttp_client,
                                                                                fake_dns):
    fake_dns.records["db.internal"] = [("127.0.0.1", 60), ("93.184.216.34", 60)]
    client, h = await _client_for(aiohttp_client, make_app, ssrf_allow=("127.0.0.0/8",))
    await refused(await register(client, h, "http://db.internal/v1"))


@pytest.mark.parametrize("host", ["db.internal", "nas.local"])
async def test_call_time_refuses_what_registration_refuses(gateway, public_dns, up, host):
    """A tool registered before the check (the guard switched off for its registration) is refused at
    call time the same way: a special-use name resolving to a public address is still not dialled."""
    svc = gateway.services
    policy = svc.ssrf
    svc.ssrf = replace(policy, enabled=False)
    try:
        await gateway.tool("legacy", f"http://{host}:{up.port}/v1")
    finally:
        svc.ssrf = policy
    r = await gateway.call("GET", "/call/legacy/x")
    assert r.status == 502, await r.text()
    body = await r.json()
    assert body["error"] == "ssrf_refused" and r.headers["X-Treg-Error"] == "1"
    assert up.exchanges == []


# -- hosts no call could use are malformed (issue 20 item 11: they were stored, 201) -----------------

@pytest.mark.parametrize("base_url", [
    "https://api.example.com%00.evil/v1", "https://api.example.com%40evil.example/v1", "https://evil%2Fx.example/",
    "https://evil%2fx.example/", "https://api.example\\evil.example/", "https://api.example.com\\@evil.example/",
    "https://api%252Fevil.example/", "https://a%3A80.example/", "https://a%20b.example/", "https://a%5Bb%5D.example/",
    "https://a%25.example/", "https://a%ff.example/",
])
async def test_a_host_no_call_could_use_is_refused_on_register_and_patch(client, owner, base_url):
    resp = await register(client, owner["headers"], base_url)
    body = await resp.json()
    assert resp.status == 400 and body["error"] == "invalid_base_url" and body["blame"] == "caller", body
    assert resp.headers["X-Treg-Error"] == "1"
    tool = await (await register(client, owner["headers"], "https://93.184.216.34/v1", name="ok")).json()
    resp = await client.patch(f"/api/v1/tools/{tool['id']}", json={"base_url": base_url}, headers=owner["headers"])
    body = await resp.json()
    assert resp.status == 400 and body["error"] == "invalid_base_url", body
    listed = await (await client.get("/api/v1/tools", headers=owner["headers"])).json()
    assert [t["base_url"] for t in listed["tools"]] == ["https://93.184.216.34/v1"]  # nothing stored or changed


@pytest.mark.parametrize("base_url", ["https://user:p%40ss@93.184.216.34/v1", "https://[2606:4700::1111]:8443/v1",
                                      "https://ex%61mple.com/v1"])
async def test_percent_encoding_elsewhere_still_registers(client, owner, fake_dns, base_url):
    fake_dns.records["example.com"] = [("93.184.216.34", 60)]
    resp = await register(client, owner["headers"], base_url)
    assert resp.status == 201, await resp.text()
