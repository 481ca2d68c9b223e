"""The slots of the hub calls running now, held in PostgreSQL so every treg process on the database agrees.

A hub call takes a slot **in one short statement before the relay** (``treg_hub_take``, migration 0019:
the publishing org's advisory lock held for that statement only, its expired slots deleted, its
running ones counted, a row inserted) and gives it back **after its answer finished streaming** (one
``DELETE``, off the answer's path). No transaction is held across the relay. Refused, the call is 429
``hub_busy`` at once, naming the count (``active``), the limit that refused (``limit``: the tool's own
``max_runs`` first, then ``TREG_HUB_MAX_RUNS_PER_TEAM``) and ``retry_after_s``; nothing waits in a queue.

A slot is a lease: its row expires ``TREG_HUB_LEASE_S`` after it was taken or last renewed, and the
process that holds it renews every slot of its running calls in one statement every third of that
(:func:`setup`'s loop). A process that dies (kill -9) renews nothing, and its slots are free again
within the lease; a call that outlives a lease keeps its slot because it is renewed, not because the
lease is long.

A field of the services (``Services.hub``), so it sits below them, beside the other parts a process
holds (as ``treg/oauth_runtime.py`` does); it knows a published tool only by the parts a slot reads
(:class:`Slotted`, a ``treg.hub.model.HubTool``). The rest of the hub is ``treg/hub/``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Protocol

from treg import periodic
from treg.errors import TregError
from treg.ids import new_id

log = logging.getLogger(__name__)

TAKE_SQL = ("SELECT refused, active, limit_runs FROM treg_hub_take(%(run)s, %(publisher)s, %(tool)s, %(caller)s, "
            "%(holder)s, %(team)s, %(tool_limit)s, %(lease)s)")
RELEASE_SQL = "DELETE FROM hub_runs WHERE id = %(run)s"
RENEW_SQL = "UPDATE hub_runs SET expires_at = now() + make_interval(secs => %(lease)s) WHERE id = ANY(%(ids)s)"
#: what a refusal suggests: a hub call is a relayed request, and most end within a second or two
RETRY_AFTER_S = 1
#: a give-back that fails is tried this often before its lease is left to expire
RELEASE_ATTEMPTS = 3


class HubBusy(TregError):
    """429: the publishing org (or the tool) runs as many hub calls as it may; never queued
    (docs/errors.md "Hub")."""

    status, code, blame = 429, "hub_busy", "caller"

    def __init__(self, detail: str, *, active: int, limit: int, retry_after_s: int, **extra: Any) -> None:
        super().__init__(detail, refused_by="hub", headers={"Retry-After": str(retry_after_s)}, active=active,
                         limit=limit, retry_after_s=retry_after_s, **extra)


class Slotted(Protocol):
    """What a slot reads of a published tool (``treg.hub.model.HubTool``)."""

    @property
    def id(self) -> str: ...

    @property
    def org_id(self) -> str: ...

    @property
    def max_runs(self) -> int | None: ...

    @property
    def ref(self) -> str: ...


class HubRuns:
    """This process's hub runs: its holder name, the slots it holds, the give-backs in flight."""

    def __init__(self) -> None:
        #: names this process in ``hub_runs.holder`` (a restart is a new holder)
        self.holder = new_id("proc")
        #: the slots this process holds: run id → the publishing org whose limit it counts against
        self._live: dict[str, str] = {}
        #: the give-backs in flight → the publishing org each frees a slot of
        self._releasing: dict[asyncio.Task[None], str] = {}

    @property
    def live(self) -> set[str]:
        """The run ids of the slots this process holds."""
        return set(self._live)

    async def take(self, svc: Any, run_id: str, tool: Slotted, caller_org_id: str) -> None:
        """Take a slot for call ``run_id`` of ``tool``, or raise :class:`HubBusy` (nothing taken)."""
        mine = [task for task, publisher in self._releasing.items() if publisher == tool.org_id]
        if mine:
            # this process's own finished runs of this publisher count as free: their DELETEs land first.
            # Only this publisher's: every slot a take counts is one of its (the tool's limit, the team's),
            # and another publisher's give-back retrying through a database hiccup must not hold this call
            await asyncio.gather(*mine, return_exceptions=True)
        params = {"run": run_id, "publisher": tool.org_id, "tool": tool.id, "caller": caller_org_id,
                  "holder": self.holder, "team": max(1, int(svc.settings.hub_max_runs_per_team)),
                  "tool_limit": tool.max_runs, "lease": float(svc.settings.hub_lease_s)}
        (refused, active, limit), = await svc.db.run(TAKE_SQL, params, path="hub")
        if refused is not None:
            whose = f"{tool.ref} runs" if refused == "tool" else f"the org publishing {tool.ref} runs"
            raise HubBusy(f"{whose} {active} hub call(s) at once, its limit ({limit}); retry in a moment "
                          "(hub calls are never queued)", active=active, limit=limit, retry_after_s=RETRY_AFTER_S)
        self._live[run_id] = tool.org_id

    def release(self, svc: Any, run_id: str) -> None:
        """Give the slot of ``run_id`` back, off the caller's path (safe to call twice, or for a run that
        took none)."""
        publisher = self._live.pop(run_id, None)
        if publisher is None:
            return
        task = asyncio.get_running_loop().create_task(self._release(svc, run_id), name=f"treg-hub-release-{run_id}")
        self._releasing[task] = publisher
        task.add_done_callback(lambda done: self._releasing.pop(done, None))

    async def _release(self, svc: Any, run_id: str) -> None:
        for attempt in range(1, RELEASE_ATTEMPTS + 1):
            try:
                await svc.db.run(RELEASE_SQL, {"run": run_id}, path="hub")
                return
            except TregError as exc:
                if attempt == RELEASE_ATTEMPTS:
                    log.warning("hub: the slot of %s could not be given back (%s); it frees when its lease ends",
                                run_id, exc.code)
                    return
                await asyncio.sleep(0.05 * attempt)

    async def renew(self, svc: Any) -> None:
        """Extend the lease of every slot this process holds (one statement; nothing when it holds none)."""
        if self._live:
            await svc.db.run(RENEW_SQL, {"lease": float(svc.settings.hub_lease_s), "ids": sorted(self._live)},
                             path="hub")

    async def drain(self) -> None:
        """Wait for the give-backs in flight (shutdown, tests)."""
        while self._releasing:
            await asyncio.gather(*list(self._releasing), return_exceptions=True)


async def setup(app: Any, svc: Any) -> Callable[[], Awaitable[None]]:
    """Component (treg.app.COMPONENTS): this process's runs, their leases renewed until shutdown, the last
    give-backs written before the database closes."""
    runs = svc.hub
    close_renewer = periodic.every(max(0.1, svc.settings.hub_lease_s / 3), lambda: runs.renew(svc),
                                   name="treg-hub-leases", log=log)

    async def close() -> None:
        await close_renewer()
        await runs.drain()

    return close
