"""The call-time SSRF guard through /call/: a refusal is a 502 with X-Treg-Error and nothing is sent,
also when a kept-alive connection to the host already exists (DNS rebinding)."""

from treg import membership
from treg.keys import SERVICES
from treg.testing import ALLOW_ONE, Gateway, upstream_pair


async def test_rebinding_is_refused_before_anything_is_sent(aiohttp_client, make_app, fake_dns):
    client = await aiohttp_client(make_app(ssrf_allow=ALLOW_ONE))
    org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
    gw = Gateway(client, org)
    async with upstream_pair() as (allowed, inside):
        fake_dns.records["api.rebind.test"] = [("127.0.0.1", 0)]  # TTL 0: asked before every send
        await gw.tool("t", f"http://api.rebind.test:{allowed.port}/v1")
        r = await gw.call("GET", "/call/t/x")
        assert r.status == 200 and allowed.last.target == "/v1/x"
        # the name now points inside; the kept-alive connection to 127.0.0.1 must not be reused
        fake_dns.records["api.rebind.test"] = [("127.0.0.2", 0)]
        r = await gw.call("GET", "/call/t/y")
        body = await r.json()
        assert r.status == 502 and body["error"] == "ssrf_refused" and r.headers["X-Treg-Error"] == "1"
        assert len(allowed.exchanges) == 1 and inside.connections == 0
        detail = await gw.api("GET", f"/api/v1/calls/{r.headers['X-Treg-Call-Id']}", expect=200)
        assert detail["refused_by"] == "ssrf" and detail["outcome"] == "refused"
        # URL passthrough is guarded the same way
        r = await gw.call("GET", f"/call/http://api.rebind.test:{allowed.port}/v1/z")
        assert r.status == 502 and (await r.json())["error"] == "ssrf_refused"
        assert len(allowed.exchanges) == 1
    await client.close()
