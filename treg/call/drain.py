"""An answer's body drained by an edge: the one loop with which the HTTP edge (``treg/web/call.py``, to the
caller's socket) and the MCP edge (``treg/mcp/backend.py``, into a bounded buffer) take a
:class:`~treg.call.state.CallOutcome`'s body.

:func:`drain` hands the body to a :class:`Sink` — all at once when it is already in hand, else chunk by
chunk as it arrives, until the sink has enough — then closes the outcome and calls its ``finish``
exactly once, whatever ended it, with the bytes the sink took and the error if there was one. An error
the sink names as an ending (:attr:`Sink.ends`: the upstream breaking mid-answer, the caller gone) is
recorded and returned; anything else (a cancellation) is recorded and raised again.
"""

from __future__ import annotations

from typing import ClassVar

from treg.call.state import CallOutcome
from treg.errors import TregError


class Sink:
    """Where :func:`drain` delivers an answer's body (an edge subclasses it)."""

    __slots__ = ()

    #: errors that end the answer early as an ordinary outcome: returned by :func:`drain`, not raised
    ends: ClassVar[tuple[type[BaseException], ...]] = (TregError,)

    async def start(self) -> None:
        """Before any of the body (the HTTP edge sends the answer's head here)."""

    async def whole(self, data: bytes) -> None:
        """The whole body, already in hand."""
        raise NotImplementedError

    async def chunk(self, data: bytes) -> bool:
        """One piece of a streamed body; True when the sink wants no more (the rest is not read: the
        upstream connection is dropped when the outcome closes)."""
        raise NotImplementedError

    async def end(self) -> None:
        """A streamed body ended (not called when the sink stopped it)."""

    def broken(self, exc: BaseException) -> None:
        """One of :attr:`ends` ended the answer; told before the outcome is closed."""


async def drain(outcome: CallOutcome, sink: Sink) -> tuple[int, BaseException | None]:
    """``outcome``'s body into ``sink``, the outcome closed and finished exactly once: (bytes taken, the
    ending error or None)."""
    taken = 0
    error: BaseException | None = None
    try:
        await sink.start()
        if outcome.whole is not None:
            await sink.whole(outcome.whole)
            taken = len(outcome.whole)
        else:
            async for chunk in outcome.body:
                enough = await sink.chunk(chunk)
                taken += len(chunk)
                if enough:
                    break
            else:
                await sink.end()
    except sink.ends as exc:
        error = exc
        sink.broken(exc)
    except BaseException as exc:  # cancellation (the caller hung up): recorded as such, then re-raised
        error = exc
        raise
    finally:
        outcome.close()
        # finish() is synchronous (it queues the audit row), so even a cancelled drain completes it
        outcome.finish(taken, error)
    return taken, error
