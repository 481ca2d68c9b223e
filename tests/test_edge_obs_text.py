"""A request header byte that is not UTF-8 (obs-text such as latin-1 ``caf\\xe9``) cannot be relayed as it
came: aiohttp's client writes header text as UTF-8 and would send ``caf\\xc3\\xa9``. treg refuses such a
request with 400 ``invalid_header`` instead of changing it silently (docs/architecture.md)."""

from __future__ import annotations

import asyncio

from treg.testing import raw_exchange


async def _audited(gateway) -> list[dict]:
    for _ in range(250):
        calls = await gateway.calls()
        if calls:
            return calls
        await asyncio.sleep(0.02)
    return []


async def test_a_latin1_header_byte_is_refused_before_any_upstream_connection(gateway, up, tool):
    token = gateway.org["token"].encode()
    data = (b"GET /call/up/u HTTP/1.1\r\nHost: h\r\nX-Treg-Token: " + token + b"\r\nX-Name: caf\xe9\r\n\r\n")
    r = await raw_exchange(gateway.client.port, data)
    assert r.status == 400, (r.status, r.body)
    assert r.header("X-Treg-Error") == "1" and r.header("X-Treg-Call-Id")
    body = r.json()
    assert body["error"] == "invalid_header" and body["blame"] == "caller"
    assert "X-Name" in body["detail"] and "caf" not in body["detail"]  # names the header, not its bytes
    assert up.connections == 0 and up.exchanges == []
    calls = await _audited(gateway)
    assert [(c["status"], c["outcome"]) for c in calls] == [(400, "refused")]


async def test_a_latin1_treg_control_header_is_refused_too(gateway, up, tool):
    token = gateway.org["token"].encode()
    data = (b"GET /call/up/u HTTP/1.1\r\nHost: h\r\nX-Treg-Token: " + token + b"\r\nX-Treg-Tag: t\xff\r\n\r\n")
    r = await raw_exchange(gateway.client.port, data)
    assert r.status == 400 and r.json()["error"] == "invalid_header"
    assert up.connections == 0


async def test_utf8_header_bytes_still_arrive_exactly(gateway, up, tool):
    token = gateway.org["token"].encode()
    data = (b"GET /call/up/u HTTP/1.1\r\nHost: h\r\nX-Treg-Token: " + token + b"\r\nX-Name: caf\xc3\xa9\r\n\r\n")
    r = await raw_exchange(gateway.client.port, data)
    assert r.status == 200, r.body
    assert b"\r\nX-Name: caf\xc3\xa9\r\n" in up.last.raw


async def test_without_a_valid_token_it_is_still_401(gateway, up, tool):
    data = b"GET /call/up/u HTTP/1.1\r\nHost: h\r\nX-Treg-Token: treg_nope\r\nX-Name: caf\xe9\r\n\r\n"
    r = await raw_exchange(gateway.client.port, data)
    assert r.status == 401
    assert up.connections == 0
