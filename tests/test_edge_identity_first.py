"""Identity before work on the call surface: a caller without a valid token gets its 401 before treg
reads or decodes any of the body; an identified caller's body refusals are audited."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
import time

from treg.testing import raw_request_bytes, read_reply
from treg.web import call as call_edge


async def _partial_upload(port: int, head: bytes, part: bytes):
    """Headers and only ``part`` of the declared body; the answer must come without the rest."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + part)
        await writer.drain()
        started = time.monotonic()
        reply = await asyncio.wait_for(read_reply(reader), 5)
        return reply, time.monotonic() - started
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def _assert_401(r) -> None:
    assert r.status == 401, (r.status, r.body)
    assert r.header("X-Treg-Error") == "1" and r.header("X-Treg-Call-Id")
    assert set(r.json()) >= {"error", "detail", "blame"}


async def test_a_declared_large_encoded_body_without_token_is_401_at_once(gateway, up, tool):
    head = raw_request_bytes("POST", "/call/up/x", [("X-Treg-Body-Encoding", "gzip"),
                                                     ("Content-Length", str(10 * 1024 * 1024))])
    r, waited = await _partial_upload(gateway.client.port, head, b"\x1f\x8b" + b"\0" * 1000)
    _assert_401(r)
    assert waited < 3
    assert up.exchanges == []


async def test_a_small_declared_body_without_token_is_401_before_it_arrives(gateway, up, tool):
    head = raw_request_bytes("POST", "/call/up/x", [("X-Treg-Token", "treg_wrong"), ("Content-Length", "50000")])
    r, waited = await _partial_upload(gateway.client.port, head, b"x" * 100)
    _assert_401(r)
    assert waited < 3


async def test_a_gzip_bomb_with_a_bogus_token_is_never_decoded(gateway, up, tool, monkeypatch):
    decoded = []
    real = call_edge._decode_body

    def spy(*args, **kw):
        decoded.append(args[0])
        return real(*args, **kw)

    monkeypatch.setattr(call_edge, "_decode_body", spy)
    bomb = gzip.compress(b"\0" * (32 * 1024 * 1024))  # 32 MiB of zeros in ~32 KB
    r = await gateway.raw("POST", "/call/up/x", [("X-Treg-Token", "treg_bogus"), ("X-Treg-Body-Encoding", "gzip")],
                          bomb, auth=False)
    _assert_401(r)
    assert decoded == []
    # the same bomb from an identified caller is decoded (and refused: larger than the limit)
    r = await gateway.raw("POST", "/call/up/x", [("X-Treg-Body-Encoding", "gzip")], bomb)
    assert r.status == 400 and r.json()["error"] == "body_too_large"
    assert decoded == ["gzip"]


async def _audited(gateway, count: int) -> list[dict]:
    for _ in range(250):  # the audit writer flushes in batches
        calls = await gateway.calls()
        if len(calls) >= count:
            return calls
        await asyncio.sleep(0.02)
    return await gateway.calls()


async def test_an_identified_callers_body_refusals_are_audited(gateway, up, tool):
    r = await gateway.raw("POST", "/call/up/x", [("X-Treg-Body-Encoding", "base64")], b"%%% not base64 %%%")
    assert r.status == 400 and r.json()["error"] == "invalid_body_encoding"
    limit = gateway.services.settings.body_decode_max_bytes
    head = raw_request_bytes("POST", "/call/up/x", [("X-Treg-Token", gateway.org["token"]),
                                                     ("X-Treg-Body-Encoding", "base64"),
                                                     ("Content-Length", str(limit + 1))])
    r, _ = await _partial_upload(gateway.client.port, head, b"QUJD")
    assert r.status == 400 and r.json()["error"] == "body_too_large"
    r = await gateway.raw("POST", "/call/up/x", [("X-Treg-Body-Encoding", "base64")],
                          base64.b64encode(b"fine"))
    assert r.status == 200
    calls = await _audited(gateway, 3)
    # rows of one audit batch share created_at (the transaction's now()): compare them as a set, not in order
    assert sorted((c["status"], c["outcome"]) for c in calls) == [(200, "ok"), (400, "refused"), (400, "refused")]
    details = [await gateway.api("GET", f"/api/v1/calls/{c['call_id']}", expect=200)
               for c in calls if c["outcome"] == "refused"]
    assert sorted(d["error_code"] for d in details) == ["body_too_large", "invalid_body_encoding"]
    assert all(d["blame"] == "caller" for d in details)
    assert up.last.body == b"fine"
    assert len(up.exchanges) == 1


async def test_no_token_no_audit_row(gateway, up, tool):
    r = await gateway.raw("POST", "/call/up/x", [("X-Treg-Body-Encoding", "base64")], b"QUJD", auth=False)
    _assert_401(r)
    assert await gateway.calls() == []  # the list flushes the audit writer first
