"""The breaker's store and lock view against the real PostgreSQL (docs/resilience.md § The breaker)."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from treg.capacity.breaker import BreakerStore, LockView
from treg.infra.db import Database


@pytest.fixture
def store(svc, clock):
    return BreakerStore(svc.db, svc.settings, clock=clock)


async def test_second_strike_after_the_gap_locks_the_provider_for_the_guess_hold(store, clock):
    assert (await store.strike("balance", "acme", "acme.items-get")).outcome == "first"
    clock.advance(15)
    out = await store.strike("balance", "acme", "acme.items-get")
    assert out.outcome == "locked" and out.key == "acme"
    assert out.lock.until == clock.now + timedelta(seconds=3600) and not out.lock.reset_stated
    assert out.lock.endpoint is None  # balance: the whole provider


async def test_strikes_within_the_gap_are_one_strike(store, clock):
    await store.strike("quota", "acme", "acme.items-get")
    clock.advance(14.9)
    assert (await store.strike("quota", "acme", "acme.items-get")).outcome == "same"
    assert (await store.rows())[0]["strikes"] == 1


async def test_concurrent_failures_of_one_instant_from_two_processes_are_one_strike(svc, dsn, clock):
    other = await Database(dsn, minsize=1, maxsize=4).open()
    try:
        a, b = BreakerStore(svc.db, svc.settings, clock=clock), BreakerStore(other, svc.settings, clock=clock)
        outs = await asyncio.gather(*[s.strike("balance", "acme", None) for s in (a, b) * 4])
        assert sorted(o.outcome for o in outs) == ["first"] + ["same"] * 7
        clock.advance(20)
        outs = await asyncio.gather(*[s.strike("balance", "acme", None) for s in (a, b) * 3])
        assert sorted(o.outcome for o in outs) == ["already_locked"] * 5 + ["locked"]
    finally:
        await other.close()


async def test_a_strike_outside_the_window_starts_over(store, clock):
    await store.strike("balance", "acme", None)
    clock.advance(601)
    assert (await store.strike("balance", "acme", None)).outcome == "first"


async def test_a_2xx_between_strikes_forgets_the_first(store, clock):
    await store.strike("quota", "acme", "acme.items-get")
    clock.advance(5)
    assert await store.succeeded("acme", "acme.items-get") == 1
    clock.advance(20)
    assert (await store.strike("quota", "acme", "acme.items-get")).outcome == "first"


async def test_quota_locks_only_the_endpoint_and_the_stated_reset_is_capped(store, svc, clock):
    await store.strike("quota", "acme", "acme.items-get")
    clock.advance(30)
    out = await store.strike("quota", "acme", "acme.items-get", resets_at=clock.now + timedelta(minutes=10))
    assert out.lock.until == clock.now + timedelta(minutes=10) and out.lock.reset_stated
    view = LockView(svc.db, svc.settings, clock=clock)
    await view.refresh()
    assert (await view.lookup("acme", "acme.items-get")).key == "acme.items-get"
    assert await view.lookup("acme", "acme.other") is None
    await store.clear("acme.items-get")
    await store.strike("quota", "acme", "acme.items-get")
    clock.advance(30)
    out = await store.strike("quota", "acme", "acme.items-get", resets_at=clock.now + timedelta(days=3))
    assert out.lock.until == clock.now + timedelta(seconds=21600)


async def test_failures_while_locked_never_extend_and_a_probe_2xx_clears_exactly_that_lock(store, clock):
    for key_kind, ep in (("balance", None), ("quota", "acme.items-get")):
        await store.strike(key_kind, "acme", ep)
    clock.advance(20)
    first = await store.strike("balance", "acme", None)
    await store.strike("quota", "acme", "acme.items-get")
    clock.advance(100)
    again = await store.strike("balance", "acme", None)
    assert again.outcome == "already_locked" and again.lock.until == first.lock.until
    assert await store.probe_succeeded("acme")
    assert [r["key"] for r in await store.locks()] == ["acme.items-get"]


async def test_a_lock_ends_at_its_until(store, svc, clock):
    await store.strike("balance", "acme", None)
    clock.advance(20)
    await store.strike("balance", "acme", None)
    view = LockView(svc.db, svc.settings, clock=clock)
    await view.refresh()
    assert await view.lookup("acme", None) is not None
    clock.advance(3601)
    assert view.cached("acme", None) is None
    assert await store.locks() == []
    assert (await store.strike("balance", "acme", None)).outcome == "first"


async def test_the_probe_slot_is_one_per_key_per_interval(svc, clock):
    now = [0.0]
    view = LockView(svc.db, svc.settings.replace(capacity_probe_interval_s=60), clock=clock, monotonic=lambda: now[0])
    store = BreakerStore(svc.db, svc.settings, clock=clock, view=view)
    await store.strike("balance", "acme", None)
    clock.advance(20)
    lock = (await store.strike("balance", "acme", None)).lock
    assert view.take_probe(lock) and not view.take_probe(lock)
    now[0] = 59.9
    assert not view.take_probe(lock)
    now[0] = 60.0
    assert view.take_probe(lock)


async def test_a_check_on_an_unlocked_provider_costs_no_query(svc, clock):
    view = LockView(svc.db, svc.settings, clock=clock)
    await view.start()
    try:
        loads = view.loads
        for _ in range(100):
            assert await view.lookup("acme", "acme.items-get") is None
        assert view.loads == loads
        store = BreakerStore(svc.db, svc.settings, clock=clock, view=view)
        assert await store.succeeded("acme", "acme.items-get") == 0 and view.loads == loads  # no strike: no write
    finally:
        await view.stop()


async def test_a_lock_written_by_one_process_is_honoured_by_the_other_within_2s(svc, dsn, clock):
    other_db = await Database(dsn, minsize=1, maxsize=4).open()
    view = LockView(other_db, svc.settings, clock=clock)  # the other process's view
    await view.start()
    try:
        assert view.connected.is_set() and await view.lookup("acme", None) is None
        writer = BreakerStore(svc.db, svc.settings, clock=clock)
        await writer.strike("balance", "acme", None)
        clock.advance(20)
        await writer.strike("balance", "acme", None)
        for _ in range(40):  # bounded: 2 s
            if view.cached("acme", None) is not None:
                break
            await asyncio.sleep(0.05)
        assert view.cached("acme", None) is not None  # via NOTIFY, not a TTL reload (TTL is 30 s)
        await writer.clear("acme")
        for _ in range(40):
            if view.cached("acme", None) is None:
                break
            await asyncio.sleep(0.05)
        assert view.cached("acme", None) is None
    finally:
        await view.stop()
        await other_db.close()


async def test_rows_list_locks_and_strikes_in_the_contract_shape(store, clock):
    await store.strike("quota", "acme", "acme.items-get")
    await store.strike("balance", "beta", None)
    clock.advance(20)
    await store.strike("balance", "beta", None)
    rows = {r["key"]: r for r in await store.rows()}
    assert set(rows["beta"]) >= {"key", "provider", "endpoint", "kind", "since", "until", "strikes"}
    assert rows["beta"]["until"].endswith("Z") and rows["beta"]["strikes"] == 2
    assert rows["acme.items-get"] == {"key": "acme.items-get", "provider": "acme", "endpoint": "acme.items-get",
                                      "kind": "quota", "since": "2026-12-01T10:00:00Z", "until": None, "strikes": 1,
                                      "locked": False}


async def test_burst_never_strikes(store):
    with pytest.raises(ValueError):
        await store.strike("burst", "acme", None)


async def test_strikes_spent_by_an_ended_lock_do_not_count_again(svc, clock):
    store = BreakerStore(svc.db, svc.settings.replace(capacity_guess_hold_s=60), clock=clock)
    await store.strike("balance", "acme", None)
    clock.advance(20)
    assert (await store.strike("balance", "acme", None)).outcome == "locked"
    clock.advance(61)  # the lock ended, still inside the strike window of the first strike
    assert (await store.strike("balance", "acme", None)).outcome == "first"


async def test_without_its_listener_the_view_reloads_at_least_every_second(svc, clock):
    now = [0.0]
    view = LockView(svc.db, svc.settings, clock=clock, monotonic=lambda: now[0])
    await view.lookup("acme", None)
    loads = view.loads
    now[0] = 0.9
    await view.lookup("acme", None)
    assert view.loads == loads
    now[0] = 1.1
    await view.lookup("acme", None)
    assert view.loads == loads + 1
