"""In-process caches for what rarely changes (identities, tools, deny rules, secrets) that stay
correct when another treg process on the same database changes the data.

Writes go through ``org_changes.changes(svc, kind, org_id)``, whose NOTIFY PostgreSQL delivers on commit
to every process LISTENing on ``treg_changes``; the listener drops that org's entries. If the listening
connection is lost, every cache is cleared and bypassed until it is back, so a missed notification
can never serve stale data. As a second guard every entry also expires after ``TREG_CACHE_TTL_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, ClassVar, Generic, Hashable, Iterable, Iterator, TypeVar

import aiopg
import psycopg2

log = logging.getLogger(__name__)

T = TypeVar("T")
_monotonic = time.monotonic
CHANNEL = "treg_changes"


class OrgCache(Generic[T]):
    """key → value, each entry tagged with its org so an org's change drops exactly its entries.

    A load that overlaps a change must not put the old data back: every drop bumps an epoch, and a
    value loaded before the bump is not stored (the next call loads again). Concurrent misses of one
    key share one load (single-flight), so an expiry under load costs one query, not one per call."""

    def __init__(self, name: str, ttl_s: float, max_entries: int = 10_000) -> None:
        self.name = name
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._data: dict[Hashable, tuple[float, str, T]] = {}
        self._enabled = False  # only while the listener is connected
        self._epoch = 0
        self._inflight: dict[Hashable, asyncio.Future[T]] = {}
        self.hits = 0
        self.misses = 0

    @property
    def enabled(self) -> bool:
        return self._enabled

    @enabled.setter
    def enabled(self, value: bool) -> None:
        if not value:
            self.clear()  # a cache holds nothing while off: :meth:`get` need not ask
        self._enabled = value

    def get(self, key: Hashable) -> T | None:
        # no ``enabled`` test on the hot path: switched off, the cache was emptied, and :meth:`put` stores
        # nothing until it is on again, so a lookup misses
        item = self._data.get(key)
        if item is None or item[0] < _monotonic():
            self.misses += 1
            return None
        self.hits += 1
        return item[2]

    def snapshot(self) -> int:
        """Take before loading; hand to :meth:`put` so a load that raced a change is not stored."""
        return self._epoch

    def put(self, key: Hashable, value: T, *, org_id: str, epoch: int | None = None) -> None:
        if not self.enabled or (epoch is not None and epoch != self._epoch):
            return
        if len(self._data) >= self.max_entries:
            self._data.clear()  # crude but bounded; refilled on demand
        self._data[key] = (time.monotonic() + self.ttl_s, org_id, value)

    def drop_org(self, org_id: str) -> None:
        self._epoch += 1
        for key in [k for k, (_, org, _) in self._data.items() if org == org_id]:
            self._data.pop(key, None)

    def clear(self) -> None:
        self._epoch += 1
        self._data.clear()

    async def get_or_load(self, key: Hashable, org_id: str, load: Callable[[], Awaitable[T]]) -> T:
        """The cached value, else ``load()``'s (stored unless a change raced it). Hot callers try
        :meth:`get` first: a hit then costs no coroutine."""
        value = self.get(key)
        if value is not None:
            return value
        if not self.enabled:
            return await load()
        pending = self._inflight.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        epoch = self._epoch
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._inflight[key] = fut
        try:
            value = await load()
        except BaseException as exc:
            if not fut.done():
                fut.set_exception(exc if isinstance(exc, Exception) else RuntimeError("cache load cancelled"))
                fut.exception()  # retrieved: no "never retrieved" warning when nobody waited
            raise
        else:
            fut.set_result(value)
            self.put(key, value, org_id=org_id, epoch=epoch)
            return value
        finally:
            self._inflight.pop(key, None)


class NullCache(OrgCache[T]):
    """The cache of a process that keeps none (the CLI, domain tests: no change listener runs): every
    get misses, every load runs, nothing is stored, and no listener can switch it on. Callers use it
    exactly like an :class:`OrgCache`, so no use site asks whether caching is on."""

    def __init__(self, name: str) -> None:
        super().__init__(name, ttl_s=0.0, max_entries=0)

    @property
    def enabled(self) -> bool:
        return False

    @enabled.setter
    def enabled(self, value: bool) -> None:
        pass  # never on: a null cache has nothing the listener could keep correct

    def get(self, key: Hashable) -> T | None:
        return None

    def put(self, key: Hashable, value: T, *, org_id: str, epoch: int | None = None) -> None:
        pass

    async def get_or_load(self, key: Hashable, org_id: str, load: Callable[[], Awaitable[T]]) -> T:
        return await load()


@dataclass(frozen=True)
class Caches:
    """The per-org caches of one process: who a token is, an org's tools, deny rules and secret rows;
    and one not of an org, the async jobs' utilities (tagged :data:`treg.jobs.store.UTILITIES_TAG`).

    :meth:`off` (null caches) until the call runtime installs real ones with their listener."""

    identity: OrgCache[Any]
    tools: OrgCache[Any]
    deny: OrgCache[Any]
    secrets: OrgCache[Any]
    jobs: OrgCache[Any]

    @classmethod
    def off(cls) -> "Caches":
        return cls(*(NullCache(name) for name in cls.NAMES))

    @classmethod
    def live(cls, ttl_s: float) -> "Caches":
        return cls(*(OrgCache(name, ttl_s) for name in cls.NAMES))

    def __iter__(self) -> Iterator[OrgCache[Any]]:
        return iter((self.identity, self.tools, self.deny, self.secrets, self.jobs))

    def drop_org(self, org_id: str) -> None:
        for cache in self:
            cache.drop_org(org_id)

    NAMES: ClassVar[tuple[str, ...]] = ("identity_cache", "tools_cache", "deny_cache", "secrets_cache", "jobs_cache")


class ChangeListener:
    """One dedicated connection LISTENing for changes; drops cache entries as they arrive."""

    def __init__(self, dsn: str, caches: Iterable[OrgCache[Any]]) -> None:
        self._dsn = dsn
        self._caches = list(caches)
        #: payload kind -> what a notification of that kind does, instead of dropping the org's caches
        #: (``leases``: treg/money/holds.py asks for an org's credit leases back)
        self.handlers: dict[str, Callable[[str], None]] = {}
        #: told ``True`` when the listener connects and ``False`` when it loses its connection: what is
        #: notified meanwhile is never heard (see :meth:`watch_connection`)
        self._watchers: list[Callable[[bool], None]] = []
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.connected = asyncio.Event()

    def _set_enabled(self, enabled: bool) -> None:
        for cache in self._caches:
            cache.clear()
            cache.enabled = enabled

    def watch_connection(self, watcher: Callable[[bool], None]) -> None:
        """Tell ``watcher`` whether the listener is connected, now and on every change. A notification
        sent while it is not is lost, not delayed: the caches are bypassed meanwhile, and a handler's
        owner must not count on hearing one (the settler parks no credit in leases then, since a
        request to return them could not reach it)."""
        self._watchers.append(watcher)
        self._tell(watcher, self.connected.is_set())

    def _connection(self, up: bool) -> None:
        if up == self.connected.is_set():
            return
        if up:
            self.connected.set()
        else:
            self.connected.clear()
        for watcher in self._watchers:
            self._tell(watcher, up)

    @staticmethod
    def _tell(watcher: Callable[[bool], None], up: bool) -> None:
        try:
            watcher(up)
        except Exception:  # noqa: BLE001 - a watcher's failure must not end the listener
            log.exception("change listener: a connection watcher failed")

    def _apply(self, payload: str) -> None:
        kind, _, org_id = payload.partition(":")
        handler = self.handlers.get(kind)
        if handler is not None:
            try:
                handler(org_id)
            except Exception:  # noqa: BLE001 - a handler's failure must not end the listener
                log.exception("change listener: the %s handler failed", kind)
            return
        for cache in self._caches:
            cache.drop_org(org_id)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="treg-cache-listener")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.connected.wait(), 5)

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._set_enabled(False)

    async def _run(self) -> None:
        backoff = 0.2
        while not self._stopping:
            try:
                async with aiopg.connect(self._dsn) as conn:
                    async with conn.cursor() as cur:
                        await cur.execute(f"LISTEN {CHANNEL}")
                    self._set_enabled(True)
                    self._connection(True)
                    backoff = 0.2
                    while True:
                        msg = await conn.notifies.get()
                        self._apply(msg.payload)
            except asyncio.CancelledError:
                raise
            except (psycopg2.Error, OSError) as exc:
                log.warning("cache listener lost its connection (%s); caches bypassed until it is back",
                            type(exc).__name__)
            except Exception:
                log.exception("cache listener failed; caches bypassed until it is back")
            self._connection(False)
            self._set_enabled(False)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
