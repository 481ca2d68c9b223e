"""The ``Link`` header's grammar (RFC 8288 §3), read exactly or not at all.

``Link: <https://api.example.com/items?page=2>; rel="next", <…>; rel="last"`` names URLs that clients
follow by themselves (pagination code taking the next page's URL from it), with the headers they were
given, ``X-Treg-Token`` included. treg rewrites those URLs as it rewrites a ``Location``
(treg/call/redirects.py), and for that it must split the value exactly as a client would: a URI
reference may hold commas, a quoted parameter commas and semicolons. A value that is not this grammar
is None, and the caller drops it rather than guess.
"""

from __future__ import annotations

import re

from treg.http_grammar import TCHAR

#: a token (RFC 9110 §5.6.2) starting at a position
_TOKEN = re.compile(f"[{TCHAR}]+")
_OWS = " \t"


def _skip_ows(value: str, i: int) -> int:
    while i < len(value) and value[i] in _OWS:
        i += 1
    return i


def _param_end(value: str, i: int) -> int | None:
    """Where the link-param starting at ``i`` (just after its ``;``) ends, or None (not the grammar):
    ``token BWS [ "=" BWS ( token / quoted-string ) ]``."""
    i = _skip_ows(value, i)
    name = _TOKEN.match(value, i)
    if name is None:
        return None
    i = _skip_ows(value, name.end())
    if i >= len(value) or value[i] != "=":
        return i
    i = _skip_ows(value, i + 1)
    if i < len(value) and value[i] == '"':  # quoted-string, quoted-pairs kept as written
        i += 1
        while i < len(value) and value[i] != '"':
            i += 2 if value[i] == "\\" else 1
        return i + 1 if i < len(value) else None
    token = _TOKEN.match(value, i)
    return token.end() if token is not None else None


def link_values(value: str) -> list[tuple[str, str]] | None:
    """Each link-value of one ``Link`` field value as (its URI reference, its parameters as written, from
    the first ``;``), in order; None when any of it is not RFC 8288's grammar."""
    out: list[tuple[str, str]] = []
    i, n = 0, len(value)
    while True:
        while i < n and (value[i] in _OWS or value[i] == ","):  # list elements, empty ones allowed (#rule)
            i += 1
        if i >= n:
            return out
        if value[i] != "<":
            return None
        end = value.find(">", i + 1)
        if end < 0:
            return None
        target, i = value[i + 1:end], end + 1
        params_start = i
        while True:
            j = _skip_ows(value, i)
            if j >= n or value[j] != ";":
                break
            after = _param_end(value, j + 1)
            if after is None:
                return None
            i = after
        out.append((target, value[params_start:i]))
        i = _skip_ows(value, i)
        if i < n and value[i] != ",":
            return None
