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
  worker thread (at most 2 at a time) and only the values at the evidence paths settlement and plugins
  read survive, each at its place (a skeleton of the answer, not its inline media).

Either way the caller gets the bytes the upstream sent (compressed when it compressed); the evidence
copy is decoded (:mod:`treg.call.encodings`, bounded) so a compressed answer settles from its usage.
"""

from __future__ import annotations

import asyncio
import tempfile
import weakref
from dataclasses import dataclass
from typing import IO, Any, AsyncIterator, Iterable, Sequence

from treg import json_text, jsonpath
from treg.call import encodings
from treg.call.bodies import read_bounded
from treg.errors import GatewayFailed
from treg.infra.upstream import UpstreamResponse
from treg.spool_budget import SpoolBudget

BUFFER_MAX = 8 * 1024 * 1024
SPOOL_MAX = 64 * 1024 * 1024
SPOOL_READ = 256 * 1024
#: the most a compressed buffered answer is inflated to for its evidence (not for the caller)
EVIDENCE_DECODED_MAX = 16 * 1024 * 1024
#: compressed answers up to this size are inflated on the event loop; larger ones in a worker thread
DECODE_INLINE_MAX = 256 * 1024


def _limit_error(detail: str) -> GatewayFailed:
    return GatewayFailed(detail, code="response_buffer_limit", blame="treg")


async def buffer_answer(resp: UpstreamResponse, limit: int | None = None) -> bytes:
    limit = BUFFER_MAX if limit is None else limit
    try:
        return await read_bounded(resp.body, limit, lambda: _limit_error(
            f"the provider's answer is larger than {limit} bytes, the most treg reads to settle a metered call; "
            "nothing was charged"))
    finally:
        resp.close()  # a no-op after a full read


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


def _place(skeleton: Any, doc: Any, parts: list[str], value: Any) -> Any:
    """``skeleton`` with ``value`` set at ``parts``, building the containers on the way as ``doc``
    (the answer) has them."""
    if not parts:
        return value
    key, rest = parts[0], parts[1:]
    if isinstance(doc, dict):
        base = skeleton if isinstance(skeleton, dict) else {}
        base[key] = _place(base.get(key), doc[key], rest, value)
        return base
    i = int(key)
    base = skeleton if isinstance(skeleton, list) else []
    base.extend([None] * (i + 1 - len(base)))  # earlier items stay placeholders, so indexes hold
    base[i] = _place(base[i], doc[i], rest, value)
    return base


def _keep_paths(doc: Any, paths: Iterable[str]) -> Any:
    """Only the values at the evidence paths survive, each at its original place: the path
    ``candidates.0.finishReason`` keeps ``{"candidates": [{"finishReason": "STOP"}]}``, not the
    megabytes of inline media beside it in ``candidates.0.content``. A JSON answer that is no object
    keeps nothing (``{}``): it is JSON all the same (a success rule tells it from no JSON)."""
    if not isinstance(doc, dict):
        return {}
    out: dict[str, Any] = {}
    for path in paths:
        parts = jsonpath.parts(path)
        value = jsonpath.dig(doc, parts, jsonpath.MISSING) if parts else jsonpath.MISSING
        if value is not jsonpath.MISSING:
            out = _place(out, doc, parts, value)
    return out


async def spool_evidence(spooled: Spooled, paths: Iterable[str], applied: Sequence[str] = ()) -> Any:
    """Parse the spooled JSON once in a worker thread; keep only ``paths``. ``applied``: the answer's
    content codings (the spool holds the bytes as relayed), undone for the parse within the spool
    limit. Not JSON, or not decodable: None (no evidence, as :func:`answer_evidence` says it)."""
    paths = list(paths)

    def parse() -> Any:
        spooled.file.seek(0)
        try:
            if applied:
                decoded = encodings.decode(spooled.file.read(), list(applied), SPOOL_MAX)
                if decoded is None:
                    return None
                doc = json_text.parse(decoded)
            else:
                doc = json_text.parse_file(spooled.file)
        except ValueError:  # not JSON, not text, or nested too deeply (treg/json_text.py): no evidence
            return None
        return _keep_paths(doc, paths)

    async with spooled.budget.parse_gate:
        return await asyncio.to_thread(parse)


async def answer_evidence(data: bytes, headers: Sequence[tuple[str, str]] = (), *,
                          applied: list[str] | None = None) -> Any:
    """The JSON a buffered answer carries, for settlement; its content codings (``applied``, else read
    from ``headers``) undone (bounded by ``EVIDENCE_DECODED_MAX``: a larger or undecodable answer has no
    evidence). None when not JSON."""
    if applied is None:
        applied = encodings.codings(headers)
    if applied:
        if len(data) > DECODE_INLINE_MAX:  # a large inflate would stall every other call on the loop
            decoded = await asyncio.to_thread(encodings.decode, data, applied, EVIDENCE_DECODED_MAX)
        else:
            decoded = encodings.decode(data, applied, EVIDENCE_DECODED_MAX)
        if decoded is None:
            return None
        data = decoded
    try:
        return json_text.parse(data)
    except ValueError:  # not JSON, not text, or nested too deeply (treg/json_text.py): no evidence
        return None
