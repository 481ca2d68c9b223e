"""The audit writer: call records (and token last-use times) written in batches, none lost.

A call never waits on an audit INSERT: records are queued and a background task writes them in one
multi-row INSERT, with the tokens' last use, as one statement (one round trip) every
``TREG_AUDIT_FLUSH_MS`` (or sooner when many are waiting). On a clean shutdown
``close()`` writes everything still queued.

What a failure costs (docs/operations.md "When the database is away"):

* the database unreachable, restarting or failing statements: nothing is dropped. The rows stay queued
  in order and the writer tries again, backing off to ``RETRY_MAX_S``, for as long as it takes; only
  beyond ``TREG_AUDIT_QUEUE_MAX`` rows are the oldest dropped (logged with their count);
* the database refusing a value (:class:`~treg.errors.DataRefused`, a constraint): the batch is written
  by halves until each refused row is alone, so one row cannot cost the rows beside it (a 500-row
  batch once went, whole, with a tag longer than its column). A row refused alone is dropped, logged
  with its call id and without its evidence; one the key says is already there (its statement's
  answer lost on a cut connection) counts as written.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import secrets
from typing import Any

import orjson
from sqlalchemy import BigInteger
from sqlalchemy.dialects.postgresql import JSONB

from treg.call_record import CallRecord
from treg.context import Services
from treg.errors import DataRefused, IntegrityError, TregError
from treg.ids import PLAIN_ID
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

_INSERT_HEAD = (f"INSERT INTO {calls.name} ({', '.join(c.name for c in _COLUMNS)}) "
                f"SELECT {', '.join(_column_sql(c) for c in _COLUMNS)} FROM jsonb_array_elements(")
_INSERT_SQL = _INSERT_HEAD + "%(rows)s::jsonb) AS r"
#: a batch as one statement, one round trip (the connection is in autocommit, so it is atomic): the
#: tokens' last use written by a data-modifying CTE beside the rows' INSERT
_TOUCH = f"WITH touched AS (UPDATE {tokens.name} SET last_used_at = now() WHERE id = ANY("
_BATCH_SQL = _TOUCH + "%(ids)s) RETURNING 1) " + _INSERT_SQL
#: the rows' literal's delimiter; another is drawn when the rows hold this one (an upstream's error body can)
_ROWS_TAG = "$treg_rows$"


def batch_statement(rows: str, ids: list[str]) -> tuple[str, dict[str, Any] | None]:
    """The batch's statement: ``rows`` (:func:`insert_sql`'s JSON text) and the tokens' ``ids`` written
    into its text, with no parameters.

    Speed trick, named: **the rows as a dollar-quoted literal**. As a bound parameter, psycopg2 quoted the
    rows' text a character at a time through libpq (about 8 500 instructions a call, 1 % of treg's,
    docs/performance.md round 13) and PostgreSQL unquoted it again; a dollar-quoted literal
    (``$tag$…$tag$``) is taken as it is, and a delimiter the rows do not contain cannot end it early,
    so nothing in them can become SQL. With no parameters psycopg2 sends the text unread (a ``%`` in the
    rows means nothing). Token ids are treg's own ``[A-Za-z0-9_]`` text; any other id sends the
    parameterized statement instead. The statement's first 200 characters (what a failure's log line
    shows) end before the rows."""
    if not all(PLAIN_ID.fullmatch(i) for i in ids):
        return _BATCH_SQL, {"rows": rows, "ids": ids}
    tag = _ROWS_TAG
    while tag in rows:
        tag = f"$treg_{secrets.token_hex(8)}$"
    id_list = ",".join(f"'{i}'" for i in ids)
    return f"{_TOUCH}ARRAY[{id_list}]::text[]) RETURNING 1) {_INSERT_HEAD}{tag}{rows}{tag}::jsonb) AS r", None


BATCH_MAX = 500
#: the longest wait between two tries while the database cannot be reached
RETRY_MAX_S = 2.0
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
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self.written = 0
        #: rows dropped: refused alone by the database, or beyond ``TREG_AUDIT_QUEUE_MAX`` in an outage
        self.dropped = 0
        #: the database could not be reached on the last try (logged once per outage)
        self.failing = False
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
        backoff = 0.0
        while not self._closing:
            with contextlib.suppress(asyncio.TimeoutError):
                if backoff:  # through an outage the tries back off: a full queue does not hurry them
                    await asyncio.wait_for(self._stop.wait(), backoff)
                else:
                    await asyncio.wait_for(self._wake.wait(), interval)
            self._wake.clear()
            backoff = 0.0 if await self.flush() else min(max(backoff * 2, 0.05), RETRY_MAX_S)

    async def flush(self) -> bool:
        """Write what is queued now; False when the database could not be reached (what was not written
        stays queued, in order, for the next try). Records that arrive meanwhile wait for the next tick:
        draining until the queue is empty would, under steady load, never stop and write one tiny batch
        per database round trip (docs/performance.md)."""
        async with self._flush_lock:
            pending, self._queue = self._queue, []
            touched, self._touched = self._touched, set()
            try:
                while pending or touched:
                    batch = pending[:BATCH_MAX]
                    left, touched = await self._write(batch, touched)
                    if left is not None:  # the database could not be reached: the rest waits for the next try
                        pending[:len(batch)] = left
                        return False
                    del pending[:len(batch)]
                return True
            finally:
                # whatever was not written goes back in front of the queue (order kept), within the bound
                self._queue[:0] = pending
                self._touched |= touched
                self._bound()

    async def _write(self, batch: list[CallRecord],
                     touched: set[str]) -> tuple[list[CallRecord] | None, set[str]]:
        """``batch`` and the tokens' uses written, by halves around any row the database refuses: the rows
        left unwritten because the database could not be reached (None: every row written or dropped;
        a batch of token uses alone leaves an empty list) and the token uses still to write."""
        parts = [batch]  # a stack, leftmost part on top: rows are written in their order
        while parts:
            part = parts.pop()
            try:
                rows = (await insert_sql_spread(part))[1]["rows"] if part else "[]"
                await self._svc.db.run(*batch_statement(rows, sorted(touched)), path="audit")
            except (DataRefused, IntegrityError) as exc:
                if len(part) > 1:
                    mid = len(part) // 2
                    parts += [part[mid:], part[:mid]]
                    continue
                if not part:  # the tokens' last use alone refused: dropped, or it would be tried without end
                    log.error("tokens' last use dropped: the database refused it (%s)", exc.code)
                    touched = set()
                elif isinstance(exc, IntegrityError) and exc.constraint == "pk_calls":
                    self.written += 1  # written already: an earlier try's answer was lost with its connection
                else:
                    self.dropped += 1
                    log.error("audit row of call %s dropped: the database refused it (%s)", part[0].id,
                              exc.constraint if isinstance(exc, IntegrityError) else exc.code)
                continue
            except TregError as exc:  # unreachable, restarting, a statement timeout: nothing is dropped
                if not self.failing:
                    self.failing = True
                    log.warning("audit writes failing (%s); the rows are kept and written once the database "
                                "is back", exc.code)
                return [r for p in (part, *reversed(parts)) for r in p], touched
            if self.failing:
                self.failing = False
                log.warning("audit writes back; the rows kept meanwhile are being written")
            touched = set()
            self.written += len(part)
        return None, touched

    def _bound(self) -> None:
        excess = len(self._queue) - self._svc.settings.audit_queue_max
        if excess > 0:
            del self._queue[:excess]
            self.dropped += excess
            log.error("audit queue over TREG_AUDIT_QUEUE_MAX through a database outage: %d oldest rows "
                      "dropped", excess)

    async def close(self) -> None:
        self._closing = True
        self._wake.set()
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task
        # bounded: nothing new arrives once the server stopped taking calls, and a database that stays
        # away is given TREG_AUDIT_CLOSE_S
        deadline = asyncio.get_running_loop().time() + self._svc.settings.audit_close_s
        wait = 0.05
        while not await self.flush() or self._queue or self._touched:
            if asyncio.get_running_loop().time() + wait > deadline:
                log.error("audit writer stopped with %d rows it could not write (the database stayed away)",
                          len(self._queue))
                return
            await asyncio.sleep(wait)
            wait = min(wait * 2, RETRY_MAX_S)


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
