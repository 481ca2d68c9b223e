"""The database adapter: SQLAlchemy Core statements executed through aiopg.

``aiopg.sa`` refuses SQLAlchemy 2, so statements are compiled here for the psycopg2 dialect (bind
processors applied, post-compile parameters rendered) and run on a plain aiopg cursor. Rows come back
as dicts. Transactions are short by design: ``async with db.tx() as tx`` checks out one connection,
runs ``BEGIN`` … ``COMMIT`` (``ROLLBACK`` on any exception) and returns it to the pool. Nothing that
waits on an upstream may hold one (see docs/architecture.md, "Connection discipline").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Mapping, Sequence

import aiopg
import psycopg2
import psycopg2.errorcodes
import psycopg2.extras
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql import ClauseElement

from treg.errors import DataRefused, DatabaseError, DbPoolExhausted, IntegrityError
from treg.infra.statement_lines import Lines
from treg.memo import BoundedMemo

log = logging.getLogger(__name__)

_DIALECT = postgresql.psycopg2.dialect()  # type: ignore[attr-defined]
#: compiled statements kept, by SQLAlchemy's cache key (a speed trick: docs/performance.md, round 6)
STATEMENT_CACHE_MAX = 512


@dataclass(frozen=True)
class Compiled:
    sql: str
    params: Mapping[str, Any]


#: kept for a shape whose SQL depends on its values (it is compiled with them on every execution)
_VALUE_DEPENDENT = object()


class StatementCache:
    """Compiled Core statements by their SQLAlchemy cache key, as SQLAlchemy's own engines keep them.

    Compiling a statement costs 0.2–1 ms of Python per statement; a platform-tier call's hold and
    settlement run about a dozen, so compiling each on every call was most of that call's CPU. A
    statement is compiled once per shape and its values taken from the new statement's own bound
    parameters (``construct_params(extracted_parameters=...)``, the engine's way). Not kept: a statement
    with no cache key, and one whose SQL depends on its values (an expanding ``IN``, a literal-rendered
    parameter): those are compiled each time with their values rendered, as before."""

    def __init__(self, max_entries: int = STATEMENT_CACHE_MAX) -> None:
        self._memo: BoundedMemo[Any, Any] = BoundedMemo(max_entries)
        self.hits = self.misses = self.uncacheable = 0

    def compile(self, stmt: ClauseElement, params: Mapping[str, Any] | None) -> Compiled:
        key = stmt._generate_cache_key()  # noqa: SLF001 - SQLAlchemy's engine uses the same key
        compiled = self._memo.get(key[0]) if key is not None else None
        if compiled is not None and compiled is not _VALUE_DEPENDENT:
            self.hits += 1
            return _bound(compiled, compiled.construct_params(params, extracted_parameters=key[1]))
        if key is not None and compiled is None:
            compiled = stmt.compile(dialect=_DIALECT, cache_key=key)
            if not compiled.post_compile_params and not compiled.literal_execute_params:
                self.misses += 1
                self._memo.put(key[0], compiled)
                return _bound(compiled, compiled.construct_params(params, extracted_parameters=key[1]))
            self._memo.put(key[0], _VALUE_DEPENDENT)  # its shape is known now: compiled once a call, not twice
        self.uncacheable += 1
        compiled = stmt.compile(dialect=_DIALECT, compile_kwargs={"render_postcompile": True})
        return _bound(compiled, compiled.construct_params(params))


def _bound(compiled: Any, values: Mapping[str, Any]) -> Compiled:
    """The SQL and its values with the types' bind processors applied (JSON, enums…)."""
    processors = compiled._bind_processors  # noqa: SLF001 - the documented way to get them is private
    out = {}
    for key, value in values.items():
        proc = processors.get(key)
        out[key] = proc(value) if proc is not None and value is not None else value
    return Compiled(compiled.string, out)


#: the process's statements: shapes come from treg's code, so a few hundred at most
STATEMENTS = StatementCache()


def compile_statement(stmt: ClauseElement | str, params: Mapping[str, Any] | None = None) -> Compiled:
    """Compile a Core statement for psycopg2 (cached by shape), applying the types' bind processors."""
    if isinstance(stmt, str):
        return Compiled(stmt, dict(params or {}))
    return STATEMENTS.compile(stmt, params)


#: a kind of statement failure is logged at once, then at most once in this many seconds (with a count)
WARN_EVERY_S = 10.0


class FailureLog:
    """The adapter's warnings of failed statements, one a kind (an error code) per ``WARN_EVERY_S``.

    Every failed statement was one warning: through an outage each caller's statement and each
    background loop's retry wrote its own line, thousands a second under load, which buried the one line
    that says what happened. The first failure of a kind is logged at once; the next ones of that kind
    within ``WARN_EVERY_S`` are counted, and the first after it says how many there were."""

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        #: kind → (when it was last logged, how many since were not)
        self._kinds: dict[str, tuple[float, int]] = {}

    def warn(self, kind: str, msg: str, *args: Any) -> None:
        now = self._clock()
        last = self._kinds.get(kind)
        if last is not None and now - last[0] < WARN_EVERY_S:
            self._kinds[kind] = (last[0], last[1] + 1)
            return
        self._kinds[kind] = (now, 0)
        if last is not None and last[1]:
            log.warning(msg + " (%d more like it in the last %.0f s)", *args, last[1], now - last[0])
        else:
            log.warning(msg, *args)


def _statement_canceled(exc: asyncio.CancelledError, failures: FailureLog) -> DatabaseError:
    """aiopg answers a statement the server canceled (``statement_timeout``, ``pg_cancel_backend``:
    SQLSTATE 57014) with a bare ``CancelledError``; in a task nobody is cancelling, that is a database
    failure, not a cancellation (it once killed a background loop as if it had been stopped)."""
    failures.warn("57014", "database statement canceled by the server (statement timeout or cancel)")
    return DatabaseError("the database canceled the statement (statement timeout)", code="database_error")


def _cancelling() -> bool:
    """Whether the current task is really being cancelled (else a CancelledError is aiopg's 57014)."""
    task = asyncio.current_task()
    return task is None or task.cancelling() > 0


def _map_error(exc: psycopg2.Error, sql: str, failures: FailureLog) -> DatabaseError | IntegrityError:
    code = exc.pgcode or ""
    if code.startswith("23"):  # integrity_constraint_violation class
        constraint = getattr(getattr(exc, "diag", None), "constraint_name", None)
        return IntegrityError(f"the write conflicts with existing data ({constraint or code})",
                              constraint=constraint)
    if code[:2] in ("22", "54"):  # a data exception, a program limit: the statement's values, not the server
        failures.warn(code, "database refused a value (%s) on %.200s", code, sql)
        return DataRefused("the database refused a value of the statement", code="database_error")
    if code in ("40001", "40P01"):
        return DatabaseError("the database aborted a conflicting transaction; retry", code="db_conflict")
    kind = code or type(exc).__name__
    failures.warn(kind, "database error %s on %.200s", kind, sql)
    return DatabaseError("the database failed the request", code="database_error")


class Tx:
    """One transaction on one connection. Methods accept Core statements or SQL text."""

    def __init__(self, cur: aiopg.Cursor, db: "Database") -> None:
        self._cur = cur
        self._db = db

    async def execute(self, stmt: ClauseElement | str, params: Mapping[str, Any] | None = None) -> int:
        c = compile_statement(stmt, params)
        self._db.round_trips += 1
        try:
            await self._cur.execute(c.sql, c.params)
        except psycopg2.Error as exc:
            raise _map_error(exc, c.sql, self._db.failures) from exc
        except asyncio.CancelledError as exc:
            if _cancelling():
                raise
            raise _statement_canceled(exc, self._db.failures) from exc
        return self._cur.rowcount

    async def fetch_all(self, stmt: ClauseElement | str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        await self.execute(stmt, params)
        if self._cur.description is None:
            return []
        names = [d.name for d in self._cur.description]
        return [dict(zip(names, row)) for row in await self._cur.fetchall()]

    async def fetch_one(self, stmt: ClauseElement | str, params: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        rows = await self.fetch_all(stmt, params)
        return rows[0] if rows else None

    async def scalar(self, stmt: ClauseElement | str, params: Mapping[str, Any] | None = None) -> Any:
        row = await self.fetch_one(stmt, params)
        return next(iter(row.values())) if row else None

    async def execute_many(self, stmt: ClauseElement, rows: Sequence[Mapping[str, Any]]) -> None:
        """One INSERT for many rows (``VALUES (…), (…)``): the audit writer's batch path."""
        if rows:
            await self.execute(stmt.values(list(rows)))  # type: ignore[attr-defined]


class Database:
    """A pool of aiopg connections and the ``tx()`` context that borrows one briefly."""

    def __init__(self, dsn: str, *, minsize: int = 1, maxsize: int = 10, timeout: float = 10.0,
                 statement_connections: int = 4) -> None:
        self._dsn = dsn
        self._minsize, self._maxsize, self._timeout = minsize, maxsize, timeout
        self._pool: aiopg.Pool | None = None
        #: the connections of :meth:`run`, beside the pool (treg/infra/statement_lines.py)
        self._lines = Lines(dsn, size=statement_connections, timeout=timeout)
        #: the pool's connections checked out right now (tests watch it at the network boundary)
        self.in_use = 0
        self.peak_in_use = 0
        #: the tasks holding a connection (the pool's or a line) right now (tests check none of them waits
        #: on an upstream)
        self.holders: set[asyncio.Task[Any]] = set()
        #: statements sent (each one round trip: ``BEGIN`` and ``COMMIT`` of a ``tx()`` count too), for
        #: ``treg_db_round_trips_total``, the tests and the benchmark; and those of :meth:`run` by its
        #: ``path`` (the money path's holds and closes: ``money``)
        self.round_trips = 0
        self.round_trips_of: dict[str, int] = {}
        #: the failed statements' warnings, one a kind per ``WARN_EVERY_S``
        self.failures = FailureLog()

    @property
    def dsn(self) -> str:
        return self._dsn

    async def open(self) -> "Database":
        try:
            self._pool = await aiopg.create_pool(self._dsn, minsize=self._minsize, maxsize=self._maxsize,
                                                 timeout=self._timeout, enable_hstore=False)
        except psycopg2.Error as exc:
            raise DatabaseError(f"cannot connect to the database: {exc.__class__.__name__}",
                                code="database_unavailable") from exc
        return self

    async def close(self) -> None:
        self._lines.close()
        if self._pool is not None:
            self._pool.close()
            await self._pool.wait_closed()
            self._pool = None

    def pool_use(self) -> tuple[int, int]:
        """(in use, idle) connections of the pool now, for the metrics scrape; (0, 0) when closed."""
        if self._pool is None:
            return 0, 0
        idle = self._pool.freesize
        return self._pool.size - idle, idle

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[aiopg.Connection]:
        assert self._pool is not None, "Database.open() was not awaited"
        try:
            # not asyncio.wait_for: on Python 3.11 a cancellation racing the acquire's completion can
            # drop the acquired connection on the floor (never released; the pool never closes)
            async with asyncio.timeout(self._timeout):
                conn = await self._pool.acquire()
        except (TimeoutError, psycopg2.Error) as exc:
            raise DbPoolExhausted("no database connection available (pool exhausted or server down)") from exc
        self.in_use += 1
        self.peak_in_use = max(self.peak_in_use, self.in_use)
        task = asyncio.current_task()
        if task is not None:
            self.holders.add(task)
        try:
            yield conn
        finally:
            self.in_use -= 1
            if task is not None:
                self.holders.discard(task)
            # release() hands the connection back synchronously; only its wake-up is awaited, shielded
            # so a second cancellation here cannot interrupt it
            await asyncio.shield(self._pool.release(conn))

    async def run(self, sql: str, params: Mapping[str, Any] | None, *, path: str = "other") -> list[tuple[Any, ...]]:
        """One statement of SQL text in its own implicit transaction (autocommit): one round trip, no
        ``BEGIN``/``COMMIT`` around it, no compilation, on a connection of its own beside the pool
        (treg/infra/statement_lines.py: a speed trick). For the hot statements whose text is fixed at
        import (the money path's in ``treg/money/holds.py``, the audit writer's batch). ``path`` names
        what the round trip was for in ``round_trips_of``. Rows as tuples."""
        self.round_trips += 1
        self.round_trips_of[path] = self.round_trips_of.get(path, 0) + 1
        task = asyncio.current_task()
        if task is not None:  # a line is a connection held as much as a pooled one (``in_use`` is the pool's)
            self.holders.add(task)
        try:
            return await self._lines.run(sql, params)
        except psycopg2.Error as exc:
            raise _map_error(exc, sql, self.failures) from exc
        finally:
            if task is not None:
                self.holders.discard(task)

    @contextlib.asynccontextmanager
    async def tx(self) -> AsyncIterator[Tx]:
        async with self.connection() as conn:
            async with conn.cursor() as cur:
                self.round_trips += 2  # BEGIN, and COMMIT or ROLLBACK
                await cur.execute("BEGIN")
                try:
                    yield Tx(cur, self)
                except BaseException:
                    with contextlib.suppress(psycopg2.Error):
                        await cur.execute("ROLLBACK")
                    raise
                else:
                    try:
                        await cur.execute("COMMIT")
                    except psycopg2.Error as exc:
                        raise _map_error(exc, "COMMIT", self.failures) from exc
