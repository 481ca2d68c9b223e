"""Spooled evidence for inline media, and free streamed downloads that bypass the buffer."""

import asyncio
import gc
import json

import pytest

from treg import membership, money
from treg.call import metered
from treg.keys import SERVICES
from treg.settings import SecretStr
from treg.testing import Gateway, ProviderPlugin, http_response, raw_upstream


def media_provider(base_url):
    return {
        "id": "gem", "base_url": base_url,
        "auth": [{"location": "header", "name": "X-Goog-Api-Key"}],
        "endpoints": [
            {"id": "gem.generate", "method": "POST", "path": "/generate", "params": [],
             "price": {"usage": [{"path": "usageMetadata.totalTokenCount", "micro_per_unit": 2}],
                       "estimate_micro": 50_000},
             "spooled_response": True},
            {"id": "gem.files.download", "method": "GET", "path": "/files/{name}",
             "params": [{"name": "name", "in": "path", "required": True}], "price": {"per_call_micro": 0}},
        ],
    }


def big_answer(mb=3, tokens=1234):
    image = "A" * (mb * 1024 * 1024)
    return json.dumps({"candidates": [{"content": {"parts": [{"inlineData": {"data": image}}]},
                                       "finishReason": "STOP"}],
                       "usageMetadata": {"totalTokenCount": tokens}}).encode()


@pytest.fixture
async def gem(aiohttp_client, make_app):
    payload = big_answer()
    async with raw_upstream(lambda ex: http_response(200, payload, [("Content-Type", "application/json")])) as up:
        app = make_app(extra_plugins=(ProviderPlugin([media_provider(up.url)]),), ssrf_allow=("127.0.0.0/8",),
                       platform={"TREG_PLATFORM_KEY_GEM": SecretStr("gem-platform")})
        client = await aiohttp_client(app)
        org = await membership.create_org(client.app[SERVICES], slug="g", email="g@g.test")
        gw = Gateway(client, org)
        await money.grant(gw.services, org_id=org["org_id"], amount_micro=1_000_000, actor="t")
        yield gw, up, payload
        await client.close()


async def test_spooled_answer_settles_from_usage_and_relays_every_byte(gem):
    gw, up, payload = gem
    r = await gw.call("POST", "/catalog/call/gem.generate", json={"contents": []})
    body = await r.read()
    assert r.status == 200 and body == payload
    assert r.headers["Content-Length"] == str(len(payload))
    assert r.headers["X-Treg-Cost-Micro"] == str(1234 * 2)
    budget = gw.services.spool_budget
    for _ in range(200):  # the handler closes the spool just after its last write reaches the client
        if budget.used == 0:
            break
        await asyncio.sleep(0.01)
    assert budget.used == 0  # the replay's close gave the budget back


async def test_spool_over_its_limit_is_502_and_free(gem, monkeypatch):
    gw, up, payload = gem
    monkeypatch.setattr(metered, "SPOOL_MAX", 1024 * 1024)
    r = await gw.call("POST", "/catalog/call/gem.generate", json={})
    body = await r.json()
    assert r.status == 502 and body["error"] == "response_buffer_limit" and r.headers["X-Treg-Cost-Micro"] == "0"
    bal = await gw.api("GET", "/api/v1/balance")
    assert bal["balance_micro"] == 1_000_000 and bal["held_micro"] == 0
    assert gw.services.spool_budget.used == 0


async def test_spool_budget_refuses_whole_answers_temporarily(gem):
    gw, up, payload = gem
    budget = metered.SpoolBudget(total=len(payload) + 10)  # room for one answer at a time
    gw.services.spool_budget = budget
    gate = asyncio.Event()

    async def trickle(ex):
        if ex.connection == 1 and len(up.exchanges) == 1:
            # the first answer declares its length, sends half, and waits: its claim is held whole
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
            ex.writer.write(head + payload[: len(payload) // 2])
            await ex.writer.drain()
            await asyncio.wait_for(gate.wait(), 10)
            ex.writer.write(payload[len(payload) // 2:])
            await ex.writer.drain()
            return b""
        return http_response(200, payload)

    up.responder = trickle
    first = asyncio.create_task(gw.call("POST", "/catalog/call/gem.generate", json={}))
    for _ in range(500):
        if budget.used:
            break
        await asyncio.sleep(0.01)
    assert budget.used == len(payload)
    second = await gw.call("POST", "/catalog/call/gem.generate", json={})
    body = await second.json()
    assert second.status == 502 and body["error"] == "response_buffer_limit" and "temporary" in body["detail"]
    gate.set()
    r1 = await first
    assert r1.status == 200 and await r1.read() == payload


async def test_spool_budget_is_claimed_whole_from_content_length(gem):
    gw, up, payload = gem
    budget = metered.SpoolBudget(total=len(payload) - 1)  # too small for one whole answer
    gw.services.spool_budget = budget
    r = await gw.call("POST", "/catalog/call/gem.generate", json={})
    body = await r.json()
    assert r.status == 502 and "temporary" in body["detail"] and budget.used == 0


def test_dropped_spool_returns_its_budget():
    import tempfile

    budget = metered.SpoolBudget(total=100)
    assert budget.claim(60)
    s = metered.Spooled(tempfile.TemporaryFile(), 60, 60, budget)
    del s
    gc.collect()
    assert budget.used == 0


async def test_spool_evidence_keeps_only_the_paths():
    import tempfile

    budget = metered.SpoolBudget(total=10 ** 9)
    f = tempfile.TemporaryFile()
    f.write(big_answer(mb=1))
    s = metered.Spooled(f, f.tell(), 0, budget)
    ev = await metered.spool_evidence(s, ["usageMetadata.totalTokenCount"])
    assert ev == {"usageMetadata": {"totalTokenCount": 1234}}
    s.close()


async def test_free_platform_download_streams_with_range_and_releases_the_claim(gem):
    gw, up, payload = gem
    content = bytes(range(256)) * 4096  # 1 MiB

    def ranged(ex):
        rng = ex.header("Range")
        if rng:
            start, end = (int(x) for x in rng.split("=")[1].split("-"))
            part = content[start:end + 1]
            return http_response(206, part, [("Content-Range", f"bytes {start}-{end}/{len(content)}"),
                                             ("Accept-Ranges", "bytes")], reason="Partial Content")
        return http_response(200, content)

    up.responder = ranged
    h = {"Range": "bytes=10-19", "Idempotency-Key": "dl-1"}
    r = await gw.call("GET", "/catalog/call/gem.files.download?name=out.png", headers=h)
    assert r.status == 206 and await r.read() == content[10:20]
    assert r.headers["Content-Range"] == f"bytes 10-19/{len(content)}"
    assert r.headers["X-Treg-Cost-Micro"] == "0" and r.headers["X-Treg-Credential-Tier"] == "platform"
    # the claim was released: the retry fetches the provider again rather than replaying
    r2 = await gw.call("GET", "/catalog/call/gem.files.download?name=out.png", headers=h)
    assert r2.status == 206 and "X-Treg-Idempotent-Replay" not in r2.headers
    assert len(up.exchanges) == 2
    full = await gw.call("GET", "/catalog/call/gem.files.download?name=out.png")
    assert await full.read() == content


@pytest.mark.parametrize("delta,ok", [(0, True), (-1, False)])
async def test_spool_limit_boundary(gem, monkeypatch, delta, ok):
    gw, up, payload = gem
    monkeypatch.setattr(metered, "SPOOL_MAX", len(payload) + delta)
    r = await gw.call("POST", "/catalog/call/gem.generate", json={})
    if ok:
        assert r.status == 200 and await r.read() == payload
    else:
        assert r.status == 502 and (await r.json())["error"] == "response_buffer_limit"
