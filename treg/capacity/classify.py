"""The classifier: one vendor answer ≥ 400 + the signature registry → a capacity signal, pure.

The pipeline calls :func:`classify` after a platform-tier answer ≥ 400 (docs/resilience.md); nothing here
touches the database or the network. ``body_head`` is the first bytes of the answer the pipeline kept
(a signature reads its error text, never a whole streamed body).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from typing import Any, Iterable, Mapping

from treg import json_text
from treg.capacity.signatures import STRIKING, Signature, SignatureRegistry
from treg.jsonpath import MISSING as _MISSING, dig

#: what a capacity-looking answer no row claims names (the `unrecorded` tripwire)
_CAPACITY_WORD = re.compile(r"\b(credits?|quota|balance)\b", re.I)
UNRECORDED_LOG = "unrecorded capacity-looking answer"
#: how much of an answer's body the pipeline keeps for :func:`classify` (a vendor's error text fits;
#: a JSON answer cut short here fails ``body_json`` conditions, never matches them by accident)
BODY_HEAD_BYTES = 8192


@dataclass(frozen=True)
class Signal:
    """A row claimed the answer. ``key`` is the lock key a strike lands on (``balance``: the provider,
    ``quota``: the endpoint); None for ``burst``/``edge_block``, which never strike."""

    kind: str
    provider: str
    endpoint: str | None
    key: str | None
    #: the vendor's stated reset (UTC), when the row says where it is stated and the answer states it
    resets_at: datetime | None
    #: the answer's Retry-After, in seconds from now (None: absent or unreadable)
    retry_after_s: float | None
    #: ``plugin#index`` of the row that claimed it (for logs)
    signature: str

    @property
    def strikes(self) -> bool:
        return self.kind in STRIKING


@dataclass(frozen=True)
class Unrecorded:
    """No row claimed a 4xx whose body names credit(s), quota or balance: the caller logs it at WARNING
    (:data:`UNRECORDED_LOG`) and puts ``capacity_signal=unrecorded`` on the event. It strikes nothing."""

    provider: str
    endpoint: str | None
    status: int
    word: str
    kind: str = "unrecorded"

    def log_args(self) -> tuple[str, str, str | None, int, str]:
        """``log.warning(*result.log_args())``: the message and its fields, no body."""
        return (UNRECORDED_LOG + " (provider %s, endpoint %s, status %s, word %r)", self.provider, self.endpoint,
                self.status, self.word)


def _headers(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, str]:
    items = headers.items() if isinstance(headers, Mapping) else headers
    out: dict[str, str] = {}
    for name, value in items:
        out.setdefault(name.lower(), value)  # the first of a repeated header, as a vendor's client reads it
    return out


def retry_after_seconds(value: str | None, now: datetime) -> float | None:
    """``Retry-After`` as seconds from ``now``: delta-seconds or an HTTP-date (None: absent or unreadable)."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    when = _http_date(value)
    return max(0.0, (when - now).total_seconds()) if when is not None else None


def _http_date(value: str) -> datetime | None:
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=timezone.utc)


def parse_reset(raw: Any, fmt: str, now: datetime) -> datetime | None:
    """A stated reset in ``fmt`` (epoch | http-date | seconds from now) as UTC; None when unreadable or in
    the past (a reset already gone says nothing about how long to wait)."""
    when: datetime | None = None
    try:
        if fmt == "epoch":
            n = float(raw)
            if n > 1e11:  # milliseconds: some vendors state the epoch in ms
                n /= 1000
            when = datetime.fromtimestamp(n, timezone.utc)
        elif fmt == "seconds":
            n = float(raw)
            when = now + timedelta(seconds=n) if n >= 0 else None
        elif fmt == "http-date" and isinstance(raw, str):
            when = _http_date(raw)
    except (TypeError, ValueError, OverflowError, OSError):
        return None
    if when is None or when <= now:
        return None
    return when.astimezone(timezone.utc)


class _Answer:
    """The answer's parts, decoded lazily: most rows never need the JSON."""

    def __init__(self, status: int, headers: dict[str, str], body_head: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body_head = body_head
        self._text: str | None = None
        self._json: Any = _MISSING
        self._json_done = False

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = self.body_head.decode("utf-8", errors="replace").lower()
        return self._text

    @property
    def json(self) -> Any:
        if not self._json_done:
            self._json_done = True
            try:
                self._json = json_text.parse(self.body_head)
            except ValueError:  # not JSON, or nested too deeply (treg/json_text.py)
                self._json = _MISSING
        return self._json


def _matches(sig: Signature, a: _Answer, retry_after: float | None) -> bool:
    if sig.status and a.status not in sig.status:
        return False
    if sig.header_name is not None:
        value = a.headers.get(sig.header_name)
        if value is None or (sig.header_equals is not None and value.strip().lower() != sig.header_equals.lower()):
            return False
    if sig.retry_after_max_s is not None and (retry_after is None or retry_after > sig.retry_after_max_s):
        return False
    if sig.body_contains is not None and sig.body_contains not in a.text:
        return False
    if sig.body_json_path is not None:
        value = dig(a.json, sig.body_json_path, _MISSING) if a.json is not _MISSING else _MISSING
        if value is _MISSING:
            return False
        if sig.body_json_pattern is not None:
            if isinstance(value, (dict, list)) or not sig.body_json_pattern.search(str(value)):
                return False
        elif value != sig.body_json_equals:
            return False
    return True


def _reset(sig: Signature, a: _Answer, now: datetime) -> datetime | None:
    if sig.resets_format is None:
        return None
    if sig.resets_header is not None:
        raw: Any = a.headers.get(sig.resets_header)
    else:
        raw = dig(a.json, sig.resets_json_path, _MISSING) if a.json is not _MISSING else _MISSING  # type: ignore[arg-type]
    if raw is None or raw is _MISSING:
        return None
    return parse_reset(raw, sig.resets_format, now)


def classify(registry: SignatureRegistry, provider: str, endpoint: str | None, status: int,
             headers: Mapping[str, str] | Iterable[tuple[str, str]], body_head: bytes,
             now: datetime | None = None) -> Signal | Unrecorded | None:
    """The first row (plugins' own before the built-in generic ones) whose every condition holds, as a
    :class:`Signal`; else :class:`Unrecorded` for a capacity-looking 4xx; else None."""
    if status < 400:
        return None
    now = now or datetime.now(timezone.utc)
    a = _Answer(status, _headers(headers), body_head or b"")
    retry_after = retry_after_seconds(a.headers.get("retry-after"), now)
    for sig in registry.for_provider(provider):
        if _matches(sig, a, retry_after):
            key = provider if sig.kind == "balance" else endpoint if sig.kind == "quota" else None
            if sig.kind == "quota" and endpoint is None:
                key = provider  # a quota answer off the catalog (no endpoint) can only lock the provider
            return Signal(kind=sig.kind, provider=provider, endpoint=endpoint, key=key,
                          resets_at=_reset(sig, a, now), retry_after_s=retry_after, signature=sig.label)
    if 400 <= status < 500:
        word = _CAPACITY_WORD.search(a.text)
        if word is not None:
            return Unrecorded(provider=provider, endpoint=endpoint, status=status, word=word.group(1).lower())
    return None
