"""The spacer's computed waits, on a fake clock (no timed assertion)."""

from __future__ import annotations

import asyncio

from treg.capacity.spacer import Spacer
from treg.catalog.model import RateLimit


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


async def test_calls_are_spaced_window_over_limit_apart():
    t = FakeTime()
    s = Spacer(2000, clock=t.clock, sleep=t.sleep)
    rate = RateLimit(limit=4, window_s=2.0)  # one start per 0.5 s
    waits = [await s.wait("acme", rate) for _ in range(4)]
    assert waits == [0, 500, 1000, 1500]
    assert t.slept == [0.5, 1.0, 1.5]


async def test_a_wait_is_capped_and_the_capped_call_takes_no_slot():
    t = FakeTime()
    s = Spacer(1000, clock=t.clock, sleep=t.sleep)
    rate = RateLimit(limit=1, window_s=0.6)
    assert [await s.wait("acme", rate) for _ in range(3)] == [0, 600, 1000]  # the third would wait 1200
    t.now += 0.6
    assert await s.wait("acme", rate) == 600  # the capped call did not push the queue further


async def test_providers_are_spaced_independently_and_a_provider_without_a_rate_limit_never_waits():
    t = FakeTime()
    s = Spacer(2000, clock=t.clock, sleep=t.sleep)
    rate = RateLimit(limit=1, window_s=1.0)
    assert await s.wait("a", rate) == 0 and await s.wait("b", rate) == 0
    assert await s.wait("a", None) == 0
    t.now += 1.0
    assert await s.wait("a", rate) == 0


async def test_concurrent_calls_start_in_arrival_order_with_real_sleeps():
    s = Spacer(200, sleep=asyncio.sleep)
    rate = RateLimit(limit=100, window_s=1.0)  # 10 ms apart
    order: list[int] = []

    async def call(i: int) -> int:
        waited = await s.wait("acme", rate)
        order.append(i)
        return waited

    waits = await asyncio.gather(*(call(i) for i in range(5)))
    assert waits[0] == 0 and waits == sorted(waits) and len(set(waits)) == 5
    assert order == [0, 1, 2, 3, 4]
