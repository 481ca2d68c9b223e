"""The audit writer: call records (and token last-use times) written in batches, none lost.

A call never waits on an audit INSERT: records are queued and a background task writes them in one
multi-row INSERT, with the tokens' last use, as one statement (one round trip) every
``TREG_AUDIT_FLUSH_MS`` (or sooner when many are waiting). On a clean shutdown
``close()`` writes everything still queued. A failed write is retried; a row is dropped only if it
cannot be written after several attempts (logged, without its evidence).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from typing import Any

import orjson
from sqlalchemy import BigInteger
from sqlalchemy.dialects.postgresql import JSONB

from treg.call_record import CallRecord
from treg.context import Services
from treg.errors import TregError
from treg.infra.schema import calls, tokens

log = logging.getLogger(__name__)

#: the columns a record fills, in table order (created_at: the server's default), each read from the
#: record's position in the JSON array the batch travels as
_COLUMNS = tuple(c for c in calls.columns if c.name in CallRecord._fields)


def _column_sql(column: Any) -> str:
    i = CallRecord._fields.index(column.name)
    if isinstance(column.type, JSONB):
        return f"nullif(r->{i}, 'null'::jsonb)"  # JSON null is SQL NULL, not the JSONB value null
    if column.type.python_type is bool:
        return f"(r->>{i})::boolean"
    if column.type.python_type is int:
        return f"(r->>{i})::{'bigint' if isinstance(column.type, BigInteger) else 'integer'}"
    return f"r->>{i}"  # text; the INSERT's assignment checks any VARCHAR length (a cast would truncate)


#: a record's fields up to its last stored column: what a batch sends (the fields after it ride only
#: the ``tool_called`` event; a User-Agent among them would cost bytes PostgreSQL throws away)
_STORED = max(CallRecord._fields.index(c.name) for c in _COLUMNS) + 1

_INSERT_SQL = (f"INSERT INTO {calls.name} ({', '.join(c.name for c in _COLUMNS)}) "
               f"SELECT {', '.join(_column_sql(c) for c in _COLUMNS)} FROM jsonb_array_elements(%(rows)s::jsonb) AS r")
#: a batch as one statement, one round trip (the connection is in autocommit, so it is atomic): the
#: tokens' last use written by a data-modifying CTE beside the rows' INSERT
_BATCH_SQL = (f"WITH touched AS (UPDATE {tokens.name} SET last_used_at = now() WHERE id = ANY(%(ids)s) RETURNING 1) "
              + _INSERT_SQL)
BATCH_MAX = 500
#: rows encoded per step of the loop: a 500-row batch encoded at once held the loop for ms at a time,
#: so the call in flight at that moment waited for it (the c=1 tail, docs/performance.md round 4)
ENCODE_SLICE = 64


class AuditWriter:
    batches_token_touch = True  # treg.context.AuditSink: token uses are written with the next batch

    def __init__(self, svc: Services) -> None:
        self._svc = svc
        self._queue: list[CallRecord] = []
        self._touched: set[str] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.written = 0
        self._flush_lock = asyncio.Lock()

    def record(self, rec: CallRecord) -> None:
        self._queue.append(rec)
        if len(self._queue) >= BATCH_MAX:
            self._wake.set()

    def touch_token(self, token_id: str) -> None:
        self._touched.add(token_id)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="treg-audit-writer")

    async def _run(self) -> None:
        interval = max(self._svc.settings.audit_flush_ms, 1) / 1000
        while not self._closing:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), interval)
            self._wake.clear()
            await self.flush()

    async def flush(self) -> None:
        """Write what is queued now. Records that arrive meanwhile wait for the next tick: draining
        until the queue is empty would, under steady load, never stop and write one tiny batch per
        database round trip (docs/performance.md)."""
        async with self._flush_lock:
            pending, self._queue = self._queue, []
            touched, self._touched = self._touched, set()
            attempts = 0
            try:
                while pending or touched:
                    batch = pending[:BATCH_MAX]
                    try:
                        rows = (await insert_sql_spread(batch))[1]["rows"] if batch else "[]"
                        await self._svc.db.run(_BATCH_SQL, {"rows": rows, "ids": sorted(touched)}, path="audit")
                        del pending[:len(batch)]
                        touched = set()
                        self.written += len(batch)
                        attempts = 0
                    except TregError as exc:
                        attempts += 1
                        if attempts >= 5:
                            log.error("audit write failed %d times (%s); dropping %d records", attempts, exc.code,
                                      len(batch))
                            del pending[:len(batch)]
                            return
                        await asyncio.sleep(0.05 * attempts)
            finally:
                # whatever was not written goes back in front of the queue (order kept)
                self._queue[:0] = pending
                self._touched |= touched

    async def close(self) -> None:
        self._closing = True
        self._wake.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        for _ in range(10):  # bounded: nothing new arrives once the server stopped taking calls
            await self.flush()
            if not self._queue and not self._touched:
                break


#: what JSONB refuses in a string: a NUL (\u0000) and an unpaired UTF-16 surrogate half, each only
#: where the backslash is not itself escaped (an even run of backslashes before it)
_UNSTORABLE = re.compile(
    r"(?<!\\)((?:\\\\)*)\\u(?:0000|d[89ab][0-9a-f]{2}(?!\\ud[c-f][0-9a-f]{2}))"
    r"|(?<!\\)((?:\\\\)*)(?<!\\ud[89ab][0-9a-f]{2})\\ud[c-f][0-9a-f]{2}", re.I)


def _storable(match: re.Match[str]) -> str:
    return (match.group(1) or match.group(2) or "") + "\\ufffd"


def insert_sql(batch: list[CallRecord]) -> tuple[str, dict[str, Any]]:
    """One INSERT for a batch: the rows travel as one JSON array of arrays that PostgreSQL unpacks
    (``jsonb_array_elements``; each column read from its position, nested objects fill the JSONB
    evidence columns).

    Neither a Core ``insert().values([...])`` (SQLAlchemy compiles a bind parameter object per value)
    nor one pyformat parameter per value (psycopg2 quotes each) nor an array of JSON objects (every
    key repeated in every row) is as cheap: encoding a list of rows is one C call and half the
    bytes (docs/performance.md). Text PostgreSQL cannot store (a NUL in an upstream's error body, a
    lone surrogate from a request line that was not UTF-8) becomes U+FFFD instead of failing the batch."""
    return _INSERT_SQL, {"rows": _encode_rows(batch)}


async def insert_sql_spread(batch: list[CallRecord]) -> tuple[str, dict[str, Any]]:
    """:func:`insert_sql`, the same text, encoded ``ENCODE_SLICE`` rows at a time with the loop let run
    in between: the calls in flight do not wait for a whole batch's encoding."""
    if len(batch) <= ENCODE_SLICE:
        return insert_sql(batch)
    parts = []
    for i in range(0, len(batch), ENCODE_SLICE):
        if i:
            await asyncio.sleep(0)
        parts.append(_encode_rows(batch[i:i + ENCODE_SLICE])[1:-1])  # the rows without the array's brackets
    return _INSERT_SQL, {"rows": "[" + ",".join(parts) + "]"}


def _encode_rows(batch: list[CallRecord]) -> str:
    """The rows as one JSON array of arrays (text PostgreSQL can store)."""
    try:
        # orjson: a seventh of the stdlib encoder's time per row (docs/performance.md); it refuses what
        # is not valid UTF-8 (a lone surrogate) and any non-str key, which the stdlib encoder below
        # takes (and the surrogate is then made storable)
        rows = orjson.dumps([r[:_STORED] for r in batch]).decode()
    except TypeError:
        rows = json.dumps([r[:_STORED] for r in batch], separators=(",", ":"))
    # the one-character test first: a single character is a memchr, a longer needle a scan by
    # CPython's search loop, and the three of them cost twice the encoding (docs/performance.md,
    # round 11); a row with no escape at all, the usual one, has no backslash
    if "\\" in rows and ("\\u0000" in rows or "\\ud" in rows or "\\uD" in rows):
        rows = _UNSTORABLE.sub(_storable, rows)
    return rows


async def prune_evidence(svc: Services) -> int:
    """Drop failed-call evidence older than the retention setting (the audit rows stay)."""
    async with svc.db.tx() as tx:
        return await tx.execute(
            "UPDATE calls SET error_request = NULL, error_response = NULL "
            "WHERE (error_request IS NOT NULL OR error_response IS NOT NULL) "
            "AND created_at < now() - make_interval(days => %(days)s)",
            {"days": svc.settings.evidence_retention_days})
