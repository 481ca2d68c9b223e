"""Failed-call evidence: what the caller sent and what came back, redacted and truncated.

Successes keep no content. For a failed call (treg refusal after resolution, upstream ≥ 400, or a
treg-side 502) the audit row keeps ``error_request`` and ``error_response`` in the contract's shapes.
Redaction runs before anything is stored, in this order: every injected secret value is masked
wherever it appears (an upstream may echo the key in its error), then credential headers and cookies,
then key-like query parameters.
"""

from __future__ import annotations

import base64
import functools
import re
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterable, Sequence
from urllib.parse import unquote_plus

from treg.call import encodings

from treg.call.target import mask_userinfo

MASK = "[REDACTED]"
REQUEST_BODY_MAX = 64 * 1024  # a declared-length caller body up to this is kept
RESPONSE_HEAD_MAX = 8 * 1024  # the head of a failed response that is peeked and replayed

_CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key",
                                 "api-key", "apikey", "x-auth-token", "x-access-token", "x-csrf-token"})
_CREDENTIAL_WORDS = ("token", "secret", "password", "passwd", "api-key", "apikey", "api_key", "auth", "signature",
                     "session", "credential", "private")
_KEYLIKE_PARAM = re.compile(r"(key|token|secret|password|passwd|pwd|sig|signature|auth|credential|session|code)",
                            re.I)


def _hex_digit(n: int) -> str:
    d = "0123456789abcdef"[n]
    return d if d.isdigit() else f"[{d}{d.upper()}]"


def _pct(byte: int) -> str:
    # %XX in either case, or double-encoded %25XX
    return "%(?:25)?" + _hex_digit(byte >> 4) + _hex_digit(byte & 15)


def _json_escape(ch: str) -> str:
    """Every JSON string escape of ``ch`` as a pattern (``\\uXXXX`` in either case; a UTF-16 pair
    above the BMP), plus the short forms (``\\/``, ``\\"``, ``\\n``, …)."""
    cp = ord(ch)
    units = [cp] if cp < 0x10000 else [0xD800 + ((cp - 0x10000) >> 10), 0xDC00 + ((cp - 0x10000) & 0x3FF)]
    forms = ["".join(r"\\u" + "".join(_hex_digit((u >> s) & 15) for s in (12, 8, 4, 0)) for u in units)]
    short = {"/": "/", '"': '"', "\\": "\\", "\n": "n", "\r": "r", "\t": "t", "\b": "b", "\f": "f"}.get(ch)
    if short is not None:
        forms.append(re.escape("\\" + short))
    return "|".join(forms)


def _char_forms(ch: str) -> tuple[str, bytes]:
    """One character of a secret in any form it takes on the wire, as a (text, bytes) pattern group:
    itself, percent-encoded byte by byte (either case, double-encoded too: encoders differ in what they
    leave raw, so any character may appear encoded), ``+`` for a space, or a JSON escape."""
    encoded = [ "".join(_pct(b) for b in ch.encode()), _json_escape(ch)]
    if ch == " ":
        encoded += [r"\+", "%2[bB]"]  # form encoding, and that "+" encoded once more
    rest = "|".join(encoded)
    return f"(?:{re.escape(ch)}|{rest})", b"(?:" + re.escape(ch.encode()) + b"|" + rest.encode() + b")"


def _base64_forms(raw: bytes) -> set[str]:
    """The value's base64 in standard and URL-safe alphabets, padded or not; and, for a long value, the
    part of its encoding that is the same wherever it sits inside a larger encoded blob (an echoed
    ``Basic user:key``): its alignment there is 0, 1 or 2 bytes."""
    out: set[str] = set()
    for shift in range(3):
        whole = base64.b64encode(bytes(shift) + raw).decode()
        if shift == 0:
            forms = {whole, whole.rstrip("=")}
        else:
            start, end = -(-shift * 8 // 6), (shift + len(raw)) * 8 // 6
            core = whole[start:end]
            forms = {core} if len(core) >= 12 else set()
        for f in forms:
            out.update({f, f.replace("+", "-").replace("/", "_")})
    return out


@dataclass(frozen=True)
class Redactor:
    """Masks the given secret values in any text or bytes, in every form the contract lists: raw,
    percent-encoded (either case, ``/`` kept or not, ``+`` for a space, double-encoded), base64
    (standard or URL-safe, padded or not), hex (either case) and JSON string escapes.

    Fixed-text forms (raw, base64, hex) are plain substring replacements; the per-character forms
    (percent and JSON escapes, in any mix) are one pattern per value, compiled on first need: every
    call with an injected value masks its own path with this redactor, and text without ``%``, ``\\``
    or ``+`` cannot hold an escaped form, so most successful calls never compile or run a pattern."""

    values: tuple[str, ...] = ()
    _variants: tuple[str, ...] = field(default=(), repr=False)

    @classmethod
    def for_values(cls, values: Iterable[str]) -> "Redactor":
        base = {v for v in values if v and len(v) >= 4}  # a 1-3 char "secret" would mask everything
        variants = set(base)
        for v in base:
            raw = v.encode()
            variants.update(_base64_forms(raw))
            variants.update({raw.hex(), raw.hex().upper()})
        # longest first so a value containing another is masked whole
        return cls(tuple(sorted(base)), tuple(sorted(variants, key=len, reverse=True)))

    @functools.cached_property
    def _patterns(self) -> tuple[re.Pattern[str], re.Pattern[bytes]] | None:
        if not self.values:
            return None
        groups = [[_char_forms(ch) for ch in v] for v in sorted(self.values, key=len, reverse=True)]
        text = "|".join("".join(t for t, _ in g) for g in groups)
        data = b"|".join(b"".join(b for _, b in g) for g in groups)
        return re.compile(text), re.compile(data)

    @functools.cached_property
    def _any(self) -> tuple[re.Pattern[str], re.Pattern[bytes]] | None:
        """One pattern matching any fixed form: text holding none (most texts) is told in one scan in C
        instead of a loop over every form (a speed trick: docs/performance.md, round 6)."""
        if not self._variants:
            return None
        text = "|".join(re.escape(v) for v in self._variants)
        return re.compile(text), re.compile(text.encode())

    def text(self, s: str) -> str:
        found = self._any
        if found is not None and found[0].search(s) is not None:
            for v in self._variants:  # the replacements, longest form first, as before
                if v in s:
                    s = s.replace(v, MASK)
        if self.values and ("%" in s or "\\" in s or "+" in s):
            patterns = self._patterns
            assert patterns is not None
            s = patterns[0].sub(MASK, s)
        return s

    def data(self, b: bytes) -> bytes:
        found = self._any
        if found is not None and found[1].search(b) is not None:
            for v in self._variants:
                enc = v.encode()
                if enc in b:
                    b = b.replace(enc, MASK.encode())
        if self.values and (b"%" in b or b"\\" in b or b"+" in b):
            patterns = self._patterns
            assert patterns is not None
            b = patterns[1].sub(MASK.encode(), b)
        return b


#: a redactor with nothing to mask (key-like query parameters are still masked by redact_url)
NO_SECRETS = Redactor()


def is_credential_header(name: str) -> bool:
    n = name.lower()
    return n in _CREDENTIAL_HEADERS or any(w in n for w in _CREDENTIAL_WORDS)


def redact_headers(headers: Iterable[tuple[str, str]], r: Redactor) -> list[list[str]]:
    return [[k, MASK if is_credential_header(k) else r.text(v)] for k, v in headers]


def redact_url(url: str, r: Redactor) -> str:
    url = mask_userinfo(r.text(url), MASK)  # a base URL's user:pw@ is a credential too
    base, sep, query = url.partition("?")
    if not sep:
        return url
    parts = []
    for seg in query.split("&"):
        k, eq, _v = seg.partition("=")
        if eq and _KEYLIKE_PARAM.search(unquote_plus(k)):
            parts.append(f"{k}={MASK}")
        else:
            parts.append(seg)
    return base + "?" + "&".join(parts)


def body_evidence(data: bytes | None, r: Redactor, limit: int) -> tuple[Any, bool]:
    """(body, truncated): text when it decodes as UTF-8, else ``{"base64": …}``; None when absent."""
    if data is None:
        return None, False
    truncated = len(data) > limit
    data = r.data(data[:limit])
    try:
        return r.text(data.decode("utf-8")), truncated
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}, truncated


def request_evidence(method: str, url: str, headers: Sequence[tuple[str, str]], body: bytes | None,
                     body_kept: bool, r: Redactor) -> dict[str, Any]:
    """``body_kept`` False: a large or chunked upload streamed through; only its query half is kept."""
    if body_kept:
        text, truncated = body_evidence(body, r, REQUEST_BODY_MAX)
    else:
        text, truncated = None, True
    return {"method": method, "url": redact_url(url, r), "headers": redact_headers(headers, r), "body": text,
            "body_truncated": truncated}


def response_evidence(status: int, headers: Sequence[tuple[str, str]], head: bytes | None, truncated: bool,
                      r: Redactor) -> dict[str, Any]:
    """A compressed head is kept decoded (an echoed key inside gzip is no less readable, and redaction
    can only see it decoded); one treg cannot decode is not kept at all."""
    applied = encodings.codings(headers)
    if applied and head:
        decoded = encodings.decode_head(head, applied, RESPONSE_HEAD_MAX)
        if decoded is None:
            return {"status": status, "headers": redact_headers(headers, r), "body": None, "body_truncated": True}
        head, complete = decoded
        truncated = truncated or not complete
    text, cut = body_evidence(head, r, RESPONSE_HEAD_MAX)
    return {"status": status, "headers": redact_headers(headers, r), "body": text,
            "body_truncated": truncated or cut}


async def peek_head(body: AsyncIterator[bytes], limit: int = RESPONSE_HEAD_MAX) -> tuple[bytes, bool, AsyncIterator[bytes]]:
    """Read up to ``limit`` bytes of a stream; return (head, more_follows, a stream that replays every
    consumed byte before the rest of the original)."""
    consumed: list[bytes] = []
    size = 0
    exhausted = False
    while size < limit:
        try:
            chunk = await body.__anext__()
        except StopAsyncIteration:
            exhausted = True
            break
        consumed.append(chunk)
        size += len(chunk)
    head = b"".join(consumed)

    async def replay() -> AsyncIterator[bytes]:
        for chunk in consumed:
            yield chunk
        if not exhausted:
            async for chunk in body:
                yield chunk

    return head[:limit], (not exhausted) or size > limit, replay()
