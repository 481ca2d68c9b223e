import pytest

from treg import membership
from treg.keys import SERVICES
from treg.testing import http_response, raw_upstream


@pytest.fixture
async def relay(aiohttp_client, make_app):
    client = await aiohttp_client(make_app(ssrf_allow=("127.0.0.0/8",)))
    org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
    client.owner = {"X-Treg-Token": org["token"]}
    return client


async def test_named_call_injects_and_relays(relay):
    async with raw_upstream() as up:
        r = await relay.post("/api/v1/secrets", json={"name": "k", "value": "sk_live_abc123"}, headers=relay.owner)
        sid = (await r.json())["id"]
        r = await relay.post("/api/v1/tools", json={"name": "up", "base_url": up.url + "/v1",
                                                    "bindings": [{"location": "header", "name": "Authorization",
                                                                  "format": "Bearer {secret}", "secret_id": sid}]},
                             headers=relay.owner)
        assert r.status == 201, await r.text()
        r = await relay.get("/call/up/items/a%2Fb?x=1&x=2&y", headers={**relay.owner, "X-Treg-Invented": "1"})
        assert r.status == 200, await r.text()
        assert await r.read() == b"ok"
        assert r.headers["X-Treg-Call-Id"].startswith("call_")
        ex = up.last
        assert ex.target == "/v1/items/a%2Fb?x=1&x=2&y"
        assert ex.header("Authorization") == "Bearer sk_live_abc123"
        assert ex.header("X-Treg-Token") is None and ex.header("X-Treg-Invented") is None
        print(ex.raw)
