"""Plain HTTP and MCP say the same to an agent: a catalog search that finds nothing gives the same hint
and capabilities on ``GET /api/v1/catalog/endpoints?q=…`` and MCP ``catalog_search`` (one function makes
both), and a capacity refusal carries ``resets_at`` and ``retry_after_s`` on both (``Retry-After`` too
over HTTP). Over real sockets: treg on 127.0.0.1, MCP over its HTTP transport, the fake vendor of
treg/testing/vendors/capacity.py (a plugin file in TREG_PLUGINS_DIR) on a raw socket."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone

import pytest

from treg import membership, money
from treg.keys import SERVICES
from treg.settings import SecretStr
from treg.testing import Gateway, raw_upstream
from treg.testing import Mcp
from treg.testing.vendors.capacity import PLATFORM_KEYS, Vendor, answer, write_plugin

GAP = 0.2
ITEMS = "/catalog/call/vend.items.get?item_id=1"


@pytest.fixture
async def world(make_app, aiohttp_client, tmp_path):
    vendor = Vendor()
    async with raw_upstream(vendor) as up:
        write_plugin(tmp_path / "plugins", up.url)
        app = make_app(plugins_dir=tmp_path / "plugins", ssrf_allow=("127.0.0.0/8",),
                       platform={k: SecretStr(v) for k, v in PLATFORM_KEYS.items()}, capacity_strike_gap_s=GAP)
        client = await aiohttp_client(app)
        org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
        await money.grant(client.app[SERVICES], org_id=org["org_id"], amount_micro=100_000, actor="test")
        yield Gateway(client, org), vendor
        await client.close()


async def test_a_search_with_no_match_guides_alike_over_http_and_mcp(world):
    gw, _ = world
    http = await gw.api("GET", "/api/v1/catalog/endpoints?q=zebra+xylophone", expect=200)
    result = await Mcp(gw).call("catalog_search", {"query": "zebra xylophone"})
    mcp = result["structuredContent"]
    assert http["endpoints"] == [] == mcp["endpoints"]
    assert http["hint"] == mcp["hint"] and "capabilit" in http["hint"]
    assert http["capabilities"] == mcp["capabilities"] == sorted(gw.services.catalog.capabilities)
    assert "items.lookup" in http["capabilities"]
    assert "items.lookup" in result["content"][0]["text"]  # a model reading only text sees them too
    by_capability = await gw.api("GET", "/api/v1/catalog/endpoints?capability=zebra", expect=200)
    assert by_capability["endpoints"] == [] and by_capability["capabilities"] == http["capabilities"]
    found = await gw.api("GET", "/api/v1/catalog/endpoints?q=items", expect=200)
    assert found["endpoints"] and "hint" not in found and "capabilities" not in found


async def test_a_capacity_refusal_carries_resets_at_and_retry_after_s_over_http_and_mcp(world):
    gw, vendor = world
    reset = int(time.time()) + 120
    quota = answer(429, b'{"error": "daily allowance used"}', [("X-Quota", "daily"), ("X-Quota-Reset", str(reset))])
    vendor.then(quota, quota)
    for i in range(2):  # two strikes the gap apart lock treg's key for the endpoint until the reset
        r = await gw.call("GET", ITEMS)
        assert r.status == 429
        await r.read()
        await asyncio.sleep(GAP + 0.05)
    vendor.then(quota)
    r = await gw.call("GET", ITEMS)  # the probe the lock lets through
    await r.read()
    stated = datetime.fromtimestamp(reset, timezone.utc).isoformat().replace("+00:00", "Z")
    r = await gw.call("GET", ITEMS)
    body = await r.json()
    assert r.status == 503 and body["error"] == "provider_capacity" and body["resets_at"] == stated
    assert body["retry_after_s"] == int(r.headers["Retry-After"]) and 100 <= body["retry_after_s"] <= 120
    result = await Mcp(gw).call("catalog_call", {"endpoint": "vend.items.get", "params": {"item_id": "1"}})
    sc = result["structuredContent"]
    assert result["isError"] is True and sc["error"] == "provider_capacity" and sc["status"] == 503
    assert sc["resets_at"] == stated and 100 <= sc["retry_after_s"] <= 120
    assert '"retry_after_s"' in result["content"][0]["text"]
