"""The breaker's state: strikes and locks per lock key in PostgreSQL, and each process's view of them.

Rules (docs/resilience.md § The breaker): a ``balance``/``quota`` answer is a strike on its key; the
second strike at least ``TREG_CAPACITY_STRIKE_GAP_S`` after the first, within
``TREG_CAPACITY_STRIKE_WINDOW_S``, with no 2xx between, locks the key until the vendor's stated reset
(capped at ``TREG_CAPACITY_MAX_HOLD_S``) or for ``TREG_CAPACITY_GUESS_HOLD_S``. Failures while locked
never extend it; a probe's 2xx clears exactly that lock.

Each write is its own short transaction that locks the key's row (INSERT … ON CONFLICT DO NOTHING, then
SELECT … FOR UPDATE), so two processes striking at once serialise and agree. Every change NOTIFYs
``treg_capacity``; :class:`LockView` LISTENs and reloads its in-memory copy, so a check on an unlocked
provider costs no query (TTL fallback, and a 1 s refresh while the listener is down).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import aiopg
import psycopg2
from sqlalchemy import delete, or_, select, update
from sqlalchemy.dialects.postgresql import insert

from treg.infra.db import Database, Tx
from treg.infra.schema import capacity_keys as ck
from treg.settings import Settings

log = logging.getLogger(__name__)

CHANNEL = "treg_capacity"
#: while the listener is down the view reloads at least this often (the contract's 2 s)
_DISCONNECTED_REFRESH_S = 1.0
#: the most stop() waits for the listener to end
STOP_TIMEOUT_S = 5.0

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class Lock:
    key: str
    provider: str
    endpoint: str | None
    kind: str
    since: datetime
    until: datetime
    #: the vendor stated the reset (a 503's Retry-After is then known)
    reset_stated: bool

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "provider": self.provider, "endpoint": self.endpoint, "kind": self.kind,
                "since": _iso(self.since), "until": _iso(self.until), "strikes": 2}


def _iso(when: datetime | None) -> str | None:
    return when.astimezone(timezone.utc).isoformat().replace("+00:00", "Z") if when is not None else None


def lock_key(kind: str, provider: str, endpoint: str | None) -> str:
    """``balance`` locks the provider; ``quota`` the endpoint (its id, which starts with the provider)."""
    return endpoint if kind == "quota" and endpoint else provider


@dataclass(frozen=True)
class StrikeOutcome:
    """What one strike did: ``first`` (a new strike), ``same`` (within the gap of the first: one burst),
    ``locked`` (the second strike locked the key), ``already_locked`` (ignored: never extended)."""

    outcome: str
    key: str
    lock: Lock | None = None


def _lock_of(row: dict[str, Any]) -> Lock:
    return Lock(row["key"], row["provider"], row["endpoint"], row["kind"], row["locked_since"], row["locked_until"],
                row["reset_stated"])


class BreakerStore:
    """The writes and reads of ``capacity_keys``. ``clock`` is injectable so the rules are tested without
    waiting; ``view`` (optional) is refreshed after this process's own writes, not only on its NOTIFY."""

    def __init__(self, db: Database, settings: Settings, *, clock: Clock = utcnow, view: "LockView | None" = None):
        self.db = db
        self.settings = settings
        self.clock = clock
        self.view = view

    async def _notify(self, tx: Tx, key: str) -> None:
        await tx.execute("SELECT pg_notify(%(ch)s, %(key)s)", {"ch": CHANNEL, "key": key})

    async def _after_write(self) -> None:
        if self.view is not None:
            await self.view.refresh()

    async def strike(self, kind: str, provider: str, endpoint: str | None,
                     resets_at: datetime | None = None) -> StrikeOutcome:
        """Record one ``balance``/``quota`` answer (after its hold was settled or released)."""
        if kind not in ("balance", "quota"):
            raise ValueError(f"{kind!r} never strikes")
        s = self.settings
        key = lock_key(kind, provider, endpoint)
        now = self.clock()
        async with self.db.tx() as tx:
            await tx.execute(insert(ck).values(key=key, provider=provider,
                                               endpoint=endpoint if kind == "quota" else None, kind=kind)
                             .on_conflict_do_nothing(index_elements=["key"]))
            row = await tx.fetch_one(select(ck).where(ck.c.key == key).with_for_update())
            assert row is not None
            if row["locked_until"] is not None and row["locked_until"] > now:
                return StrikeOutcome("already_locked", key, _lock_of(row))
            first = row["first_strike_at"]
            expired = row["locked_until"] is not None  # a lock that ended: its strikes are spent
            if expired or row["strikes"] == 0 or first is None or \
                    (now - first).total_seconds() > s.capacity_strike_window_s:
                await tx.execute(update(ck).where(ck.c.key == key).values(
                    strikes=1, first_strike_at=now, last_strike_at=now, locked_since=None, locked_until=None,
                    reset_stated=False, updated_at=now))
                await self._notify(tx, key)
                outcome = StrikeOutcome("first", key)
            elif (now - first).total_seconds() < s.capacity_strike_gap_s:
                # concurrent failures of one instant (or a retry storm right after it) are one strike
                await tx.execute(update(ck).where(ck.c.key == key).values(last_strike_at=now, updated_at=now))
                return StrikeOutcome("same", key)
            else:
                cap = now + timedelta(seconds=s.capacity_max_hold_s)
                if resets_at is not None and resets_at > now:
                    until, stated = min(resets_at, cap), True
                else:
                    until, stated = now + timedelta(seconds=s.capacity_guess_hold_s), False
                row = await tx.fetch_one(update(ck).where(ck.c.key == key).values(
                    strikes=2, last_strike_at=now, locked_since=now, locked_until=until, reset_stated=stated,
                    updated_at=now).returning(*ck.c))
                await self._notify(tx, key)
                outcome = StrikeOutcome("locked", key, _lock_of(row))  # type: ignore[arg-type]
        await self._after_write()
        if outcome.outcome == "locked":
            log.warning("capacity lock on %s (%s) until %s", key, kind, _iso(outcome.lock.until))  # type: ignore[union-attr]
        return outcome

    async def succeeded(self, provider: str, endpoint: str | None) -> int:
        """A 2xx on this provider/endpoint (not a probe): pending strikes on both keys are forgotten.
        Returns how many keys it cleared. Free when the view knows of no pending strike."""
        keys = [k for k in dict.fromkeys((provider, endpoint)) if k]
        if self.view is not None and not any(self.view.has_strike(k) for k in keys):
            return 0
        now = self.clock()
        async with self.db.tx() as tx:
            n = await tx.execute(update(ck).where(ck.c.key.in_(keys), ck.c.strikes == 1,
                                                  or_(ck.c.locked_until.is_(None), ck.c.locked_until <= now))
                                 .values(strikes=0, first_strike_at=None, last_strike_at=None, updated_at=now))
            if n:  # nothing pending was cleared: nobody needs to reload
                for key in keys:
                    await self._notify(tx, key)
        await self._after_write()
        return n

    async def probe_succeeded(self, key: str) -> bool:
        """A probe's 2xx: exactly that lock is cleared (True when there was one)."""
        return await self._delete(key)

    async def clear(self, key: str) -> bool:
        """The operator removes one key's lock and strikes (``treg capacity clear``)."""
        return await self._delete(key)

    async def _delete(self, key: str) -> bool:
        async with self.db.tx() as tx:
            n = await tx.execute(delete(ck).where(ck.c.key == key))
            await self._notify(tx, key)
        await self._after_write()
        return n > 0

    async def rows(self) -> list[dict[str, Any]]:
        """Every lock and pending strike (``treg capacity list``): ``{key, provider, endpoint, kind, since,
        until, strikes}``; an expired lock is left out."""
        now = self.clock()
        async with self.db.tx() as tx:
            rows = await tx.fetch_all(select(ck).where(or_(ck.c.locked_until > now,
                                                           ck.c.strikes > 0)).order_by(ck.c.key))
        out = []
        for r in rows:
            locked = r["locked_until"] is not None and r["locked_until"] > now
            if not locked and r["first_strike_at"] is not None and \
                    (now - r["first_strike_at"]).total_seconds() > self.settings.capacity_strike_window_s:
                continue  # a strike whose window passed counts for nothing
            out.append({"key": r["key"], "provider": r["provider"], "endpoint": r["endpoint"], "kind": r["kind"],
                        "since": _iso(r["locked_since"] if locked else r["first_strike_at"]),
                        "until": _iso(r["locked_until"]) if locked else None,
                        "strikes": r["strikes"] if not locked else 2, "locked": locked})
        return out

    async def locks(self) -> list[dict[str, Any]]:
        return [r for r in await self.rows() if r["locked"]]


class LockView:
    """This process's copy of the locks and pending strikes, reloaded on NOTIFY (and on TTL).

    :meth:`lookup` answers from memory while fresh: on an unlocked provider it costs no query. The probe
    slot (one probe per lock key per ``TREG_CAPACITY_PROBE_INTERVAL_S``) is per process, in memory.
    """

    def __init__(self, db: Database, settings: Settings, *, clock: Clock = utcnow,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.db = db
        self.settings = settings
        self.clock = clock
        self.monotonic = monotonic
        self._locks: dict[str, Lock] = {}
        self._strikes: set[str] = set()
        self._loaded_at: float | None = None
        self._probes: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._refreshing: asyncio.Task[None] | None = None
        self._conn: Any = None  # the listener's connection, closed by stop()
        self.connected = asyncio.Event()
        #: how many times the view read the database (tests: a check on an unlocked provider adds none)
        self.loads = 0

    # -- the listener --------------------------------------------------------------------------
    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._listen(), name="treg-capacity-listener")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.connected.wait(), 5)

    async def stop(self) -> None:
        """Stop listening, bounded. The connection is closed first: that ends aiopg's ``notifies.get()``
        with an error, where a cancellation alone was seen to leave the task "cancelling" for good
        (aiopg 1.4's ``ClosableQueue.get`` inside ``asyncio.wait``), hanging the app's shutdown."""
        self._stopping = True
        if self._conn is not None:
            self._conn.close()
        tasks = [t for t in (self._task, self._refreshing) if t is not None and not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=STOP_TIMEOUT_S)
            if pending:
                log.warning("capacity listener did not stop within %.0f s; left to the event loop", STOP_TIMEOUT_S)
        for task in tasks:
            if task.done() and not task.cancelled():
                task.exception()  # retrieved: an error on the way out is not "never retrieved"

    async def _listen(self) -> None:
        backoff = 0.2
        while not self._stopping:
            try:
                async with aiopg.connect(self.db.dsn) as conn:
                    self._conn = conn
                    if self._stopping:
                        break
                    async with conn.cursor() as cur:
                        await cur.execute(f"LISTEN {CHANNEL}")
                    self.connected.set()
                    await self.refresh()  # what changed while nobody listened
                    backoff = 0.2
                    while True:
                        await conn.notifies.get()
                        while not conn.notifies.empty():  # a burst of changes is one reload
                            conn.notifies.get_nowait()
                        await self.refresh()
            except asyncio.CancelledError:
                raise
            except (psycopg2.Error, OSError) as exc:
                if self._stopping:
                    break  # stop() closed the connection
                log.warning("capacity listener lost its connection (%s); locks reloaded every %.0f s until it is "
                            "back", type(exc).__name__, _DISCONNECTED_REFRESH_S)
            except Exception:
                log.exception("capacity listener failed; locks reloaded every %.0f s until it is back",
                              _DISCONNECTED_REFRESH_S)
            finally:
                self._conn = None
            self.connected.clear()
            if self._stopping:
                break
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)

    # -- reads ---------------------------------------------------------------------------------
    async def refresh(self) -> None:
        now = self.clock()
        self.loads += 1
        async with self.db.tx() as tx:
            rows = await tx.fetch_all(select(ck).where(or_(ck.c.locked_until > now, ck.c.strikes > 0)))
        self._locks = {r["key"]: _lock_of(r) for r in rows if r["locked_until"] is not None and r["locked_until"] > now}
        self._strikes = {r["key"] for r in rows if r["strikes"] > 0 and r["key"] not in self._locks}
        self._loaded_at = self.monotonic()
        for key in [k for k in self._probes if k not in self._locks]:
            self._probes.pop(key, None)

    def _stale(self) -> bool:
        if self._loaded_at is None:
            return True
        limit = self.settings.cache_ttl_s if self.connected.is_set() else _DISCONNECTED_REFRESH_S
        return self.monotonic() - self._loaded_at > limit

    async def lookup(self, provider: str, endpoint: str | None) -> Lock | None:
        """The lock covering a call to ``provider``/``endpoint`` (the provider's first), or None."""
        if self._stale():
            await self.refresh()
        return self.cached(provider, endpoint)

    def cached(self, provider: str, endpoint: str | None) -> Lock | None:
        """:meth:`lookup` without a refresh (synchronous; what the view last loaded)."""
        if not self._locks:
            return None
        now = self.clock()
        for key in (provider, endpoint):
            lock = self._locks.get(key) if key else None
            if lock is not None and lock.until > now:
                return lock
        return None

    def has_strike(self, key: str) -> bool:
        return key in self._strikes

    def lock_count(self) -> int:
        """Locks in force now, as last loaded (the ``treg_capacity_locks`` gauge: no query per scrape)."""
        now = self.clock()
        return sum(1 for lock in self._locks.values() if lock.until > now)

    def take_probe(self, lock: Lock) -> bool:
        """Whether this call may go through as the lock's probe (one per key per interval, per process)."""
        now = self.monotonic()
        last = self._probes.get(lock.key)
        if last is not None and now - last < self.settings.capacity_probe_interval_s:
            return False
        self._probes[lock.key] = now
        return True
