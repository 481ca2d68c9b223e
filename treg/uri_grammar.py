"""A strict URI grammar for the one place treg must read a URL exactly as every HTTP client would:
an upstream's ``Location`` / ``Content-Location`` (treg/call/redirects.py).

It is an allow-list. A value is accepted only when it is an RFC 3986 absolute ``http``/``https`` URL
or a relative reference that leaves no room for two readings, and everything else is refused (None).
Each clause below closes a spelling that real clients were seen to read as a URL on another host
while Python's ``urllib.parse`` read it differently (issue 20):

* only printable ASCII of RFC 3986's character set, and ``%`` only before two hex digits: no
  whitespace or control character (urllib drops a tab, so ``/\\t/evil`` becomes ``//evil``), no
  backslash (browsers read ``\\`` as ``/``), no non-ASCII (IDNA is read differently by each library);
* ``[`` and ``]`` only around a valid IPv6 literal host (``http://x[@evil/`` and ``http://a]b@evil/``:
  httpx and curl dial ``evil``, urllib refuses them);
* a scheme is followed by exactly two slashes and a non-empty authority (``http:////evil``: requests
  and urllib dial ``evil``; ``http:///evil`` and ``http:/evil``: curl dials ``evil``); any scheme but
  ``http``/``https`` is refused (``ftp://evil``: curl and urllib follow it);
* no user-info (``@`` in the authority): a credential has no business in a redirect, and where the
  user-info ends is exactly what parsers disagree about;
* a host name is letters, digits, ``-``, ``_`` and ``.`` (no percent-encoding, no sub-delims), with no
  empty label; a host that ends in a numeric label must be a canonical dotted IPv4 address (``127.1``
  and ``0x7f.1`` are 127.0.0.1 to curl and browsers, a DNS name to Python);
* a port is 1–65535 written without leading zeros; an empty port (``host:``) is refused.

Pure functions, no I/O, importable from every layer.
"""

from __future__ import annotations

import ipaddress
import re
from typing import NamedTuple
from urllib.parse import urljoin

#: RFC 3986 ``unreserved`` / ``sub-delims`` / ``:`` ``@`` ``/`` ``?`` ``#`` and ``%XX``; no ``[ ]``,
#: which only an IPv6 host may hold (checked separately)
_CHARS = re.compile(r"\A(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/?#]|%[0-9A-Fa-f]{2})*\Z")
#: RFC 3986 appendix B, the authority taken only after exactly ``//``
_SPLIT = re.compile(r"\A(?:([^:/?#]+):)?(?://([^/?#]*))?([^?#]*)(?:\?([^#]*))?(?:#(.*))?\Z", re.S)
_SCHEME = re.compile(r"\A[A-Za-z][A-Za-z0-9+.\-]*\Z")
_LABEL = re.compile(r"\A[A-Za-z0-9_\-]{1,63}\Z")
#: a label WHATWG's host parser reads as a number (so the whole host as an IPv4 address)
_NUMERIC = re.compile(r"\A(?:0[xX][0-9A-Fa-f]*|[0-9]+)\Z")
_PORT = re.compile(r"\A[1-9][0-9]{0,4}\Z")

WEB_SCHEMES = ("http", "https")


class Authority(NamedTuple):
    host: str  # as written (IPv6 with its brackets)
    port: int | None


def authority(text: str) -> Authority | None:
    """``host[:port]`` read strictly (see the module's rules), or None."""
    if not text or "@" in text:
        return None
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            return None
        literal, rest = text[1:end], text[end + 1:]
        if "%" in literal:  # a zone id: its spelling (%25 or %) differs from client to client
            return None
        try:
            ipaddress.IPv6Address(literal)
        except ValueError:
            return None  # IPvFuture too
        host = text[:end + 1]
    else:
        host, sep, port_text = text.partition(":")
        rest = sep + port_text
        if not _host_name(host):
            return None
    if not rest:
        return Authority(host, None)
    if rest[0] != ":" or not _PORT.match(rest[1:]) or int(rest[1:]) > 65535:
        return None
    return Authority(host, int(rest[1:]))


def _host_name(host: str) -> bool:
    labels = host[:-1].split(".") if host.endswith(".") else host.split(".")
    if len(host) > 254 or not all(_LABEL.match(label) for label in labels):
        return False
    if _NUMERIC.match(labels[-1]):
        # read as an IPv4 address by curl and WHATWG parsers: only its one canonical spelling
        try:
            return str(ipaddress.IPv4Address(host)) == host
        except ValueError:
            return False
    return True


class Reference(NamedTuple):
    """A URI reference that passed :func:`reference`."""

    scheme: str | None  # lower-cased; None: relative
    authority: Authority | None  # None: no authority (a path, query or fragment reference)


def reference(value: str) -> Reference | None:
    """``value`` as an ``http``/``https`` URL or a relative reference every client reads alike, or None."""
    if not _CHARS.match(value.replace("[", "").replace("]", "")):
        return None
    m = _SPLIT.match(value)
    if m is None:
        return None
    scheme, auth_text, path, query, fragment = m.groups()
    for part in (path, query, fragment):
        if part and ("[" in part or "]" in part):
            return None
    if scheme is not None:
        if not _SCHEME.match(scheme) or scheme.lower() not in WEB_SCHEMES:
            return None
        if auth_text is None:  # http:/evil, http:evil: read as http://evil by curl
            return None
    if auth_text is None:  # a path, query or fragment reference (_SPLIT takes any // as an authority)
        return Reference(None, None)
    auth = authority(auth_text)  # empty (http:///evil, ////evil) or malformed: refused
    if auth is None:
        return None
    return Reference(scheme.lower() if scheme else None, auth)


def resolve(base: str, value: str) -> str | None:
    """``value`` resolved against ``base`` (an absolute http(s) URL treg dialled) when it passes
    :func:`reference`, else None. The result's scheme and authority are checked again: they are what a
    client following it would dial."""
    ref = reference(value)
    if ref is None:
        return None
    try:
        out = urljoin(base, value)
    except ValueError:  # a base urllib cannot split (treg dialled it, so not expected)
        return None
    m = _SPLIT.match(out)
    if m is None or m.group(1) is None or m.group(1).lower() not in WEB_SCHEMES or m.group(2) is None:
        return None
    if authority(m.group(2)) is None:
        return None
    # urljoin returns an absolute value as given: its scheme lower-cased here (HTTP://… → http://…)
    return m.group(1).lower() + out[len(m.group(1)):]
