"""The hot path's own connections (treg/infra/statement_lines.py), against the test database: a line is
lent per statement and taken back; a refused statement leaves it usable; a broken or interrupted one is
closed and replaced; at most ``size`` exist, and a statement waits for one at most ``timeout``."""

from __future__ import annotations

import asyncio

import psycopg2
import pytest

from treg.errors import DatabaseError, DbPoolExhausted, IntegrityError
from treg.infra.db import Database
from treg.infra.statement_lines import Lines


async def test_a_line_is_reused_and_a_refused_statement_leaves_it_usable(dsn):
    lines = Lines(dsn, size=2, timeout=5)
    try:
        pid1 = (await lines.run("SELECT pg_backend_pid()", {}))[0][0]
        with pytest.raises(psycopg2.errors.DivisionByZero):
            await lines.run("SELECT 1 / %(z)s", {"z": 0})
        pid2 = (await lines.run("SELECT pg_backend_pid()", {}))[0][0]
        assert pid1 == pid2 and lines.size == (0, 1)
        assert await lines.run("SELECT %(a)s::int + 1, %(b)s::text", {"a": 41, "b": "x"}) == [(42, "x")]
    finally:
        lines.close()


def _admin(dsn: str, sql: str, *args: object) -> None:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
    finally:
        conn.close()


async def test_a_broken_line_is_replaced(dsn):
    """Its backend terminated while idle (as by a database restart): the line notices the connection's
    end (its socket is watched) and is dropped; the next statement runs on a new one. Terminated under
    a statement: that statement fails as a DatabaseError, and the next runs on a new line."""
    db = await Database(dsn, statement_connections=1).open()
    try:
        pid = (await db.run("SELECT pg_backend_pid()", {}))[0][0]
        await asyncio.to_thread(_admin, dsn, "SELECT pg_terminate_backend(%s)", pid)
        await asyncio.sleep(0.3)
        pid2 = (await db.run("SELECT pg_backend_pid()", {}))[0][0]
        assert pid2 != pid
        sleeper = asyncio.ensure_future(db.run("SELECT pg_sleep(5)", {}))
        await asyncio.sleep(0.3)
        await asyncio.to_thread(_admin, dsn, "SELECT pg_terminate_backend(%s)", pid2)
        with pytest.raises(DatabaseError):
            await sleeper
        assert (await db.run("SELECT pg_backend_pid()", {}))[0][0] not in (pid, pid2)
    finally:
        await db.close()


async def test_a_cancelled_statement_closes_its_line(dsn):
    lines = Lines(dsn, size=1, timeout=5)
    try:
        pid = (await lines.run("SELECT pg_backend_pid()", {}))[0][0]
        task = asyncio.ensure_future(lines.run("SELECT pg_sleep(5)", {}))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert lines.size == (0, 0)  # never lent again: its wire was mid-statement
        assert (await lines.run("SELECT pg_backend_pid()", {}))[0][0] != pid
    finally:
        lines.close()


async def test_at_most_size_lines_and_a_bounded_wait(dsn):
    lines = Lines(dsn, size=2, timeout=0.5)
    try:
        slow = [asyncio.ensure_future(lines.run("SELECT pg_sleep(1.5)", {})) for _ in range(2)]
        await asyncio.sleep(0.2)
        with pytest.raises(DbPoolExhausted):
            await lines.run("SELECT 1", {})
        await asyncio.gather(*slow)
        many = await asyncio.gather(*(lines.run("SELECT pg_backend_pid()", {}) for _ in range(10)))
        assert len({r[0][0] for r in many}) <= 2
    finally:
        lines.close()


async def test_the_adapter_maps_a_line_s_errors(dsn):
    db = await Database(dsn, statement_connections=1).open()
    try:
        await db.run("CREATE TABLE IF NOT EXISTS test_lines_u (id int CONSTRAINT pk_test_lines_u PRIMARY KEY)", {})
        await db.run("INSERT INTO test_lines_u VALUES (1)", {})
        with pytest.raises(IntegrityError) as err:
            await db.run("INSERT INTO test_lines_u VALUES (1)", {})
        assert err.value.constraint == "pk_test_lines_u"
        # a statement the server cancels (a statement timeout, pg_cancel_backend): a DatabaseError, and
        # the line goes on serving
        pid = (await db.run("SELECT pg_backend_pid()", {}))[0][0]
        sleeper = asyncio.ensure_future(db.run("SELECT pg_sleep(5)", {}))
        await asyncio.sleep(0.3)
        await asyncio.to_thread(_admin, dsn, "SELECT pg_cancel_backend(%s)", pid)
        with pytest.raises(DatabaseError):
            await sleeper
        assert await db.run("SELECT pg_backend_pid()", {}) == [(pid,)]
    finally:
        await db.close()


async def test_a_line_handed_to_a_waiter_that_is_cancelled_in_the_same_turn_is_passed_on(dsn):
    """The race of a hand-over and a waiter's end (its timeout, a cancellation) in one loop turn: the line
    it was handed goes to the next waiter (or back to the free lines), never lost to every statement
    after."""
    lines = Lines(dsn, size=1, timeout=5)
    try:
        line = await lines.acquire()
        first = asyncio.ensure_future(lines.acquire())
        second = asyncio.ensure_future(lines.acquire())
        await asyncio.sleep(0.05)  # both wait
        lines.release(line, ok=True)  # handed to the first waiter ...
        first.cancel()  # ... which ends in the same turn, before it ran
        got = await asyncio.wait_for(second, 2)  # the second gets it, not a 5 s wait and DbPoolExhausted
        assert got is line and first.cancelled()
        lines.release(got, ok=True)
        assert lines.size == (0, 1)  # one line, idle: none lost, none counted twice
    finally:
        lines.close()
