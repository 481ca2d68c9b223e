"""``Closes``: every upstream response's ``CloseOnce`` made during a test and each ``close()`` called on
it, to prove an answer's upstream is closed exactly once however the call ends (the ``closes`` fixture of
:mod:`treg.testing.pytest_plugin` installs it with :func:`record_closes`)."""

from __future__ import annotations

import asyncio
from typing import Any

from treg.infra import upstream as upstream_mod

_BOUND = 10.0  # seconds any single wait may take before the test fails (a bound, not a timing)


class Closes:
    """Every CloseOnce made during the test and each close() call on it: (complete, was_already_closed)."""

    def __init__(self) -> None:
        self.instances: list[upstream_mod.CloseOnce] = []
        self.calls: dict[int, list[tuple[bool, bool]]] = {}
        self.changed = asyncio.Event()

    def effective(self, closer: upstream_mod.CloseOnce) -> list[bool]:
        return [complete for complete, already in self.calls.get(id(closer), []) if not already]

    async def wait_closed(self, n: int = 1) -> list[upstream_mod.CloseOnce]:
        async def until() -> None:
            while sum(1 for c in self.instances if c.closed) < n:
                self.changed.clear()
                await self.changed.wait()
        await asyncio.wait_for(until(), _BOUND)
        return self.instances


def record_closes(monkeypatch: Any) -> Closes:
    """A :class:`Closes` that sees every CloseOnce from now on (``monkeypatch`` undoes it after the test)."""
    rec = Closes()
    orig_init = upstream_mod.CloseOnce.__init__
    orig_close = upstream_mod.CloseOnce.close

    def init(self: Any, resp: Any) -> None:
        orig_init(self, resp)
        rec.instances.append(self)
        rec.calls[id(self)] = []

    def close(self: Any, *, complete: bool = False) -> None:
        rec.calls[id(self)].append((complete, self.closed))
        orig_close(self, complete=complete)
        rec.changed.set()

    monkeypatch.setattr(upstream_mod.CloseOnce, "__init__", init)
    monkeypatch.setattr(upstream_mod.CloseOnce, "close", close)
    return rec
