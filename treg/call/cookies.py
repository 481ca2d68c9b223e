"""An upstream's cookies scoped to the tool that set them (``Set-Cookie`` in a relayed answer).

Every upstream answers on treg's origin, so a client's cookie jar (a browser's, ``requests.Session``,
``httpx.Client`` and so the OpenAI and Anthropic SDKs) files each upstream's cookies under treg's host. A
cookie with ``Path=/`` (a load balancer's, a session's: the usual spelling) then went back with the
caller's calls of *every* tool, and treg relays the ``Cookie`` header: vendor A's session cookie reached
vendor B. A ``Domain`` attribute could only widen it further, to treg's parent domain and every site
under it (cookie tossing).

So each relayed ``Set-Cookie`` loses its ``Domain`` (the cookie is treg's host's alone) and its ``Path``
becomes the root of what was called: ``/call/<tool>`` (a passthrough call: ``/call/<scheme>://<host>``),
``/catalog/call/<endpoint>``, ``/table/<endpoint>``, ``/redirect/<opaque>``, after ``TREG_PUBLIC_URL``'s
path prefix. A client sends it back on calls of that tool only, all of its paths (the vendor's own
``Path`` inside its API is not kept: it is a path of the vendor's, not of treg's). Everything else of the
cookie (name, value, ``Expires``, ``Max-Age``, ``Secure``, ``HttpOnly``, ``SameSite``) is relayed as it came.
A ``__Host-`` cookie (which must have ``Path=/``) is refused by a browser after this, as it should be: on
treg's origin it would be sent to every tool.
"""

from __future__ import annotations

from typing import Iterable

from treg.call.target import parse_rest
from treg.call.types import SURFACE_PREFIXES, CallInput

#: the cookie attributes replaced here (RFC 6265 5.2: names compared case-insensitively, blanks trimmed)
_REPLACED = frozenset({"domain", "path"})


def root_path(inp: CallInput, prefix: str) -> str:
    """The treg path of everything the call's tool (or endpoint, or redirect) answers under, as the caller
    spelled it (cookie paths match the request's path byte for byte)."""
    rest = inp.rest
    if inp.surface == "call" and parse_rest(rest)[0] == "url":
        scheme, _, after = rest.partition("://")
        return f"{prefix}/call/{scheme}://{after.partition('/')[0]}"
    return prefix + SURFACE_PREFIXES.get(inp.surface, "/call/") + rest.partition("/")[0]


def _one_cookie(pair: str) -> bool:
    """Whether every client reads ``pair`` (a ``Set-Cookie``'s text before its first ``;``) as one cookie.
    Python's ``http.cookies`` (aiohttp's client jar) reads ``a=1 b=2`` or ``a=1, b=2`` as two, and gives the
    first no ``Path`` at all: the client's default path, which for a call of ``/call/<tool>`` itself is
    ``/call``, every tool. A blank or a comma has no place in a cookie's name or unquoted value (RFC 6265
    4.1.1)."""
    name, _, value = pair.strip().partition("=")
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"' and '"' not in value[1:-1]:
        value = ""  # a quoted value is one value, whatever it holds
    return not any(c in name or c in value for c in " \t,")


def scoped(value: str, path: str) -> str | None:
    """One ``Set-Cookie`` value without its ``Domain`` and with ``Path=path``; None when a client could read
    it as more than one cookie (:func:`_one_cookie`): it is not relayed."""
    pair, *attributes = value.split(";")
    if not _one_cookie(pair):
        return None
    kept = [a for a in attributes if a.partition("=")[0].strip().lower() not in _REPLACED]
    return ";".join([pair, *kept, f" Path={path}"])


def _usable(path: str) -> bool:
    # a cookie's Path is any text up to the next ';' (RFC 6265 5.2): one such character, a blank or a
    # control character would end it early, and the cookie would cover more than the tool
    return path.isascii() and path.isprintable() and ";" not in path and " " not in path


def scope_cookies(inp: CallInput, prefix: str, headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """``headers`` with every ``Set-Cookie`` scoped to the call's root (:func:`root_path`); one that cannot be
    scoped (a root that cannot be a cookie's path, a value some client reads as two cookies) is left out,
    never relayed unscoped."""
    path = root_path(inp, prefix)
    out = []
    for k, v in headers:
        if k.lower() == "set-cookie":
            v = scoped(v, path) if _usable(path) else None  # type: ignore[assignment]
            if v is None:
                continue
        out.append((k, v))
    return out
