"""Filling an endpoint's ``{slot}`` path placeholders from query values (catalog.md "Path parameters").

The rule, and why:

* the raw query value is decoded once (form rules: ``+`` is a space, ``%HH`` a byte);
* the result is encoded for one path segment: unreserved characters stay, ``@`` stays literal (a legal
  path-segment character; Tomba's email verifier rejects ``%40``), a *valid* ``%HH`` escape is kept as is
  (an already-encoded Search Console property ``sc-domain%3Aexample.com`` must not become ``%253A``),
  and everything else, notably ``/``, ``?``, ``#`` and a stray ``%``, is percent-encoded, so a value can
  never add a path segment, start a query or a fragment;
* a whole segment of ``.`` or ``..`` is encoded (``%2E``) so no client or server normalizes it into a
  walk up the provider's path.
"""

from __future__ import annotations

import string
from typing import Mapping
from urllib.parse import unquote_to_bytes

from treg.catalog.model import SLOT

_UNRESERVED = frozenset((string.ascii_letters + string.digits + "-._~@").encode())
_HEX = frozenset(b"0123456789abcdefABCDEF")


def decode_query_value(raw: str | None) -> bytes:
    """A raw (still percent-encoded) query value decoded once, as form data: ``+`` → space."""
    if raw is None:
        return b""
    return unquote_to_bytes(raw.replace("+", " "))


def encode_segment(value: bytes | str) -> str:
    """Encode a decoded value for a path placeholder (see the module docstring)."""
    data = value.encode("utf-8") if isinstance(value, str) else value
    out: list[str] = []
    i, n = 0, len(data)
    while i < n:
        b = data[i]
        if b == 0x25 and i + 2 < n and data[i + 1] in _HEX and data[i + 2] in _HEX:  # a valid %HH: kept
            out.append(data[i:i + 3].decode("ascii"))
            i += 3
            continue
        out.append(chr(b) if b in _UNRESERVED else f"%{b:02X}")
        i += 1
    encoded = "".join(out)
    if encoded in (".", ".."):
        encoded = encoded.replace(".", "%2E")
    return encoded


def fill_path(template: str, values: Mapping[str, str]) -> str:
    """Substitute every ``{slot}`` with its already-encoded value (every slot must be in ``values``)."""
    return SLOT.sub(lambda m: values[m.group(1)], template)
