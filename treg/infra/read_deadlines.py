"""The upstream read timeout (``TREG_UPSTREAM_READ_TIMEOUT_S``, aiohttp's ``sock_read``) kept by one ticker
per session instead of a loop timer per read.

A speed trick (docs/performance.md, round 6). aiohttp keeps ``sock_read`` with a timer it cancels and
creates again on every piece of data the upstream sends: two timers per short call (one when the request
is sent, one when the answer arrives), and, for a long answer, one per chunk. Each is a ``TimerHandle``
pushed on the loop's heap (``TimerHandle.__lt__`` is Python code), and a cancelled one stays there until
the loop rebuilds the heap. That was ~5 % of treg's instructions per short call (41 k of ~890 k).

Here the connection's protocol (:class:`DeadlineHandler`) keeps only a deadline, moved by the very same
calls aiohttp makes (``_reschedule_timeout`` on data, on sending, on resuming; ``_drop_timeout`` on the
end of the answer, a pause for backpressure, a loss): moving it is a clock read and a set insertion.
One :class:`ReadDeadlines` task per session wakes every ``tick`` (a quarter of the timeout, at most a
second) while any connection is watched and hands an expired one aiohttp's own timeout
(``_on_read_timeout``), so the caller sees exactly what aiohttp raises (``SocketTimeoutError``, mapped to
502 ``upstream_timeout``). The only difference: the timeout fires up to one tick late.

Relies on aiohttp internals (``ResponseHandler`` and its three timer methods, ``TCPConnector._factory``):
tests/test_aiohttp_canary.py names them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler

log = logging.getLogger(__name__)

#: the longest a ticker sleeps (a timeout fires at most this late)
TICK_MAX_S = 1.0


class ReadDeadlines:
    """The connections of one session with a read deadline, and the one task that expires them."""

    def __init__(self, timeout_s: float | None) -> None:
        self.tick = min(TICK_MAX_S, timeout_s / 4) if timeout_s else TICK_MAX_S
        self.watched: set[DeadlineHandler] = set()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        #: how many timeouts the ticker handed out (tests)
        self.expired = 0

    def watch(self, proto: "DeadlineHandler") -> None:
        self.watched.add(proto)
        if self._task is None and not self._closed:
            self._task = proto._loop.create_task(self._run(), name="treg-upstream-read-deadlines")

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while self.watched:
                await asyncio.sleep(self.tick)
                now = loop.time()
                for proto in [p for p in self.watched if p.deadline <= now]:
                    self.watched.discard(proto)
                    self.expired += 1
                    try:
                        proto._on_read_timeout()  # aiohttp's own timeout: the reader gets SocketTimeoutError
                    except Exception:  # noqa: BLE001 (one connection's failure must not stop the others' expiry)
                        log.exception("expiring an upstream read deadline failed")
        finally:
            self._task = None  # the next watched connection starts a new one

    async def close(self) -> None:
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class DeadlineHandler(ResponseHandler):
    """aiohttp's client protocol whose ``sock_read`` is a deadline on :class:`ReadDeadlines`, not a timer."""

    deadline = 0.0

    def __init__(self, loop: asyncio.AbstractEventLoop, deadlines: ReadDeadlines) -> None:
        super().__init__(loop)
        self._deadlines = deadlines

    def _reschedule_timeout(self) -> None:
        timeout = self._read_timeout
        if timeout:
            self.deadline = self._loop.time() + timeout
            self._deadlines.watch(self)
        else:
            self._deadlines.watched.discard(self)

    def _drop_timeout(self) -> None:
        self._deadlines.watched.discard(self)


class DeadlineConnector(aiohttp.TCPConnector):
    """A TCPConnector whose connections keep their read timeouts on one :class:`ReadDeadlines`."""

    def __init__(self, *, read_timeout_s: float | None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.deadlines = ReadDeadlines(read_timeout_s)
        self._factory = functools.partial(DeadlineHandler, loop=self._loop, deadlines=self.deadlines)

    async def close(self, *, abort_ssl: bool = False) -> None:
        await self.deadlines.close()
        await super().close(abort_ssl=abort_ssl)
