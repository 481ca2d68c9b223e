"""The hub's slots in PostgreSQL (treg/hub_runs.py, ``treg_hub_take``): twenty takes of one publisher at the
same instant on twenty connections admit exactly the limit (the tool's own ``max_runs`` first, then the
org's), an expired lease is free again, a renewed one is not, and a give-back frees its slot."""

from __future__ import annotations

import asyncio
import threading

import psycopg2
import pytest

from treg import membership
from treg.hub.model import HubTool
from treg.hub_runs import HubBusy, HubRuns

TAKE = "SELECT refused FROM treg_hub_take(%s, %s, %s, 'org_caller', %s, %s, %s, %s)"


def _takes_at_once(dsn: str, publisher: str, n: int, tool_of, team: int, tool_limit, lease: float = 30.0):
    """``n`` takes released together by a barrier, each on a connection of its own: who got a slot."""
    conns = [psycopg2.connect(dsn) for _ in range(n)]
    for c in conns:
        c.autocommit = True
    barrier = threading.Barrier(n)
    won: list[str] = []
    lock = threading.Lock()

    def take(i: int) -> None:
        with conns[i].cursor() as cur:
            barrier.wait()
            cur.execute(TAKE, (f"call_{i}", publisher, tool_of(i), f"holder_{i}", team, tool_limit(i), lease))
            if cur.fetchone()[0] is None:
                with lock:
                    won.append(f"call_{i}")

    threads = [threading.Thread(target=take, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for c in conns:
        c.close()
    return won


def _count(dsn: str, sql: str, *args) -> int:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchone()[0]
    finally:
        conn.close()


@pytest.fixture
async def publisher(svc):
    return (await membership.create_org(svc, slug="pub", email="o@pub.test"))["org_id"]


async def test_twenty_takes_at_once_admit_exactly_the_orgs_limit(dsn, publisher):
    won = await asyncio.to_thread(_takes_at_once, dsn, publisher, 20, lambda i: f"hub_{i % 3}", 4, lambda i: None)
    assert len(won) == 4 and _count(dsn, "SELECT count(*) FROM hub_runs") == 4


async def test_twenty_takes_of_one_tool_admit_exactly_its_max_runs(dsn, publisher):
    won = await asyncio.to_thread(_takes_at_once, dsn, publisher, 20, lambda i: "hub_one", 10, lambda i: 3)
    assert len(won) == 3


async def test_an_expired_lease_is_free_and_a_renewed_one_is_not(svc, publisher):
    svc.settings = svc.settings.replace(hub_lease_s=0.5, hub_max_runs_per_team=1)
    tool = HubTool("hub_1", publisher, "pub", "t", "tool_1", "", 0, None)
    dead, alive = HubRuns(), HubRuns()
    await dead.take(svc, "call_dead", tool, "org_c")  # its process dies: nobody renews it
    with pytest.raises(HubBusy) as busy:
        await alive.take(svc, "call_2", tool, "org_c")
    assert busy.value.extra["active"] == 1 and busy.value.extra["limit"] == 1 and busy.value.status == 429
    await asyncio.sleep(0.7)
    await alive.take(svc, "call_2", tool, "org_c")  # the dead slot expired: deleted by this take
    for _ in range(3):  # renewed while it runs: it stays taken past its first lease
        await asyncio.sleep(0.3)
        await alive.renew(svc)
    with pytest.raises(HubBusy):
        await dead.take(svc, "call_3", tool, "org_c")
    alive.release(svc, "call_2")
    await alive.drain()
    await dead.take(svc, "call_3", tool, "org_c")
    alive.release(svc, "call_never_taken")  # nothing to give back: a no-op
    assert alive.live == set()


async def test_a_take_waits_for_its_own_publishers_give_backs_only(svc, publisher):
    """A take waits for this process's give-backs in flight of the same publisher (its finished run's slot
    counts as free, not busy), but not for another publisher's: one retrying through a database hiccup
    held every hub call of the process. The give-back is held at its statement here."""
    other = (await membership.create_org(svc, slug="other-pub", email="o@other.test"))["org_id"]
    svc.settings = svc.settings.replace(hub_max_runs_per_team=1)
    mine, theirs = (HubTool("hub_a", publisher, "pub", "a", "tool_a", "", 0, None),
                    HubTool("hub_b", other, "other-pub", "b", "tool_b", "", 0, None))
    runs = HubRuns()
    await runs.take(svc, "call_a1", mine, "org_c")
    await runs.take(svc, "call_b1", theirs, "org_c")
    held, real_run = asyncio.Event(), svc.db.run

    async def run(sql, params, **kw):
        if params.get("run") == "call_b1" and sql.startswith("DELETE"):
            await held.wait()  # the other publisher's give-back, stuck
        return await real_run(sql, params, **kw)

    svc.db.run = run
    try:
        runs.release(svc, "call_b1")
        runs.release(svc, "call_a1")
        # the same publisher's give-back lands first, so its only slot is free for the next run
        await asyncio.wait_for(runs.take(svc, "call_a2", mine, "org_c"), 5)
        assert runs.live == {"call_a2"}
        # while another take of the stuck publisher waits for its give-back, and then gets the slot
        waiting = asyncio.ensure_future(runs.take(svc, "call_b2", theirs, "org_c"))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        held.set()
        await asyncio.wait_for(waiting, 5)
        assert runs.live == {"call_a2", "call_b2"}
    finally:
        held.set()
        svc.db.run = real_run
    runs.release(svc, "call_a2")
    runs.release(svc, "call_b2")
    await runs.drain()
    assert _count(svc.db.dsn, "SELECT count(*) FROM hub_runs") == 0
