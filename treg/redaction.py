"""What is masked in anything treg keeps or shows: injected credential values in every encoding they
take on the wire (:class:`Redactor`), and the user-info of a URL (:func:`mask_userinfo`), both replaced
by :data:`MASK`.

Plain functions and values, no I/O, below every layer that records or shows a URL or a call: the
call pipeline's evidence and audit row (``treg/call/evidence.py``, ``treg/call/record.py``), a tool's
masked base URL (``treg/tools.py``, ``treg/tool_urls.py``) and the access log (``treg/web/access_log.py``).
"""

from __future__ import annotations

import base64
import functools
import re
from dataclasses import dataclass, field
from typing import Iterable

from treg.memo import BoundedMemo

MASK = "[REDACTED]"


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


#: a byte that can begin an escaped form (``%``, ``\\``, ``+``), looked for in one scan. Not ``b"%" in data``:
#: ``bytes.__contains__`` first tries its argument as an integer, and on a bytes argument that fails by
#: formatting and clearing a TypeError, ~2 k instructions each, three per answer checked (a speed trick:
#: docs/performance.md, round 14)
_ESCAPES = re.compile(rb"[%+\\]")


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
                if b.find(enc) != -1:  # not ``enc in b``: see _ESCAPES
                    b = b.replace(enc, MASK.encode())
        if self.values and _ESCAPES.search(b) is not None:
            patterns = self._patterns
            assert patterns is not None
            b = patterns[1].sub(MASK.encode(), b)
        return b


#: a redactor with nothing to mask (key-like query parameters are still masked by redact_url)
NO_SECRETS = Redactor()


_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*:/*)[^/]*@")


def mask_userinfo(text: str, mask: str) -> str:
    """A URL (or a passthrough call target) with anything before the last ``@`` of its authority masked:
    ``https://user:pw@host/x`` → ``https://[REDACTED]@host/x``. The authority is taken as widely as any
    parser could (up to the first ``/``), so a credential is masked however the URL was split."""
    if "@" not in text:
        return text
    return _USERINFO.sub(lambda m: f"{m.group(1)}{mask}@", text, count=1)


class RedactorMemo:
    """The redactors of values injected together, by those values (bounded): building one's encoded
    variants costs more than a whole successful relay's bookkeeping, so a process keeps them as long as
    the values themselves (an org's cached secrets, ``OrgSecrets`` in ``treg/org_data.py``; the platform
    settings' values, ``Services.platform_redactors``). Never logged: no repr of its contents."""

    __slots__ = ("_redactors",)

    def __init__(self) -> None:
        #: the values injected together → their redactor; bounded: tools x platform keys of one org
        self._redactors: BoundedMemo[tuple[str, ...], Redactor] = BoundedMemo(64)

    def redactor(self, values: tuple[str, ...]) -> Redactor:
        found = self._redactors.get(values)
        return found if found is not None else self._redactors.put(values, Redactor.for_values(values))
