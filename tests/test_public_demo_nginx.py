"""The public demo behind a real nginx (Debian's) with the configuration docs/operations.md gives: the
demo gate counts a visitor by the client address the access log reads (``X-Forwarded-For`` of a trusted
proxy, read from the right: the entry nginx appended), so what a visitor forges there counts for nothing;
straight to treg from an untrusted peer, a forged header is not read at all."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from treg import membership, money, public_demo
from treg.app import make_runner
from treg.keys import SERVICES
from treg.testing import ProviderPlugin, nginx, raw_exchange, raw_request_bytes
from treg.settings import SecretStr
from treg.testing.vendors.tables import PLATFORM, crm_provider, vendor_upstream


@pytest.fixture
async def demo_behind(make_app, tmp_path):
    if (why := nginx.available()) is not None:
        pytest.skip(why)
    vendor, up = vendor_upstream()
    async with up:
        port = nginx.free_port()
        app = make_app(extra_plugins=(ProviderPlugin([crm_provider(up.url + "/v1")]),), ssrf_allow=("127.0.0.0/8",),
                       platform={k: SecretStr(v) for k, v in PLATFORM.items()}, anonymous_providers=("crm",),
                       public_url=f"https://127.0.0.1:{port}/treg", trusted_proxies=("127.0.0.1",),
                       demo_endpoints=("crm.status",), demo_calls_per_hour=2)
        runner = make_runner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        treg_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        proxy = nginx.Nginx(tmp_path / "nginx", f"127.0.0.1:{treg_port}", prefix="/treg", port=port)
        try:
            await asyncio.to_thread(proxy.start)
            svc = app[SERVICES]
            org = await membership.create_org(svc, slug="show", email="o@show.test")
            await money.grant(svc, org_id=org["org_id"], amount_micro=1_000_000, actor="t")
            await public_demo.set_enabled(svc, "show", True)
            token = (await public_demo.issue_token(svc, "show"))["token"]
            yield proxy, treg_port, token, up
        finally:
            await asyncio.to_thread(proxy.stop)
            await runner.cleanup()


async def test_forged_forwarded_for_counts_for_nothing_through_the_proxy_or_around_it(demo_behind):
    proxy, treg_port, token, up = demo_behind

    async def via_proxy(path: str, source: str, forged: str | None) -> int:
        headers = [("Host", f"127.0.0.1:{proxy.port}"), ("X-Treg-Token", token)]
        if forged is not None:
            headers.append(("X-Forwarded-For", forged))
        reply = await raw_exchange(proxy.port, raw_request_bytes("GET", "/treg" + path, headers),
                                   tls=proxy.client_context(), source=source)
        assert reply.header("X-Treg-Demo") == "1"
        return reply.status

    async def direct(path: str, source: str, forged: str) -> int:
        headers = [("X-Treg-Token", token), ("X-Forwarded-For", forged)]
        reply = await raw_exchange(treg_port, raw_request_bytes("GET", path, headers), source=source)
        return reply.status

    # a visitor at 127.0.0.3 writes a new address each time: nginx's own entry, appended after it, counts
    statuses = [await via_proxy("/catalog/call/crm.status", "127.0.0.3", f"203.0.113.{i}") for i in range(4)]
    assert statuses == [200, 200, 429, 429]
    assert await via_proxy("/catalog/call/crm.status", "127.0.0.4", "127.0.0.3") == 200  # another visitor
    # straight to treg from 127.0.0.2, not a trusted proxy: its X-Forwarded-For is not read at all
    assert [await direct("/catalog/call/crm.status", "127.0.0.2", f"198.51.100.{i}") for i in range(3)] == [200, 200, 429]
    assert len(up.exchanges) == 5
    # and no management route, whichever way it comes
    for source in ("127.0.0.5", "127.0.0.6"):
        assert await via_proxy("/api/v1/me", source, "127.0.0.1") == 403
    reply = await raw_exchange(treg_port, raw_request_bytes("GET", "/api/v1/org", [("X-Treg-Token", token)]),
                               source="127.0.0.7")
    assert reply.status == 403 and json.loads(reply.body)["error"] == "demo_not_allowed"
