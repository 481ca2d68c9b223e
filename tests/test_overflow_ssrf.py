"""The aggregator session is SSRF-vetted like upstreams (api.md "DNS"; issue 20 item 11): an operator's
``TREG_OVERFLOW_URL_<NAME>`` pointed at an internal address is never dialled (by address, by a name
resolving inside, or over a kept-alive connection after the name moved inside), unless
``TREG_SSRF_ALLOW`` exempts it. A refusal is an aggregator failure (contract: "An aggregator failure is
data"): the caller gets the 503 ``provider_capacity``, the aggregator is marked, no money moves.

Here the vendor lives on 127.0.0.1 (exempted); the "internal" aggregator on 127.0.0.2 is not."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web

from treg.testing.vendors.overflow import Fake, make_world, orth_ok

ALLOW_VENDOR_ONLY = ("127.0.0.1/32",)


async def _internal_aggregator(aiohttp_server: Any) -> Fake:
    fake = Fake(reply=orth_ok())
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    server = await aiohttp_server(app, host="127.0.0.2")
    fake.url = f"http://127.0.0.2:{server.port}"
    return fake


async def _assert_refused_as_a_failure(world: Any, internal: Fake, caplog: Any, host: str) -> None:
    r, _ = await world.call()
    # refused by the guard, not merely unreachable (the old session resolved through the system: a name
    # only treg's resolver knows failed there too, for another reason)
    assert f"ssrf: refused upstream host {host}" in caplog.text
    call_id = r.headers["X-Treg-Call-Id"]
    err = await r.json()
    assert r.status == 503 and err["error"] == "provider_capacity" and r.headers["X-Treg-Error"] == "1"
    assert r.headers["X-Treg-Cost-Micro"] == "0"
    assert internal.seen == []  # never reached
    assert "overflow:orthogonal" in await world.marks()
    holds = await world.holds()
    assert {k: v["state"] for k, v in holds.items()} == {call_id: "released", call_id + ":overflow": "released"}
    bal = await world.balance()
    assert bal.balance_micro == bal.granted_micro


async def test_an_aggregator_url_on_an_internal_address_is_never_dialled(make_app, aiohttp_server, aiohttp_client,
                                                                        fake_dns, caplog):
    internal = await _internal_aggregator(aiohttp_server)
    world = await make_world(make_app, aiohttp_server, aiohttp_client, ssrf_allow=ALLOW_VENDOR_ONLY,
                             overflow_urls={"ORTHOGONAL": internal.url})
    await _assert_refused_as_a_failure(world, internal, caplog, "127.0.0.2")


async def test_an_aggregator_name_resolving_inside_is_never_dialled(make_app, aiohttp_server, aiohttp_client,
                                                                   fake_dns, caplog):
    internal = await _internal_aggregator(aiohttp_server)
    fake_dns.records["agg.test"] = [("127.0.0.2", 0)]
    port = internal.url.rsplit(":", 1)[1]
    world = await make_world(make_app, aiohttp_server, aiohttp_client, ssrf_allow=ALLOW_VENDOR_ONLY,
                             overflow_urls={"ORTHOGONAL": f"http://agg.test:{port}"})
    await _assert_refused_as_a_failure(world, internal, caplog, "agg.test")


async def test_a_kept_alive_aggregator_connection_is_vetted_again(make_app, aiohttp_server, aiohttp_client,
                                                                 fake_dns):
    """The name pointed at an allowed address, then moved inside (TTL 0): the pooled connection to the
    old address is not used for one more request."""
    world0 = await make_world(make_app, aiohttp_server, aiohttp_client, ssrf_allow=ALLOW_VENDOR_ONLY)
    port = world0.orth.url.rsplit(":", 1)[1]  # a fake Orthogonal on 127.0.0.1
    fake_dns.records["agg.test"] = [("127.0.0.1", 0)]
    world = await make_world(make_app, aiohttp_server, aiohttp_client, ssrf_allow=ALLOW_VENDOR_ONLY,
                             org_slug="beta", overflow_urls={"ORTHOGONAL": f"http://agg.test:{port}"})
    orth = world0.orth
    r, _ = await world.call()
    assert r.status == 200 and r.headers["X-Treg-Served-Via"] == "overflow:orthogonal" and len(orth.seen) == 1
    fake_dns.records["agg.test"] = [("10.9.8.7", 0)]
    r, _ = await world.call()
    assert r.status == 503 and (await r.json())["error"] == "provider_capacity"
    assert len(orth.seen) == 1  # the kept-alive connection carried nothing more


@pytest.mark.parametrize("allow", [("127.0.0.0/8",), ("127.0.0.1/32", "127.0.0.2/32")])
async def test_ssrf_allow_exempts_an_aggregator_address(make_app, aiohttp_server, aiohttp_client, fake_dns, allow):
    internal = await _internal_aggregator(aiohttp_server)
    world = await make_world(make_app, aiohttp_server, aiohttp_client, ssrf_allow=allow,
                             overflow_urls={"ORTHOGONAL": internal.url})
    r, body = await world.call()
    assert r.status == 200 and r.headers["X-Treg-Served-Via"] == "overflow:orthogonal", body
    assert len(internal.seen) == 1
