"""Deny-rule matching (pure): host/path/method × member × project, each NULL-means-any, ANDed.

A rule must never be easier to dodge than to obey, so paths and methods are compared the way the
upstream will understand them, not the way they were spelt (api.md, "Deny rules match what the
upstream will understand"):

* the path is canonicalised: unreserved characters percent-decoded (``%41`` → ``a``, ``%2e`` → ``.``),
  ``;params`` cut from every segment, repeated ``/`` collapsed, dot segments removed, case ignored.
  ``%2F`` is kept encoded in the canonical form, but some upstreams decode it (and every other escape,
  and read ``\\`` as ``/``) before routing, so a second, fully decoded form is canonicalised too; and
  since servers differ on whether ``//`` is merged before or after ``..`` is applied, both orders are
  taken. A rule path is canonicalised the same way, and a rule matches when any form of it matches any
  form of the request's path.
* the path match is anchored at a segment boundary: ``/v1/charges`` matches ``/v1/charges`` and
  ``/v1/charges/ch_1`` but never ``/v1/chargesX``; a trailing ``/`` on either side changes nothing.
  Lenient decoders are assumed too: a path decoded twice (``%252e`` → ``.``), overlong UTF-8 for ASCII
  (``%c0%ae`` → ``.``) and trailing dots and spaces cut from a segment, written or encoded
  (``charges.``, ``charges%2e``, ``charges%2E%2e``, ``charges%20``, ``charges.%20``, as IIS and Windows
  read them) give forms of their own.
* the method is compared with the request's and with every method-override header's value
  (``X-HTTP-Method-Override``, ``X-HTTP-Method``, ``X-Method-Override``), ``_method`` query
  parameter and ``_method`` field of the body (Rails, Laravel, Symfony: :mod:`treg.domain.body_methods`
  reads a form, multipart or JSON body), case-insensitively; ``HEAD`` runs an upstream's ``GET``
  handler, so a rule on ``GET`` also stops ``HEAD``.
* hosts compare case-insensitively and without a trailing dot (``API.example.com.``); a rule host
  without a port matches that host on any port, ``host:port`` only that port (the scheme's default
  port when the URL names none).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence
from urllib.parse import unquote

#: headers by which frameworks let a request claim another method than its request line's
METHOD_OVERRIDE_HEADERS = frozenset(("x-http-method-override", "x-http-method", "x-method-override"))

#: the query parameter by which frameworks let a form claim another method
METHOD_OVERRIDE_PARAM = "_method"

_DEFAULT_PORTS = {"http": "80", "https": "443"}
_ESCAPE = re.compile(r"%([0-9A-Fa-f]{2})")
#: an overlong two-byte UTF-8 spelling of an ASCII character (``%c0%ae`` is ``.``), which strict decoders
#: refuse and lenient ones read as the character
_OVERLONG = re.compile(r"%[cC]([01])%([89abAB][0-9A-Fa-f])")
_UNRESERVED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def _decode_unreserved(match: re.Match[str]) -> str:
    char = chr(int(match.group(1), 16))
    return char if char in _UNRESERVED else match.group(0)


def _overlong(match: re.Match[str]) -> str:
    return "%{:02X}".format(((0xC0 | int(match.group(1))) & 0x1F) << 6 | (int(match.group(2), 16) & 0x3F))


#: what lenient servers cut from the end of a path segment (IIS and Windows file names: ``admin.``,
#: ``admin%20`` and ``admin.%20`` all name ``admin``)
_TRAILING = ". "


def _segments(path: str, *, merge_first: bool, strip_dots: bool = False) -> str:
    """``path`` (already decoded as wanted) with params cut, ``//`` collapsed and dot segments removed,
    lower case, without a trailing ``/`` (the match is segment-anchored, so it would change nothing).
    ``strip_dots``: a segment's trailing dots and spaces cut too (``.. `` read as the dot segment it
    becomes once its space is cut)."""
    segs = [seg.partition(";")[0] for seg in path.split("/")]
    if strip_dots:
        segs = [_strip_trailing(seg) for seg in segs]
    out: list[str] = []
    for seg in segs:
        if seg == "":
            if not merge_first and out:
                out.append(seg)  # RFC 3986 §5.2.4 keeps it: a following ".." removes it, not its parent
        elif seg == "..":
            if out:
                out.pop()
        elif seg != ".":
            out.append(seg)
    return "/" + "/".join(seg for seg in out if seg).lower()


def _strip_trailing(seg: str) -> str:
    """A segment as a server that cuts trailing dots and spaces reads it; a segment of dots alone stays
    what it is (``.``, ``..``, ``...``), spaces after it cut."""
    spaced = seg.rstrip(" ")
    if spaced and spaced.strip(".") == "":
        return spaced
    return seg.rstrip(_TRAILING) or seg


def path_forms(path: str) -> tuple[str, ...]:
    """Every canonical form an upstream may resolve ``path`` to (see the module docstring): the path
    with unreserved escapes decoded (``%2F`` kept) and fully decoded (``\\`` read as ``/``), and, where
    escapes are left, as lenient decoders read it (overlong UTF-8, decoded twice); each with ``//``
    merged before or after ``..`` is applied, and each also with trailing dots and spaces cut from its
    segments."""
    kept = _ESCAPE.sub(_decode_unreserved, path)
    decoded = unquote(path, errors="surrogateescape").replace("\\", "/")
    texts = [kept, decoded]
    if "%" in path:  # only then can a lenient reading differ
        once = unquote(_OVERLONG.sub(_overlong, path), errors="surrogateescape").replace("\\", "/")
        twice = unquote(_OVERLONG.sub(_overlong, once), errors="surrogateescape").replace("\\", "/")
        texts += [once, twice]
    forms = [_segments(text, merge_first=merge, strip_dots=strip) for text in dict.fromkeys(texts)
             for strip in (False, True) for merge in (True, False)]
    return tuple(dict.fromkeys(forms))


def _under(base: str, path: str) -> bool:
    """``path`` is ``base`` or below it, on a segment boundary (both canonical)."""
    return base == "/" or path == base or path.startswith(base + "/")


def path_matches(rule_path: str | None, path: str) -> bool:
    if not rule_path:
        return True
    return any(_under(base, form) for base in path_forms(rule_path) for form in path_forms(path))


def split_host(netloc: str) -> tuple[str, str | None]:
    """(hostname, port or None) of ``host`` / ``host:port`` / ``[v6]:port``: lower case, without
    user-info or a trailing dot, the port without leading zeros."""
    netloc = netloc.rpartition("@")[2].lower()
    if netloc.startswith("["):
        end = netloc.find("]")
        host, rest = netloc[:end + 1], netloc[end + 1:]
        port = rest[1:] if rest.startswith(":") else ""
    elif netloc.count(":") == 1:
        host, _, port = netloc.partition(":")
    else:
        host, port = netloc, ""
    if port.isdigit():
        port = str(int(port))
    return host.rstrip("."), port or None


def host_matches(rule_host: str, host: str, scheme: str) -> bool:
    rh, rp = split_host(rule_host)
    h, p = split_host(host)
    if rh != h:
        return False
    if rp is None:
        return True
    return rp == (p or _DEFAULT_PORTS.get(scheme.lower()))


def override_name(name: str) -> bool:
    """Whether a decoded parameter name is ``_method`` as a framework reads it: case ignored, and, as PHP
    names form fields (so Symfony and Laravel see them), a leading run of spaces dropped and ``.``, `` ``
    or ``[`` read as ``_`` (``.method`` and `` method`` are ``$_POST["_method"]``)."""
    name = name.lstrip(" ").lower()
    return name == METHOD_OVERRIDE_PARAM or name.translate(_PHP_NAME) == METHOD_OVERRIDE_PARAM


_PHP_NAME = str.maketrans({" ": "_", ".": "_", "[": "_"})


def effective_methods(method: str, headers: Iterable[tuple[str, str]] = (),
                      query: Iterable[tuple[str, str | None]] = (), extra: Iterable[str] = ()) -> frozenset[str]:
    """The methods an upstream may act on: the request line's, every override header's (a value may
    list several, comma-separated), every ``_method`` query parameter's (raw pairs, decoded here) and
    ``extra`` (a body's ``_method`` fields, :mod:`treg.domain.body_methods`), upper case; ``HEAD`` adds
    ``GET``."""
    values = [method] + [v for k, v in headers if k.lower() in METHOD_OVERRIDE_HEADERS]
    values += [unquote(v.replace("+", " ")) for k, v in query
               if v is not None and override_name(unquote(k.replace("+", " ")))]
    values += extra
    out = {m.strip().upper() for v in values for m in v.split(",")} - {""}
    if "HEAD" in out:
        out.add("GET")
    return frozenset(out)


def may_act_on(wanted: str, method: str, headers: Mapping[str, str],
               query: Sequence[tuple[str, str | None]] = ()) -> bool:
    """Whether an upstream may act on ``wanted`` (upper case) for this request: the request line's method,
    or one an override names as :func:`effective_methods` reads them. ``headers``: case-insensitive (a
    ``CIMultiDict``). Cheap first, as a relay asks it of every call carrying a credential: with no
    override header, and no query name holding ``ethod`` or ``%`` (every spelling :func:`override_name`
    reads as ``_method`` holds one), only the request line counts."""
    if method.upper() == wanted:
        return True
    # ``map`` over the bound ``__contains__``: three look-ups without a generator's frame per call
    if not (any(map(headers.__contains__, METHOD_OVERRIDE_HEADERS))
            or (query and any("%" in k or "ethod" in k.lower() for k, _ in query))):
        return False
    return wanted in effective_methods(method, headers.items(), query)


@dataclass(frozen=True)
class DenyRule:
    id: str
    host: str
    path: str | None = None
    method: str | None = None
    member_id: str | None = None
    project_id: str | None = None
    reason: str | None = None
    #: the rule path's canonical forms, computed once (rules are cached per org, matched per call)
    path_bases: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "path_bases", path_forms(self.path) if self.path else ())


def first_match(rules: Iterable[DenyRule], *, scheme: str, host: str, path: str, method: str,
                member_id: str, project_id: str | None,
                headers: Iterable[tuple[str, str]] = (),
                query: Iterable[tuple[str, str | None]] = (),
                body_methods: Iterable[str] = ()) -> DenyRule | None:
    """The first rule that stops this call. ``path`` is the upstream URL's raw path (encoding kept);
    ``headers`` are the caller's, ``query`` the raw pairs sent and ``body_methods`` the body's
    ``_method`` fields, for the method overrides."""
    methods = effective_methods(method, headers, query, body_methods)
    return _first(rules, methods, scheme=scheme, host=host, path=path, member_id=member_id,
                  project_id=project_id, other_methods=False)


def rule_needing_the_body(rules: Iterable[DenyRule], *, scheme: str, host: str, path: str, method: str,
                          member_id: str, project_id: str | None,
                          headers: Iterable[tuple[str, str]] = (),
                          query: Iterable[tuple[str, str | None]] = ()) -> DenyRule | None:
    """The first rule :func:`first_match` let through only for its method: it holds on every other
    axis, so a ``_method`` field in the body could still be what the upstream acts on."""
    methods = effective_methods(method, headers, query)
    return _first(rules, methods, scheme=scheme, host=host, path=path, member_id=member_id,
                  project_id=project_id, other_methods=True)


def _first(rules: Iterable[DenyRule], methods: frozenset[str], *, scheme: str, host: str, path: str,
           member_id: str, project_id: str | None, other_methods: bool) -> DenyRule | None:
    """The first rule holding on every axis (``other_methods``: on every axis but the method, for a
    rule whose method is none of ``methods``)."""
    forms: tuple[str, ...] | None = None  # computed only once a rule gets as far as the path
    for rule in rules:
        if rule.member_id is not None and rule.member_id != member_id:
            continue
        if rule.project_id is not None and rule.project_id != project_id:
            continue
        if other_methods:
            if rule.method is None or rule.method.upper() in methods:
                continue
        elif rule.method is not None and rule.method.upper() not in methods:
            continue
        if not host_matches(rule.host, host, scheme):
            continue
        if rule.path_bases:
            if forms is None:
                forms = path_forms(path)
            if not any(_under(base, form) for base in rule.path_bases for form in forms):
                continue
        return rule
    return None
