"""``Clock``: a clock a test moves by hand, for the stores that take a ``clock=`` (capacity's breaker,
overflow's budget day, the DNS cache's TTLs): time passes without sleeping."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

#: where a :class:`Clock` starts unless told: a fixed UTC instant, so dates in a test never depend on today
T0 = datetime(2026, 12, 1, 10, 0, tzinfo=timezone.utc)


class Clock:
    """``clock()`` is ``clock.now``: a timezone-aware datetime (a wall clock, :data:`T0` unless told) or a
    float (a monotonic clock: ``Clock(1000.0)``). Move it with :meth:`advance` or by setting ``now``."""

    def __init__(self, now: datetime | float = T0) -> None:
        self.now: Any = now

    def __call__(self) -> Any:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds) if isinstance(self.now, datetime) else seconds
