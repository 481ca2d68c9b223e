"""Identifiers: a readable prefix and 128 random bits (``org_3f…``); a call's, 48 bits of its time and 80
random ones (:func:`new_call_id`).

A speed trick, named: **random bytes drawn in blocks** (figures: docs/performance.md, round 6). Every
call gets an id, and ``secrets.token_hex`` is one ``getrandom`` system call each time, the only system
call treg adds to a relayed call; here the operating system's CSPRNG is read ``BLOCK`` ids at a time
and each id takes the next 16 bytes of the block. The bits are the same CSPRNG's, each used once; a
forked child starts on a block of its own (a fork would otherwise hand parent and child the same ids).
The pool is process-wide, like the operating system's source it reads: it holds no state of an app.
"""

from __future__ import annotations

import os
import re
import threading
import time

#: ids per read of the operating system's random source
BLOCK = 256
_ID_BYTES = 16


class _Pool:
    """Random bytes read in blocks, handed out 16 at a time (thread-safe: an executor may make ids)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._block = b""
        self._at = 0

    def take(self) -> bytes:
        with self._lock:
            at = self._at
            if at >= len(self._block):
                self._block, at = os.urandom(BLOCK * _ID_BYTES), 0
            self._at = at + _ID_BYTES
            return self._block[at:at + _ID_BYTES]

    def reset(self) -> None:
        """Forget the block (a forked child must not reuse its parent's bytes)."""
        self._lock = threading.Lock()
        self._block, self._at = b"", 0


_pool = _Pool()
os.register_at_fork(after_in_child=_pool.reset)


def new_id(prefix: str) -> str:
    return f"{prefix}_{_pool.take().hex()}"


def new_call_id() -> str:
    """A call's id: ``call_`` and 32 hex digits like any id, the first 12 of them its time in milliseconds
    (then 80 random bits).

    A speed trick, named (docs/performance.md, round 17): ``calls`` and ``holds`` are keyed by the call's id
    and written on every call. With 128 random bits each new key landed on a random leaf of the primary
    key's index, so every row dirtied a page of its own (after a checkpoint, a whole page in the WAL); keys
    that grow with time are written at the index's right edge. The order is only a speed matter (a clock
    set back costs nothing but that); uniqueness and unguessability are the 80 random bits'. The time it
    tells is when its call began, which its caller and the audit row already know."""
    # the six bytes of the time and ten of the pool's as one hex: 0.58 µs against 0.74 for a formatted time
    return "call_" + ((time.time_ns() // 1_000_000).to_bytes(6, "big") + _pool.take()[:10]).hex()


#: what every id :func:`new_id` makes is written with (a prefix of the caller's, ``_`` and hex): a
#: statement may carry such an id in its text, quoted, with nothing to escape (``fullmatch`` it first)
PLAIN_ID = re.compile(r"[A-Za-z0-9_]+")
