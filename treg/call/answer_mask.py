"""An answer made safe for a caller who must not read the credential that fetched it.

Two kinds of call inject a credential their caller does not own: a **hub call** of another org's tool
(the publisher's secret; treg/call/hub_stage.py) and a **platform-tier** catalog call (treg's own vendor
key, ``TREG_PLATFORM_KEY_*``; the settle stage's metered answer, treg/call/settle.py). Both answers are
read whole before any byte leaves (bounded, as a metered answer), so an upstream that echoes what it got
(an error quoting the key, a debugging echo of the request, a status line carrying the Authorization)
is checked first: every injected value is masked (``[REDACTED]``) in every header, in the status line's
reason phrase (replaced by the status's standard phrase) and in the body, in every spelling the redactor
knows (raw, percent-encoded, base64, hex, JSON escapes). A body in a content coding is decoded to be
checked; when nothing had to be masked the bytes go out as they came, coding and all; when something
was, the masked body goes out decoded (its ``Content-Encoding`` dropped, its length the new one).

The decoded copy is bounded (``metered.EVIDENCE_DECODED_MAX``, 16 MiB, as settlement's evidence): a
gzip or deflate answer inflating past it (a decompression bomb, or a very large JSON) is scanned
instead, in steps of :data:`SCAN_STEP` with an overlap longer than any masked form, off the event loop
and up to :data:`SCAN_DECODED_MAX`: found clean, it is relayed as it came; holding a value (which could
only be masked by sending gigabytes decoded), past the scan's bound, or in a coding treg cannot decode
at all (br or zstd without its library), it is refused by the caller's stage (its own error code),
nothing charged.

A platform-tier answer with no hold to settle (a free endpoint's, often a download) is not read whole:
it streams through :func:`guarded`, which lets no byte out before the bytes it decodes to, and an
overlap after them, were checked; a value found cuts the answer there (the caller sees a truncated
answer, never the value, and the call is audited ``stream_error``). One that arrived whole with its head
is checked whole (:func:`checked`).
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass
from typing import IO, AsyncIterator, Callable, Iterator

from treg.call import encodings, metered
from treg.errors import GatewayFailed
from treg.infra.upstream import UpstreamResponse
from treg.redaction import Redactor


@dataclass(frozen=True, slots=True)
class Checked:
    """What the caller may get of an answer: its body, its headers and its reason phrase."""

    data: bytes
    headers: list[tuple[str, str]]
    reason: str


#: the decoded bytes one step of a scan inflates
SCAN_STEP = 256 * 1024
#: the most a scan inflates before it gives up (CPU: ~1 s of a thread)
SCAN_DECODED_MAX = 256 * 1024 * 1024


async def checked(redactor: Redactor, resp: UpstreamResponse, data: bytes,
                  headers: list[tuple[str, str]]) -> Checked | None:
    """``data`` and ``headers`` (the answer's, as relayed) with ``redactor``'s values masked. None: the
    answer cannot be checked (the caller refuses it with :func:`unreadable`'s words)."""
    headers, reason = checked_head(redactor, resp, headers)
    applied = encodings.codings(resp.headers)
    plain = data
    if applied and data:
        plain = (await asyncio.to_thread(encodings.decode, data, applied, metered.EVIDENCE_DECODED_MAX)
                 if len(data) > metered.DECODE_INLINE_MAX else encodings.decode(data, applied,
                                                                               metered.EVIDENCE_DECODED_MAX))
    if plain is None and await asyncio.to_thread(clean_in_steps, redactor, data, applied):
        return Checked(data, headers, reason)
    if plain is None:
        return None
    masked = redactor.data(plain)
    if masked == plain:
        return Checked(data, headers, reason)
    if applied:
        headers = [(k, v) for k, v in headers if k.lower() != "content-encoding"]
    return Checked(masked, headers, reason)


def checked_head(redactor: Redactor, resp: UpstreamResponse,
                 headers: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], str]:
    """The answer's headers with the values masked, and its reason phrase ("" when it held one: the edge
    writes the status's standard phrase)."""
    reason = resp.reason or ""
    if redactor.text(reason) != reason:
        reason = ""
    return [(k, redactor.text(v)) for k, v in headers], reason


def unreadable(whose: str) -> str:
    """The detail of the refusal of an answer :func:`checked` could not check for ``whose`` credential."""
    return (f"the upstream's answer cannot be read whole (its content coding, or its size decoded), so treg "
            f"cannot check it for {whose}; nothing was charged (ask without Accept-Encoding, or with gzip)")


def clean_in_steps(redactor: Redactor, data: bytes, applied: list[str]) -> bool:
    """Whether ``data`` in one gzip or deflate coding inflates, within :data:`SCAN_DECODED_MAX`, to bytes
    holding none of ``redactor``'s forms (scanned step by step, never whole). False: it holds one, it is
    larger, malformed or truncated, or its coding is another."""
    return _clean(redactor, lambda: iter((data,)), applied)


def clean_spool(redactor: Redactor, file: IO[bytes], applied: list[str]) -> bool:
    """Whether a spooled answer (the bytes as relayed, in ``file``) holds none of ``redactor``'s forms, read
    in steps (identity, or one gzip or deflate coding undone as it is read; blocking: run it in a thread)."""
    def chunks() -> Iterator[bytes]:
        file.seek(0)
        while chunk := file.read(SCAN_STEP):
            yield chunk
    return _clean(redactor, chunks, applied)


def _clean(redactor: Redactor, chunks: Callable[[], Iterator[bytes]], applied: list[str]) -> bool:
    # the longest masked form of a value: its JSON \\uXXXX escapes, six bytes a character (and more than
    # any base64, hex or percent form); a window keeps that much of the step before it
    overlap = 8 * max((len(v) for v in redactor.values), default=0)
    if not applied:
        return _windows_clean(redactor, chunks(), overlap)
    if len(applied) != 1 or applied[0] not in ("gzip", "x-gzip", "deflate"):
        return False
    for wbits in ((31,) if applied[0] != "deflate" else (15, -15)):
        try:
            return _windows_clean(redactor, _inflated(chunks(), wbits), overlap)
        except zlib.error:
            continue
        except _Truncated:
            return False
    return False


class _Truncated(Exception):
    """The stream ended before its coding's end, or inflated past :data:`SCAN_DECODED_MAX`."""


def _inflated(chunks: Iterator[bytes], wbits: int) -> Iterator[bytes]:
    d = zlib.decompressobj(wbits=wbits)
    total = 0
    for chunk in chunks:
        pending = chunk
        while pending and not d.eof:
            out = d.decompress(pending, SCAN_STEP)
            pending = d.unconsumed_tail
            total += len(out)
            if total > SCAN_DECODED_MAX:
                raise _Truncated
            yield out
        while not d.eof:  # the input is in; output zlib held back at the step's limit comes now
            out = d.decompress(b"", SCAN_STEP)
            if not out:
                break
            total += len(out)
            if total > SCAN_DECODED_MAX:
                raise _Truncated
            yield out
        if d.eof:
            return
    raise _Truncated


def _windows_clean(redactor: Redactor, parts: Iterator[bytes], overlap: int) -> bool:
    tail = b""
    for part in parts:
        window = tail + part
        if redactor.data(window) != window:
            return False
        tail = window[-overlap:] if overlap else b""
    return True


class ValueInAnswer(GatewayFailed):
    """A streamed answer held a value its caller must not read (or one treg could not check): cut where it
    was found; its head is out by then, so the caller sees a truncated answer (the edge closes the
    connection), audited as a stream error."""

    def __init__(self) -> None:
        super().__init__("the upstream's answer held treg's own key (or could not be checked for it) and was "
                         "cut there; nothing of the key was relayed", code="platform_answer_unreadable",
                         blame="upstream")


def streamable(applied: list[str]) -> bool:
    """Whether :func:`guarded` can check an answer in these content codings as it streams."""
    return not applied or (len(applied) == 1 and applied[0] in ("gzip", "x-gzip", "deflate"))


async def guarded(redactor: Redactor, body: AsyncIterator[bytes], applied: list[str]) -> AsyncIterator[bytes]:
    """``body`` relayed as it came, each chunk let out only once what it decodes to and ``overlap``
    decoded bytes after it (or the end) were checked for ``redactor``'s forms; raises
    :class:`ValueInAnswer` where one is found (``applied``: one of :func:`streamable`'s codings)."""
    overlap = 8 * max((len(v) for v in redactor.values), default=0)
    inflate = None
    if applied:
        inflate = zlib.decompressobj(wbits=31 if applied[0] != "deflate" else 15)
    held: list[tuple[bytes, int]] = []  # chunks not yet let out, with the decoded length they end at
    tail, decoded = b"", 0

    def check(out: bytes) -> None:
        nonlocal tail, decoded
        window = tail + out
        if redactor.data(window) != window:
            raise ValueInAnswer
        decoded += len(out)
        if decoded > SCAN_DECODED_MAX:
            raise ValueInAnswer  # past what treg checks: not let out unchecked
        tail = window[-overlap:] if overlap else b""

    async for chunk in body:
        if inflate is None:
            check(chunk)
        else:
            pending = chunk
            try:
                while pending and not inflate.eof:
                    check(inflate.decompress(pending, SCAN_STEP))
                    pending = inflate.unconsumed_tail
            except zlib.error:
                raise ValueInAnswer from None  # a stream treg cannot read is one it cannot check
        held.append((chunk, decoded))
        while held and held[0][1] + overlap <= decoded:
            yield held.pop(0)[0]
    if inflate is not None:
        try:
            while not inflate.eof and (out := inflate.decompress(b"", SCAN_STEP)):
                check(out)
        except zlib.error:
            raise ValueInAnswer from None
    for chunk, _ in held:  # the end: everything was checked
        yield chunk
