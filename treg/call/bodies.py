"""A body read whole, bounded: the one loop for every body the call pipeline must hold in memory.

* a request body treg must see before it relays it (:meth:`treg.call.state.CallState.read_body`: a
  catalog check, an idempotency digest, an archive key, a routed call's children, an overflow's re-send;
  a JSON binding in the relay; a deny rule's ``_method`` in the authorize stage, with its own refusal);
* an answer read before it is settled (``treg/call/metered.py`` ``buffer_answer``), or a routed call's
  child's.

Each caller names its limit and what going past it is: the first chunk past the limit raises, so no
more than the limit and one chunk are ever held.
"""

from __future__ import annotations

from typing import AsyncIterable, Callable

from treg.errors import BadRequest, TregError


async def read_bounded(chunks: AsyncIterable[bytes], limit: int, too_large: Callable[[], TregError]) -> bytes:
    """Every chunk joined, or ``too_large()`` raised at the first one past ``limit`` bytes."""
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise too_large()
        parts.append(chunk)
    return b"".join(parts)


async def buffer_body(body: bytes | AsyncIterable[bytes] | None, limit: int) -> bytes:
    """A request body in memory, at most ``limit`` bytes (400 ``body_too_large``); none: ``b""``."""
    if body is None:
        return b""
    if isinstance(body, bytes):
        if len(body) > limit:
            raise BadRequest(f"the body is larger than {limit} bytes", code="body_too_large")
        return body
    return await read_bounded(body, limit, lambda: BadRequest(
        f"the body is larger than {limit} bytes, the most a JSON binding buffers", code="body_too_large"))
