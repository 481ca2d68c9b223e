"""Honest exits (the seed's exits table), with faults injected over real HTTP: an unexpected exception is
treg's failure, not a cancellation; a pool timeout before identity is a ``call_intake_failed`` event,
after it a ``db_pool`` failure; after the send, a cancellation or database error still records the call
once, closes the upstream once and closes the money hold once."""

from __future__ import annotations

import asyncio
import contextlib

from treg import authentication, idempotency, money
from treg.call import service
from treg.errors import DatabaseError
from treg.testing import audit_row, http_response, raw_request_bytes

BOUND = 10.0  # seconds any single wait may take (a bound, not a timing)
CREDITS = 100_000  # what the ``env`` gateway (tests/conftest.py) grants


async def assert_money_untouched(gw, hold_closes, call_id):
    async with gw.services.db.tx() as tx:
        hold = await tx.fetch_one("SELECT state, settled_micro FROM holds WHERE id = %(i)s", {"i": call_id})
    assert hold is not None and hold["state"] == "released" and hold["settled_micro"] == 0
    assert hold_closes == [("release", call_id)]  # closed exactly once
    bal = await money.balance(gw.services, gw.org["org_id"])
    assert bal.balance_micro == CREDITS and bal.held_micro == 0


async def wait_cached(gw):
    """The owner's identity in treg's cache (so a call needs no database to learn who is calling)."""
    svc, token = gw.services, gw.org["token"]
    for _ in range(int(BOUND / 0.02)):
        await authentication.authenticate(svc, token, None)
        if authentication.cached_identity(svc, token, None) is not None:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the identity cache never took the owner's identity")


# -- unexpected exceptions ---------------------------------------------------------------------------

async def test_unexpected_exception_in_a_stage_is_a_treg_failure(env, monkeypatch):
    gw, up, events = env

    async def broken(*a, **kw):
        raise RuntimeError("a bug in a stage")

    monkeypatch.setattr(service, "authorize", broken)
    r = await gw.call("GET", "/call/t/x")
    body = await r.json()
    assert r.status == 500 and r.headers["X-Treg-Error"] == "1"
    assert body["error"] == "internal_error" and body["blame"] == "treg" and "bug" not in body["detail"]
    row = await audit_row(gw, r.headers["X-Treg-Call-Id"])
    assert row["outcome"] == "gateway_failed" and row["failure_kind"] == "unexpected_exception"
    assert row["status"] == 500 and row["error_code"] == "internal_error" and row["blame"] == "treg"
    [ev] = events.named("tool_called")
    assert ev["outcome"] == "gateway_failed" and ev["failure_kind"] == "unexpected_exception"
    assert up.exchanges == []


async def test_unexpected_exception_after_the_hold_releases_it_once(env, monkeypatch, hold_closes):
    gw, up, events = env

    async def broken(*a, **kw):
        raise KeyError("relay stage bug")

    monkeypatch.setattr(service, "prepare", broken)
    r = await gw.call("GET", "/catalog/call/acme.items.get?item_id=1")
    assert r.status == 500 and (await r.json())["error"] == "internal_error"
    call_id = r.headers["X-Treg-Call-Id"]
    row = await audit_row(gw, call_id)
    assert row["outcome"] == "gateway_failed" and row["failure_kind"] == "unexpected_exception"
    assert row["hold_state"] == "released" and row["cost_micro"] == 0
    await assert_money_untouched(gw, hold_closes, call_id)


# -- database pool timeouts --------------------------------------------------------------------------

async def test_pool_timeout_before_identity_is_an_intake_event_only(env):
    gw, up, events = env
    member = await gw.member("m@x.test")  # a token nobody has used yet: not in the identity cache
    async with gw.services.db.connection():  # the pool's only connection, held
        r = await gw.call("GET", "/call/t/x", as_=member["headers"])
        body = await r.json()
    assert r.status == 503 and body["error"] == "db_pool" and body["blame"] == "treg"
    call_id = r.headers["X-Treg-Call-Id"]
    [ev] = events.named("call_intake_failed")
    assert ev["surface"] == "call" and ev["failure_kind"] == "db_pool" and ev["call_id"] == call_id
    assert not {"org_id", "member_id", "tool_id", "provider", "endpoint_id"} & set(ev)  # nothing of who or what
    assert events.named("tool_called") == [] and up.exchanges == []
    await gw.services.audit.flush()
    r = await gw.call("GET", f"/api/v1/calls/{call_id}")
    assert r.status == 404  # no org to record it under


async def test_pool_timeout_after_identity_is_a_db_pool_failure(env):
    gw, up, events = env
    await wait_cached(gw)
    async with gw.services.db.connection():
        r = await gw.call("GET", "/catalog/call/acme.items.get?item_id=1")
        body = await r.json()
    assert r.status == 503 and body["error"] == "db_pool"
    row = await audit_row(gw, r.headers["X-Treg-Call-Id"])
    assert row["outcome"] == "gateway_failed" and row["failure_kind"] == "db_pool" and row["status"] == 503
    assert row["cost_micro"] == 0
    assert [e["failure_kind"] for e in events.named("tool_called")] == ["db_pool"]
    assert events.named("call_intake_failed") == [] and up.exchanges == []
    bal = await money.balance(gw.services, gw.org["org_id"])
    assert bal.balance_micro == CREDITS and bal.held_micro == 0


# -- after the send ----------------------------------------------------------------------------------

async def test_caller_leaving_during_the_head_peek_is_recorded_and_closes_the_upstream_once(env, closes):
    gw, up, events = env
    answered = asyncio.Event()
    treg_closed = asyncio.Event()

    async def failing_slowly(ex):
        # a failed answer whose body does not come: treg waits in its 8 KiB evidence peek
        ex.writer.write(b"HTTP/1.1 500 Oops\r\nContent-Length: 100000\r\n\r\n")
        await ex.writer.drain()
        answered.set()
        with contextlib.suppress(asyncio.TimeoutError, ConnectionError):
            if await asyncio.wait_for(ex.reader.read(1), BOUND) == b"":
                treg_closed.set()
        return None

    up.responder = failing_slowly
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.client.port)
    writer.write(raw_request_bytes("GET", "/call/t/slow", [("X-Treg-Token", gw.org["token"])]))
    await writer.drain()
    await asyncio.wait_for(answered.wait(), BOUND)
    await asyncio.sleep(0.05)  # treg is in the peek now
    writer.close()  # the caller hangs up before any byte of the answer went out
    await asyncio.wait_for(treg_closed.wait(), BOUND)
    [closer] = await closes.wait_closed(1)
    assert closes.effective(closer) == [False]  # closed once, and not as a completed read
    for _ in range(int(BOUND / 0.02)):
        rows = await gw.calls()
        if rows:
            break
        await asyncio.sleep(0.02)
    [row] = rows
    assert row["outcome"] == "cancelled" and row["status"] == 500
    assert [e["outcome"] for e in events.named("tool_called")] == ["cancelled"]


async def test_database_error_during_the_idempotency_abandon_is_recorded_and_closes_once(env, closes, monkeypatch):
    gw, up, events = env
    up.responder = lambda ex: http_response(200, b"file bytes")

    async def failing_abandon(svc, claim):
        raise DatabaseError("the database failed the request", code="database_error")

    monkeypatch.setattr(idempotency, "abandon", failing_abandon)
    r = await gw.call("GET", "/catalog/call/files.get?name=a.png", headers={"Idempotency-Key": "dl-1"})
    body = await r.json()
    assert r.status == 503 and body["error"] == "database_error" and r.headers["X-Treg-Error"] == "1"
    row = await audit_row(gw, r.headers["X-Treg-Call-Id"])
    assert row["outcome"] == "gateway_failed" and row["error_code"] == "database_error"
    assert row["credential_tier"] == "platform"
    [closer] = await closes.wait_closed(1)
    assert len(closes.effective(closer)) == 1
    assert len(events.named("tool_called")) == 1


async def test_database_error_during_a_billed_abandon_releases_the_hold_once(env, closes, monkeypatch, hold_closes):
    gw, up, events = env

    async def failing_abandon(svc, claim):
        raise DatabaseError("the database failed the request", code="database_error")

    monkeypatch.setattr(idempotency, "abandon", failing_abandon)
    r = await gw.call("POST", "/catalog/call/files.render", json={}, headers={"Idempotency-Key": "r-1"})
    assert r.status == 503 and r.headers["X-Treg-Cost-Micro"] == "0"
    call_id = r.headers["X-Treg-Call-Id"]
    row = await audit_row(gw, call_id)
    assert row["outcome"] == "gateway_failed" and row["hold_state"] == "released"
    await assert_money_untouched(gw, hold_closes, call_id)
    [closer] = await closes.wait_closed(1)
    assert len(closes.effective(closer)) == 1
    assert len(events.named("tool_called")) == 1
