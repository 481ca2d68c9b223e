"""Connections of their own for one-statement round trips: psycopg2's asynchronous mode, driven directly.

A speed trick, and packaged as one (docs/performance.md, round 7): the statements on the hot path of a
billed call — placing a hold, closing holds, an audit batch — are single statements of SQL text fixed at
import (``Database.run``). Through aiopg each cost ~150 µs of CPU (a pool checkout, a new ``Cursor``
object, a ``wait_for`` per poll, a reader added and removed, the release's wake-up); the same statement
on a connection kept here with its one cursor costs ~30 µs, and ~55 µs instead of ~270 µs of wall
time. A platform-tier call makes two of them.

A :class:`Line` is one connection (psycopg2 ``async_=1``, so in autocommit: each statement is its own
transaction) and its cursor; :class:`Lines` keeps up to ``size`` of them, lends one per statement and
takes it back. Everything else about the database (transactions, LISTEN/NOTIFY, migrations) stays on
aiopg's pool. What a line guarantees:

* a statement that fails on the server (an integrity error, a statement timeout) leaves the line usable
  (autocommit: no transaction is left aborted); psycopg2's error is raised as it is, for the adapter to
  map;
* a line whose connection broke, or whose statement was interrupted by a cancellation (its state on the
  wire unknown), is closed and never lent again; the next statement opens a new one;
* at most ``size`` lines exist; a statement waits at most ``timeout`` seconds for one, then
  :class:`~treg.errors.DbPoolExhausted`, as the pool's checkout does.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from typing import Any, Mapping

import psycopg2
import psycopg2.extensions as ext

from treg.errors import DbPoolExhausted


def _wake(fut: "asyncio.Future[None]") -> None:
    if not fut.done():
        fut.set_result(None)


class Line:
    """One asynchronous psycopg2 connection and its one cursor. Its socket stays registered with the
    event loop for reading as long as the line lives (two ``epoll_ctl`` calls a statement saved); the
    reader wakes the statement waiting on it, or, idle, reads what the server sent unasked (a notice,
    the connection's end)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.fd = conn.fileno()
        self.cursor: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiter: asyncio.Future[None] | None = None

    def _readable(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            if not waiter.done():
                waiter.set_result(None)
            return
        try:  # idle: whatever arrived is consumed; a connection the server ended is this line's end
            self.conn.poll()
        except psycopg2.Error:
            self.close()

    def _watch(self) -> None:
        if self._loop is None and not self.conn.closed:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self.fd, self._readable)

    async def ready(self) -> None:
        """Drive the connection until its current command completed (psycopg2 raises the command's error
        from ``poll``)."""
        loop = asyncio.get_running_loop()
        while True:
            state = self.conn.poll()
            if state == ext.POLL_OK:
                return
            fut = loop.create_future()
            if state == ext.POLL_READ:
                if self._loop is None:  # connecting: not watched yet
                    loop.add_reader(self.fd, _wake, fut)
                    try:
                        await fut
                    finally:
                        loop.remove_reader(self.fd)
                else:
                    self._waiter = fut
                    try:
                        await fut
                    finally:
                        self._waiter = None
            elif state == ext.POLL_WRITE:
                loop.add_writer(self.fd, _wake, fut)
                try:
                    await fut
                finally:
                    loop.remove_writer(self.fd)
            else:  # pragma: no cover - psycopg2 documents no other state
                raise psycopg2.OperationalError(f"unexpected poll state {state}")

    async def run(self, sql: str, params: Mapping[str, Any] | None) -> list[tuple[Any, ...]]:
        self.cursor.execute(sql, params)  # asynchronous: sends the statement, returns at once
        await self.ready()
        return self.cursor.fetchall() if self.cursor.description is not None else []

    @property
    def broken(self) -> bool:
        return bool(self.conn.closed)

    def close(self) -> None:
        if self._loop is not None:
            with contextlib.suppress(Exception):  # a closed loop has no reader left to remove
                self._loop.remove_reader(self.fd)
            self._loop = None
        with contextlib.suppress(psycopg2.Error):
            self.conn.close()


class Lines:
    """Up to ``size`` :class:`Line` s to ``dsn``, opened when first needed."""

    def __init__(self, dsn: str, *, size: int, timeout: float) -> None:
        self._dsn = dsn
        self._size = max(1, size)
        self._timeout = timeout
        self._free: collections.deque[Line] = collections.deque()
        self._waiters: collections.deque[asyncio.Future[Line | None]] = collections.deque()
        self._open = 0
        self._closed = False

    @property
    def size(self) -> tuple[int, int]:
        """(lent out, idle) lines now."""
        return self._open - len(self._free), len(self._free)

    async def _connect(self) -> Line:
        try:
            line = Line(psycopg2.connect(self._dsn, async_=1))
            await line.ready()
            line.cursor = line.conn.cursor()
            line._watch()
        except BaseException:
            self._open -= 1
            self._wake_one(None)  # a waiter may try to open the line this one could not
            raise
        return line

    async def acquire(self) -> Line:
        if self._closed:
            raise DbPoolExhausted("the database is closing")
        while self._free:
            line = self._free.popleft()
            if not line.broken:
                return line
            self._open -= 1
        if self._open < self._size:
            self._open += 1
            return await self._connect()
        fut: asyncio.Future[Line | None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            async with asyncio.timeout(self._timeout):
                got = await fut
        except BaseException as exc:
            # handed over in the same turn the timeout or a cancellation came: pass it on (a line to the
            # next waiter, or the right to open one), or it is lost to every statement after
            if fut.done() and not fut.cancelled():
                handed = fut.result()
                if handed is not None:
                    self.release(handed, ok=True)
                else:  # its place was freed already (``release`` counted it): the next waiter may open it
                    self._wake_one(None)
            if isinstance(exc, TimeoutError):
                raise DbPoolExhausted("no database connection available (all in use or server down)") from exc
            raise
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(fut)
        if got is None:  # a line was closed: its place is ours to open
            self._open += 1
            return await self._connect()
        return got

    def _wake_one(self, line: Line | None) -> bool:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(line)
                return True
        return False

    def release(self, line: Line, *, ok: bool) -> None:
        """Take a line back: lent on to a waiter, kept, or — broken, or its last statement interrupted —
        closed (its place goes to a waiter, who opens a new one)."""
        if self._closed:
            line.close()
            return
        if not ok or line.broken:
            line.close()
            self._open -= 1
            self._wake_one(None)
            return
        if not self._wake_one(line):
            self._free.append(line)

    async def run(self, sql: str, params: Mapping[str, Any] | None) -> list[tuple[Any, ...]]:
        line = await self.acquire()
        ok = False
        try:
            rows = await line.run(sql, params)
            ok = True
            return rows
        except psycopg2.Error:
            ok = not line.broken  # a statement the server refused leaves the line usable (autocommit)
            raise
        finally:
            # a cancellation mid-statement leaves the wire in an unknown state: ok stays False, closed
            self.release(line, ok=ok)

    def close(self) -> None:
        self._closed = True
        while self._free:
            self._free.popleft().close()
        self._open = 0
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.cancel()
