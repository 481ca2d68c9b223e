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
import operator
import zlib
from dataclasses import dataclass
from typing import IO, Any, AsyncIterator, Container, Iterable, Iterator

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
    applied = encodings.answer_codings(resp)
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


#: a session the vendor opens with an answer is one of the account whose credential treg injected, so it
#: is a credential too: a caller who may not read that credential (treg's own key on the platform tier,
#: a publisher's on the hub) gets no ``Set-Cookie`` of it
SESSION_HEADERS = frozenset({"set-cookie", "set-cookie2"})


def without_sessions(headers: Iterable[tuple[str, str]], index: Container[str] | None = None) -> list[tuple[str, str]]:
    """``headers`` without the vendor's session cookies (:data:`SESSION_HEADERS`). ``index``: the answer's
    names (case-insensitive, every name ``headers`` holds): without a cookie header among them, nothing is
    dropped and ``headers`` come back as a list without a look at each."""
    if index is not None and "set-cookie" not in index and "set-cookie2" not in index:
        return headers if isinstance(headers, list) else list(headers)
    return [(k, v) for k, v in headers if k.lower() not in SESSION_HEADERS]


_value = operator.itemgetter(1)  # a header pair's value, in C


def checked_head(redactor: Redactor, resp: UpstreamResponse,
                 headers: list[tuple[str, str]]) -> tuple[list[tuple[str, str]], str]:
    """The answer's headers with the values masked, and its reason phrase ("" when it held one: the edge
    writes the status's standard phrase)."""
    reason = resp.reason or ""
    # one scan of every value at once for the usual answer, which holds no form of any value (a header
    # value never holds a line break, so a form found across two of them only sends it the long way)
    together = "\n".join([reason, *map(_value, headers)])
    if redactor.text(together) == together:
        return headers, reason
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
    return _clean(redactor, iter((data,)), applied)


def clean_spool(redactor: Redactor, file: IO[bytes], applied: list[str]) -> bool:
    """Whether a spooled answer (the bytes as relayed, in ``file``) holds none of ``redactor``'s forms, read
    in steps (identity, or one gzip or deflate coding undone as it is read; blocking: run it in a thread)."""
    def chunks() -> Iterator[bytes]:
        file.seek(0)
        while chunk := file.read(SCAN_STEP):
            yield chunk
    return _clean(redactor, chunks(), applied)


def _clean(redactor: Redactor, chunks: Iterator[bytes], applied: list[str]) -> bool:
    if not streamable(applied):
        return False
    scan = _Scanner(redactor, applied)
    try:
        for chunk in chunks:
            scan.feed(chunk)
    except ValueInAnswer:
        return False
    return scan.complete


class ValueInAnswer(GatewayFailed):
    """A streamed answer held a value its caller must not read (or one treg could not check): cut where it
    was found; its head is out by then, so the caller sees a truncated answer (the edge closes the
    connection), audited as a stream error."""

    def __init__(self) -> None:
        super().__init__("the upstream's answer held treg's own key (or could not be checked for it) and was "
                         "cut there; nothing of the key was relayed", code="platform_answer_unreadable",
                         blame="upstream")


class _Scanner:
    """An answer's decoded bytes checked as its pieces (as relayed) are fed in: :meth:`feed` raises
    :class:`ValueInAnswer` at a value, at bytes its coding cannot be read from, or past
    :data:`SCAN_DECODED_MAX`; ``decoded`` is how much was checked so far. Each window checked keeps the
    end of the one before it: more than the longest masked form of a value (its JSON ``\\uXXXX``
    escapes, six bytes a character; every base64, hex or percent form is shorter)."""

    def __init__(self, redactor: Redactor, applied: list[str]) -> None:
        self._redactor = redactor
        self.overlap = 8 * max((len(v) for v in redactor.values), default=0)
        self._coding = applied[0] if applied else None
        self._inflate: Any = None
        self._tail = b""
        self.decoded = 0

    @property
    def complete(self) -> bool:
        """The answer's coding reached its end (an identity answer: always)."""
        return self._coding is None or (self._inflate is not None and self._inflate.eof)

    def feed(self, chunk: bytes) -> None:
        if self._coding is None:
            self._check(chunk)
            return
        if self._inflate is None:
            self._inflate = zlib.decompressobj(wbits=_wbits(self._coding, chunk))
        d = self._inflate
        try:
            pending = chunk
            while pending and not d.eof:
                self._check(d.decompress(pending, SCAN_STEP))
                pending = d.unconsumed_tail
            # the input is in; what zlib held back at a step's limit comes now, so ``decoded`` counts
            # everything this chunk decodes to
            while not d.eof and (out := d.decompress(b"", SCAN_STEP)):
                self._check(out)
        except zlib.error:
            raise ValueInAnswer from None  # a stream treg cannot read is one it cannot check

    def _check(self, out: bytes) -> None:
        window = self._tail + out
        self.decoded += len(out)
        if self.decoded > SCAN_DECODED_MAX or self._redactor.data(window) != window:
            raise ValueInAnswer
        self._tail = window[-self.overlap:] if self.overlap else b""


def _wbits(coding: str, first: bytes) -> int:
    """zlib's window bits for the coding: gzip's header; for ``deflate`` the zlib format RFC 9110 names, or
    the raw deflate stream some servers send instead (told by the zlib header's check bits)."""
    if coding != "deflate":
        return 31
    zlib_header = len(first) >= 2 and first[0] & 0x0F == 8 and ((first[0] << 8) | first[1]) % 31 == 0
    return 15 if zlib_header else -15


def streamable(applied: list[str]) -> bool:
    """Whether :func:`guarded` can check an answer in these content codings as it streams."""
    return not applied or (len(applied) == 1 and applied[0] in ("gzip", "x-gzip", "deflate"))


async def guarded(redactor: Redactor, body: AsyncIterator[bytes], applied: list[str]) -> AsyncIterator[bytes]:
    """``body`` relayed as it came, each chunk let out only once what it decodes to and an overlap of
    decoded bytes after it (or the end) were checked for ``redactor``'s forms; raises
    :class:`ValueInAnswer` where one is found (``applied``: one of :func:`streamable`'s codings)."""
    scan = _Scanner(redactor, applied)
    held: list[tuple[bytes, int]] = []  # chunks not yet let out, with the decoded length they end at
    async for chunk in body:
        scan.feed(chunk)
        held.append((chunk, scan.decoded))
        while held and held[0][1] + scan.overlap <= scan.decoded:
            yield held.pop(0)[0]
    for chunk, _ in held:  # the end: everything was checked
        yield chunk
