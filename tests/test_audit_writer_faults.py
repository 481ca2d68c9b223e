"""The audit writer through faults (treg/call/audit.py; docs/operations.md "When the database is
away"): no row is lost while the database stays away for longer than the writer's tries once lasted
(five in half a second, then the batch was dropped); a row the database refuses costs only itself, not
the batch of every org's rows it rides in; an ``X-Treg-Tag`` no limit could read is refused at intake,
where it once reached the batch and failed it; the queue kept through an outage is bounded, and so is
a shutdown's wait for a database that stays away.

Real parts: the test's own database, made unreachable by refusing its connections and cutting the
open ones (``ALLOW_CONNECTIONS false``, ``pg_terminate_backend``); treg on a real socket; the
raw-socket upstream."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Iterator

import psycopg2.extensions

from treg import membership
from treg.call_record import CallRecord
from treg.keys import SERVICES
from treg.testing import Gateway, dsn_for, http_response, raw_exchange, raw_upstream, run_sql, within


@contextlib.contextmanager
def _database_away(base: str, dsn: str) -> Iterator[None]:
    """The test's database refuses every new connection and its open ones are cut, until the block ends."""
    name = psycopg2.extensions.parse_dsn(dsn)["dbname"]
    admin = dsn_for(base, "postgres")
    run_sql(admin, f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
    try:
        run_sql(admin, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", name)
        yield
    finally:
        run_sql(admin, f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS true')


@contextlib.asynccontextmanager
async def _gateway(aiohttp_client: Any, make_app: Any, **settings: Any) -> Any:
    async with raw_upstream(lambda ex: http_response(200, b"fine")) as up:
        client = await aiohttp_client(make_app(ssrf_allow=("127.0.0.0/8",), **settings))
        org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
        gw = Gateway(client, org)
        await gw.tool("t", up.url)
        try:
            yield gw, up
        finally:
            await client.close()


def _record(org_id: str, n: int, **fields: Any) -> CallRecord:
    return CallRecord(id=f"call_fault_{n}", org_id=org_id, member_id=None, surface="call", method="GET",
                      target="t/x", outcome="ok", status=200, **fields)


def _ids(dsn: str, org_id: str) -> set[str]:
    return {r[0] for r in run_sql(dsn, "SELECT id FROM calls WHERE org_id = %s", org_id)}


async def test_calls_answered_before_an_outage_are_all_written_once_the_database_is_back(
        make_app, aiohttp_client, pg_base, dsn):
    """Twelve calls answered, their rows queued (a long flush interval: nothing written yet); the database
    goes away for two seconds, four times the writer's old window before it dropped a batch. Every try
    meanwhile fails and keeps the rows; once it is back, one flush writes all twelve, once each."""
    async with _gateway(aiohttp_client, make_app, audit_flush_ms=600_000) as (gw, up):
        writer, org_id = gw.services.audit, gw.org["org_id"]
        answers = [await gw.call("GET", f"/call/t/{i}") for i in range(12)]
        assert {r.status for r in answers} == {200}
        sent = {r.headers["X-Treg-Call-Id"] for r in answers}
        with _database_away(pg_base, dsn):
            for _ in range(4):
                assert await writer.flush() is False
                await asyncio.sleep(0.5)
            assert writer.failing and writer.dropped == 0
            assert sent <= {rec.id for rec in writer._queue}
        assert await writer.flush() is True
        assert not writer.failing and writer.dropped == 0
        assert sent <= _ids(dsn, org_id)
        assert run_sql(dsn, "SELECT count(*) FROM calls WHERE id = ANY(%s)", list(sent)) == [(12,)]


async def test_the_writer_keeps_trying_by_itself_through_an_outage(make_app, aiohttp_client, pg_base, dsn):
    """The background loop (a 20 ms interval) through a two-second outage: it backs off instead of
    dropping, and writes the rows queued meanwhile on its own once the database is back."""
    async with _gateway(aiohttp_client, make_app) as (gw, up):
        writer, org_id = gw.services.audit, gw.org["org_id"]
        with _database_away(pg_base, dsn):
            for i in range(30):
                writer.record(_record(org_id, i))
            await within(10, lambda: writer.failing)
            await asyncio.sleep(2)
            assert writer.dropped == 0 and len(writer._queue) == 30
        await within(15, lambda: asyncio.to_thread(lambda: len(_ids(dsn, org_id)) == 30))
        assert writer.dropped == 0 and not writer.failing


async def test_one_row_the_database_refuses_costs_only_itself(make_app, aiohttp_client, dsn, caplog):
    """A batch of twenty rows, one carrying a tag longer than its column (as a plugin's or a future
    stage's value might): the batch is written by halves, the nineteen others are stored, the one is
    dropped, logged by its call id. A row already stored (its earlier statement's answer lost) is
    counted written, not dropped."""
    async with _gateway(aiohttp_client, make_app, audit_flush_ms=600_000) as (gw, up):
        writer, org_id = gw.services.audit, gw.org["org_id"]
        for i in range(20):
            writer.record(_record(org_id, i, tag="t" * 300 if i == 13 else f"tag-{i}"))
        with caplog.at_level(logging.ERROR, logger="treg.call.audit"):
            assert await writer.flush() is True
        assert _ids(dsn, org_id) == {f"call_fault_{i}" for i in range(20) if i != 13}
        assert writer.dropped == 1 and "call_fault_13" in caplog.text
        written = writer.written
        writer.record(_record(org_id, 3, tag="tag-3"))  # stored already
        writer.record(_record(org_id, 99))
        assert await writer.flush() is True
        assert writer.dropped == 1 and writer.written == written + 2
        assert "call_fault_99" in _ids(dsn, org_id)


async def test_an_x_treg_tag_no_limit_can_read_is_refused_at_intake(make_app, aiohttp_client, dsn):
    """An own tool's call (no hold, so no limit read the tag before) with a tag over 200 characters, or
    with a space: 400 ``invalid_tag``, nothing sent upstream, the refusal audited without the tag. The
    rows beside them in the batch are all written; a 200-character tag is relayed and stored."""
    async with _gateway(aiohttp_client, make_app, audit_flush_ms=600_000) as (gw, up):
        writer, org_id = gw.services.audit, gw.org["org_id"]
        before = await gw.call("GET", "/call/t/before")
        refused = [await gw.call("GET", "/call/t/x", headers={"X-Treg-Tag": tag})
                   for tag in ("t" * 201, "a b")]
        for r in refused:
            assert r.status == 400 and (await r.json())["error"] == "invalid_tag"
        assert len(up.exchanges) == 1
        # refused for another reason first (a header that is not UTF-8): its row goes without the tag too
        head = (b"GET /call/t/z HTTP/1.1\r\nHost: h\r\nX-Treg-Token: " + gw.org["token"].encode()
                + b"\r\nX-Treg-Tag: " + b"t" * 201 + b"\r\nX-Name: caf\xe9\r\n\r\n")
        latin1 = await raw_exchange(gw.client.port, head)
        assert latin1.status == 400 and latin1.json()["error"] == "invalid_header"
        longest = await gw.call("GET", "/call/t/y", headers={"X-Treg-Tag": "t" * 200})
        assert longest.status == 200 and len(up.exchanges) == 2
        assert await writer.flush() is True and writer.dropped == 0
        rows = dict((r[0], r[1:]) for r in run_sql(
            dsn, "SELECT id, outcome, error_code, tag FROM calls WHERE org_id = %s", org_id))
        assert rows[before.headers["X-Treg-Call-Id"]] == ("ok", None, None)
        for r in refused:
            assert rows[r.headers["X-Treg-Call-Id"]] == ("refused", "invalid_tag", None)
        assert rows[latin1.header("X-Treg-Call-Id")] == ("refused", "invalid_header", None)
        assert rows[longest.headers["X-Treg-Call-Id"]] == ("ok", None, "t" * 200)


async def test_the_queue_kept_through_an_outage_is_bounded(make_app, aiohttp_client, pg_base, dsn, caplog):
    """``TREG_AUDIT_QUEUE_MAX`` rows at most wait through an outage: beyond it the oldest are dropped,
    counted and logged; the newest are written once the database is back."""
    async with _gateway(aiohttp_client, make_app, audit_flush_ms=600_000, audit_queue_max=5) as (gw, up):
        writer, org_id = gw.services.audit, gw.org["org_id"]
        with _database_away(pg_base, dsn), caplog.at_level(logging.ERROR, logger="treg.call.audit"):
            for i in range(8):
                writer.record(_record(org_id, i))
            assert await writer.flush() is False
            assert writer.dropped == 3 and len(writer._queue) == 5
            assert "3 oldest rows dropped" in caplog.text
        assert await writer.flush() is True
        assert _ids(dsn, org_id) == {f"call_fault_{i}" for i in range(3, 8)}


async def test_a_shutdown_waits_for_a_database_that_stays_away_only_so_long(make_app, aiohttp_client, pg_base,
                                                                            dsn, caplog):
    """``TREG_AUDIT_CLOSE_S`` bounds a shutdown's tries; a row and a token's use only, or nothing at all,
    do not make it wait longer (a batch of token uses alone once looped without end)."""
    async with _gateway(aiohttp_client, make_app, audit_flush_ms=600_000, audit_close_s=1.0) as (gw, up):
        writer, org_id = gw.services.audit, gw.org["org_id"]
        assert (await gw.client.get("/api/v1/me", headers=gw.owner)).status == 200  # a token's use to write
        with _database_away(pg_base, dsn), caplog.at_level(logging.ERROR, logger="treg.call.audit"):
            writer.record(_record(org_id, 1))
            t0 = asyncio.get_running_loop().time()
            await asyncio.wait_for(writer.close(), 10)
            assert 0.5 < asyncio.get_running_loop().time() - t0 < 3
            assert "1 rows it could not write" in caplog.text


async def test_token_uses_alone_wait_through_an_outage_too(make_app, aiohttp_client, pg_base, dsn):
    """A flush with no row, only tokens' last use to write, while the database is away: it fails and
    returns (once, it looped on the failed statement without end), and writes them once it is back."""
    async with _gateway(aiohttp_client, make_app, audit_flush_ms=600_000) as (gw, up):
        writer = gw.services.audit
        assert (await gw.client.get("/api/v1/me", headers=gw.owner)).status == 200
        assert await writer.flush() is True  # the org's creation and that call: written
        assert (await gw.client.get("/api/v1/me", headers=gw.owner)).status == 200
        assert writer._touched and not writer._queue
        with _database_away(pg_base, dsn):
            assert await asyncio.wait_for(writer.flush(), 10) is False
            assert writer._touched
        assert await writer.flush() is True and not writer._touched




async def test_token_uses_the_database_refuses_are_dropped_not_tried_without_end(make_app, aiohttp_client,
                                                                                 monkeypatch, caplog):
    """The tokens' last use alone, refused for what it carries (a fault put in the statement: no value
    treg sends today is refused): the flush ends, logged, instead of trying the same statement forever."""
    from treg.errors import DataRefused

    async with _gateway(aiohttp_client, make_app, audit_flush_ms=600_000) as (gw, up):
        writer, db = gw.services.audit, gw.services.db
        assert await writer.flush() is True
        real_run = db.run

        async def run(sql: str, params: Any, **kw: Any) -> Any:
            # the batch of no rows: its rows as the statement's literal (audit.batch_statement) or parameter
            if "$treg_rows$[]$treg_rows$" in sql or (params or {}).get("rows") == "[]":
                raise DataRefused("refused", code="database_error")
            return await real_run(sql, params, **kw)

        monkeypatch.setattr(db, "run", run)
        writer.touch_token("tok_refused")
        with caplog.at_level(logging.ERROR, logger="treg.call.audit"):
            assert await asyncio.wait_for(writer.flush(), 10) is True
        assert not writer._touched and "tokens' last use dropped" in caplog.text


async def test_a_content_length_no_audit_row_can_hold_is_refused(make_app, aiohttp_client, dsn):
    """A declared ``Content-Length`` of 2**63 or more (llhttp takes up to 2**64 - 1): ``400
    body_too_large`` before anything is sent, and the refusal audited. Relayed, its row's
    ``request_bytes`` was a value PostgreSQL refused: a call that left no row."""
    async with _gateway(aiohttp_client, make_app, audit_flush_ms=600_000) as (gw, up):
        writer, org_id = gw.services.audit, gw.org["org_id"]
        ids = []
        for length in (2**63, 2**64 - 1):
            head = (b"POST /call/t/x HTTP/1.1\r\nHost: h\r\nX-Treg-Token: " + gw.org["token"].encode()
                    + b"\r\nContent-Length: " + str(length).encode() + b"\r\n\r\nabc")
            reply = await asyncio.wait_for(raw_exchange(gw.client.port, head), 10)
            assert reply.status == 400 and reply.json()["error"] == "body_too_large"
            ids.append(reply.header("X-Treg-Call-Id"))
        assert up.connections == 0
        assert await writer.flush() is True and writer.dropped == 0
        rows = dict((r[0], r[1:]) for r in run_sql(
            dsn, "SELECT id, outcome, error_code FROM calls WHERE org_id = %s", org_id))
        assert [rows[i] for i in ids] == [("refused", "body_too_large")] * 2


async def test_a_method_no_audit_row_can_hold_is_refused_at_the_edge(make_app, aiohttp_client, dsn, monkeypatch):
    """Under aiohttp's pure-Python parser (PyPy, ``AIOHTTP_NO_EXTENSIONS``), which takes any token as a
    method where llhttp knows a fixed list: a 17-character method is ``400 invalid_method`` before
    anything is sent, unrecorded, as llhttp's own refusal is; a 16-character one is relayed and its row
    written. Relayed, the longer one's row overflowed ``calls.method``."""
    from aiohttp import http_parser, web_protocol
    monkeypatch.setattr(web_protocol, "HttpRequestParser", http_parser.HttpRequestParserPy)
    async with _gateway(aiohttp_client, make_app, audit_flush_ms=600_000) as (gw, up):
        writer, org_id = gw.services.audit, gw.org["org_id"]

        async def send(method: str) -> Any:
            head = (method.encode() + b" /call/t/m HTTP/1.1\r\nHost: h\r\nX-Treg-Token: " + gw.org["token"].encode()
                    + b"\r\nContent-Length: 0\r\n\r\n")
            return await asyncio.wait_for(raw_exchange(gw.client.port, head), 10)

        longest = await send("PROPFIND-VERSION")  # 16: llhttp would refuse it, so the pure parser is in use
        assert longest.status == 200 and up.exchanges[-1].method == "PROPFIND-VERSION"
        refused = await send("PROPFIND-VERSIONS")
        assert refused.status == 400 and refused.json()["error"] == "invalid_method"
        assert refused.header("X-Treg-Call-Id") and len(up.exchanges) == 1
        assert await writer.flush() is True and writer.dropped == 0
        rows = dict(run_sql(dsn, "SELECT id, method FROM calls WHERE org_id = %s", org_id))
        assert rows == {longest.header("X-Treg-Call-Id"): "PROPFIND-VERSION"}


async def test_a_call_longer_than_the_duration_columns_hold_is_written_saturated(make_app, aiohttp_client, dsn,
                                                                                  monkeypatch):
    """A call whose duration and time to first byte pass 2**31 - 1 ms (24.8 days: an event stream may be
    open that long) is written with both at that bound. Before, its row was a value PostgreSQL refused, and
    the call had no row. The clock of the two stages that measure them steps 30 days a reading."""
    import itertools
    import time
    from types import SimpleNamespace

    from treg.call import relay, state
    from treg.infra.schema import INT_MAX
    steps = itertools.count(1)
    stepping = SimpleNamespace(monotonic=lambda: time.monotonic() + 30 * 86400 * next(steps))
    async with _gateway(aiohttp_client, make_app, audit_flush_ms=600_000) as (gw, up):
        writer, org_id = gw.services.audit, gw.org["org_id"]
        monkeypatch.setattr(state, "time", stepping)
        monkeypatch.setattr(relay, "time", stepping)
        r = await gw.call("GET", "/call/t/long")
        monkeypatch.undo()
        assert r.status == 200
        assert await writer.flush() is True and writer.dropped == 0
        assert run_sql(dsn, "SELECT duration_ms, ttfb_ms FROM calls WHERE id = %s AND org_id = %s",
                       r.headers["X-Treg-Call-Id"], org_id) == [(INT_MAX, INT_MAX)]


async def test_an_outage_is_one_warning_a_kind_not_one_a_statement(make_app, aiohttp_client, pg_base, dsn, caplog):
    """Through an outage every failed statement was its own warning: each caller's statement and each
    background loop's retry, thousands of lines a second under load. The adapter now logs the first of a
    kind at once, counts the next ones for ``WARN_EVERY_S``, and the first after says how many there were.
    The adapter's clock is the test's here, so that no retry in the background ends the window early."""
    import re

    import pytest

    from treg.errors import DatabaseError
    from treg.infra.db import WARN_EVERY_S, FailureLog
    async with _gateway(aiohttp_client, make_app, audit_flush_ms=600_000) as (gw, up):
        db = gw.services.db
        now = [0.0]
        db.failures = FailureLog(clock=lambda: now[0])

        def warnings() -> list[str]:
            return [r.getMessage() for r in caplog.records if r.name == "treg.infra.db"]

        with caplog.at_level(logging.WARNING, logger="treg.infra.db"), _database_away(pg_base, dsn):
            for _ in range(20):
                with pytest.raises(DatabaseError):
                    await db.run("SELECT 1", {})
            assert len(warnings()) == 1 and warnings()[0].startswith("database error")
            now[0] = WARN_EVERY_S
            with pytest.raises(DatabaseError):
                await db.run("SELECT 1", {})
            later = warnings()
            assert len(later) == 2
            more = re.search(r"\((\d+) more like it in the last 10 s\)$", later[1])
            assert more is not None and int(more.group(1)) >= 19
        assert (await db.run("SELECT 1", {})) == [(1,)]  # and the database is usable again
