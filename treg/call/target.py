"""Passthrough targets, parsed once by the rules of the connection that sends them.

``/call/http://ATTACKER#@TOOLHOST/x`` once chose TOOLHOST's tool (the host read after the ``@``) while
the connection, parsed by yarl, went to ATTACKER (``#`` starts a fragment there): the tool's credential
left for a host nobody registered. So the target is parsed here with yarl exactly as
:func:`treg.infra.upstream.parse_url` parses what is dialled, the tool is chosen by that parse's
``(scheme, host, port)`` (:func:`dial_key`), and the relay checks the URL it sends still has that key.
A target whose host different parsers could read differently is refused (400 ``ambiguous_target``)
before any tool is looked at: a ``#`` anywhere (a request target never carries a fragment, so one that
arrives was written to be dropped), and before the path a ``\\``, an ``@`` or any user-info, a ``%``,
whitespace, control or non-ASCII characters.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

from yarl import URL

from treg.errors import BadRequest
from treg.infra.upstream import dial_key

_PASSTHROUGH = re.compile(r"\A(https?):/+(.*)\Z", re.I | re.S)


#: characters that end or re-split an authority in one parser or another (WHATWG reads ``\\`` as ``/``,
#: a decoding proxy reads ``%40`` as ``@``, yarl drops tabs and newlines): never in a passthrough host
_AUTHORITY_BAD = re.compile(r"[\\@%?#\s\x00-\x1f\x7f-\U0010ffff]")
#: a registered name or an IPv4 literal as yarl hands it to the connector; IPv6 literals are checked by yarl
_HOST_OK = re.compile(r"\A[a-z0-9._-]+\Z")
_CONTROL = re.compile(r"[\x00-\x20\x7f]")


def _ambiguous(detail: str) -> BadRequest:
    return BadRequest(f"{detail}; write the target as /call/https://host[:port]/path with nothing else "
                      "before the path", code="ambiguous_target")


def parse_passthrough(scheme: str, remainder: str) -> URL:
    """The parsed upstream URL of ``/call/<scheme>://<remainder>`` (no query), or a 400."""
    if "#" in remainder:
        raise _ambiguous("the call target contains '#', which the connection would cut off as a fragment")
    if _CONTROL.search(remainder):
        raise _ambiguous("the call target contains whitespace or control characters")
    authority = remainder.partition("/")[0]
    bad = _AUTHORITY_BAD.search(authority)
    if bad is not None:
        what = "user-info (user:password@)" if bad.group() == "@" else repr(bad.group())
        raise _ambiguous(f"the host part of the call target contains {what}, which parsers read differently")
    if not authority:
        raise BadRequest("the URL after /call/ has no host; use /call/https://api.example.com/path",
                         code="invalid_target")
    try:
        url = URL(f"{scheme}://{remainder}", encoded=True)
        url.port  # noqa: B018 - yarl checks the port's range only when it is read
    except (ValueError, TypeError) as exc:
        raise BadRequest(f"the URL after /call/ is not a valid URL: {exc}", code="invalid_target") from exc
    if url.raw_user is not None or url.raw_password is not None or url.raw_fragment:
        # pragma: no cover - refused above by character; kept in case the character rules change
        raise _ambiguous("the call target carries user-info or a fragment")
    host = (url.raw_host or "").lower()
    if not host:
        raise BadRequest("the URL after /call/ has no host; use /call/https://api.example.com/path",
                         code="invalid_target")
    if ":" not in host and not _HOST_OK.fullmatch(host):
        raise BadRequest(f"the host {host!r} is not a host name or address", code="invalid_target")
    return url


def ensure_dials(url: URL, key: tuple[str, str, int | None]) -> None:
    """The URL about to be sent dials ``key``, the (scheme, host, port) its tool was chosen by. Never
    false while :func:`parse_passthrough` refuses every ambiguous target; checked so that a change there
    cannot send a tool's credential to a host other than the one it was chosen for."""
    if dial_key(url) != key:
        raise BadRequest("the call target's host reads differently once its query is added; "
                         "write it as /call/https://host/path", code="ambiguous_target")


def parse_rest(rest: str) -> tuple[str, Any, Any]:
    """("url", scheme, remainder) or ("named", name, path|None)."""
    if rest[:4].lower() == "http":  # the regex only where a URL could start (a named call skips it)
        m = _PASSTHROUGH.fullmatch(rest)
        if m:
            return "url", m.group(1).lower(), m.group(2)
    name, sep, path = rest.partition("/")
    return "named", unquote(name), (path if sep else None)
