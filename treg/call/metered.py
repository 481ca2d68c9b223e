"""Reading a metered answer whole before it is settled: the 8 MiB buffer and the spool for inline media.

A billed answer is settled before its headers go out (so ``X-Treg-Cost-Micro`` is exact), which means
reading it first. Two bounded ways (the seed's "Complete downloads and bounded response evidence" and
"Spooled evidence for inline media"):

* :func:`buffer_answer`: in memory, at most 8 MiB; the first chunk past the limit raises
  ``response_buffer_limit`` (502, blame treg) before any header is sent; the upstream is closed in
  ``finally`` on EOF, error or cancellation.
* :func:`spool_answer` for endpoints declaring ``spooled_response``: into an unlinked temporary file,
  at most 64 MiB per answer and 512 MiB per process (a declared Content-Length is claimed whole before
  the first read, so concurrent answers are admitted or refused whole). The file is parsed once in a
  worker thread (at most 2 at a time) and only the evidence paths settlement and plugins read survive.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import weakref
from dataclasses import dataclass
from typing import IO, Any, AsyncIterator, Iterable

from treg.errors import GatewayFailed
from treg.infra.upstream import UpstreamResponse

BUFFER_MAX = 8 * 1024 * 1024
SPOOL_MAX = 64 * 1024 * 1024
SPOOL_BUDGET = 512 * 1024 * 1024
SPOOL_PARSE_CONCURRENCY = 2
SPOOL_READ = 256 * 1024


def _limit_error(detail: str) -> GatewayFailed:
    return GatewayFailed(detail, code="response_buffer_limit", blame="treg")


async def buffer_answer(resp: UpstreamResponse, limit: int | None = None) -> bytes:
    limit = BUFFER_MAX if limit is None else limit
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in resp.body:
            size += len(chunk)
            if size > limit:
                raise _limit_error(f"the provider's answer is larger than {limit} bytes, the most treg reads "
                                   "to settle a metered call; nothing was charged")
            parts.append(chunk)
    finally:
        resp.close()  # a no-op after a full read
    return b"".join(parts)


class SpoolBudget:
    """Bytes the spools of one process may hold at once."""

    def __init__(self, total: int | None = None, parse_concurrency: int = SPOOL_PARSE_CONCURRENCY) -> None:
        self.total = SPOOL_BUDGET if total is None else total
        self.used = 0
        self._lock = threading.Lock()  # released from weakref finalizers too
        self.parse_gate = asyncio.Semaphore(parse_concurrency)

    def claim(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.total:
                return False
            self.used += n
            return True

    def give_back(self, n: int) -> None:
        with self._lock:
            self.used = max(0, self.used - n)


@dataclass
class Spooled:
    file: IO[bytes]
    size: int
    claimed: int
    budget: SpoolBudget

    def __post_init__(self) -> None:
        self._closed = False
        # a spool dropped without close() still returns its budget
        self._finalizer = weakref.finalize(self, _release, self.file, self.budget, self.claimed)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._finalizer()

    async def stream(self) -> AsyncIterator[bytes]:
        try:
            await asyncio.to_thread(self.file.seek, 0)
            while True:
                chunk = await asyncio.to_thread(self.file.read, SPOOL_READ)
                if not chunk:
                    break
                yield chunk
        finally:
            self.close()


def _release(file: IO[bytes], budget: SpoolBudget, claimed: int) -> None:
    try:
        file.close()
    finally:
        budget.give_back(claimed)


def _declared_length(resp: UpstreamResponse) -> int | None:
    for k, v in resp.headers:
        if k.lower() == "content-length" and v.strip().isdigit():
            return int(v)
    return None


async def spool_answer(resp: UpstreamResponse, budget: SpoolBudget, limit: int | None = None) -> Spooled:
    limit = SPOOL_MAX if limit is None else limit
    claimed = 0
    file: IO[bytes] | None = None
    ok = False
    try:
        declared = _declared_length(resp)
        if declared is not None:
            if declared > limit:
                raise _limit_error(f"the provider's answer ({declared} bytes) is larger than the {limit}-byte "
                                   "spool limit; nothing was charged")
            if not budget.claim(declared):
                raise _limit_error("treg's spool budget is in use by other answers right now (temporary); "
                                   "nothing was charged, retry shortly")
            claimed = declared
        file = tempfile.TemporaryFile()  # unlinked from creation: a crash leaves nothing on disk
        size = 0
        async for chunk in resp.body:
            size += len(chunk)
            if size > limit:
                raise _limit_error(f"the provider's answer is larger than the {limit}-byte spool limit; "
                                   "nothing was charged")
            if size > claimed:
                if not budget.claim(size - claimed):
                    raise _limit_error("treg's spool budget is in use by other answers right now (temporary); "
                                       "nothing was charged, retry shortly")
                claimed = size
            await asyncio.to_thread(file.write, chunk)
        ok = True
        return Spooled(file, size, claimed, budget)
    finally:
        resp.close()
        if not ok:
            if file is not None:
                file.close()
            budget.give_back(claimed)


def _keep_paths(doc: Any, paths: Iterable[str]) -> dict[str, Any]:
    """Only the top-level keys the evidence paths start with survive, at their original place."""
    if not isinstance(doc, dict):
        return {}
    keep = {p.split(".", 1)[0].split("[", 1)[0] for p in paths}
    return {k: v for k, v in doc.items() if k in keep}


async def spool_evidence(spooled: Spooled, paths: Iterable[str]) -> dict[str, Any]:
    """Parse the spooled JSON once in a worker thread; keep only ``paths``. Not JSON: empty evidence."""
    paths = list(paths)

    def parse() -> dict[str, Any]:
        spooled.file.seek(0)
        try:
            doc = json.load(spooled.file)
        except (ValueError, UnicodeDecodeError):
            return {}
        return _keep_paths(doc, paths)

    async with spooled.budget.parse_gate:
        return await asyncio.to_thread(parse)
