"""Redirects stay inside treg (api.md, "Details that are fixed": Redirects).

An HTTP client that follows a relayed redirect resends every header it was given, ``X-Treg-Token``
included (requests, httpx and so the OpenAI and Anthropic SDKs strip only ``Authorization`` on a host
change). So no ``Location`` or ``Content-Location`` leaves treg pointing at an upstream:

* into the same tool's base URL → the equivalent treg URL, ``/call/<tool>/…`` (or the passthrough
  form ``/call/https://host/…`` when the caller used it; a hub call's ``/call/<ref>/…``, the one name
  its caller can call the publisher's tool by): a normal call, credential injected;
* anywhere else (a relative value resolved against the upstream URL first) → ``/redirect/<opaque>``,
  which relays to that URL with no credential at all (:func:`redirect_target`).

A ``Link`` header's URLs (``<…?page=2>; rel="next"``: pagination that clients follow by themselves, their
headers and so ``X-Treg-Token`` resent) are rewritten the same way,
each link's parameters kept as they came (:mod:`treg.link_grammar`); a link whose URL treg cannot read
is left out, a value that is not the header's grammar dropped whole.

Both are path-absolute (``/call/…``, ``/redirect/…``, after the path prefix of ``TREG_PUBLIC_URL``
behind a reverse proxy): every client resolves that against the URL it just asked, i.e. treg's own
origin, whatever host name or port the caller reached treg by.

A value is rewritten only when treg reads it exactly as every client would (:mod:`treg.uri_grammar`,
an allow-list); any other value (another scheme, a user-info part, a spelling such as
``http://x[@evil/`` or ``http:////evil`` that httpx, curl, requests or urllib read as a URL on another
host) is dropped: the answer goes out without that header, the upstream's value kept (masked) in
``X-Treg-Upstream-Location``, which no client follows (not for a hub call of another org's tool: that
value would name the publisher's API). Nothing the upstream wrote is ever relayed as a ``Location`` as
it was.

The opaque value is self-contained, so any treg process holding the master key serves it: AES-256-GCM
under a key derived from the master key for this purpose only (HKDF-SHA256, info ``treg-redirect``),
sealing org, member, target URL, parent call id and expiry. It is unreadable (the URL may carry a token
in its query) and unforgeable; a value that does not open, has expired, or was issued to another
member is one and the same 404.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import time
from dataclasses import replace
from typing import Any, Callable, Iterable
from urllib.parse import quote, urlsplit

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from treg import link_grammar, uri_grammar
from treg.call.target import parse_rest
from treg.call.types import CallInput, ResolvedTarget
from treg.context import Services
from treg.errors import NotFound
from treg.frozen import frozen_value
from treg.identity import Identity
from treg.infra import form_tokens
from treg.org_data import ToolRef
from treg.origin import path_prefix
from treg.query import split_query

#: relayed header → the treg header that keeps the upstream's own value (upstream X-Treg-* never pass)
KEPT_AS = {"location": "X-Treg-Upstream-Location", "content-location": "X-Treg-Upstream-Content-Location",
           "link": "X-Treg-Upstream-Link"}


def names_urls(index: Any) -> bool:
    """Whether an answer's headers (``index``: case-insensitive) hold a URL a client may follow."""
    return "location" in index or "content-location" in index or "link" in index

#: a caller's headers a /redirect hop does not forward. The client sent them to treg's origin; facing
#: the real cross-host hop it would have dropped its Authorization (requests, httpx, curl do), and its
#: cookies for treg's origin were set by other upstreams' answers, not by the redirect's target
CALLER_CREDENTIALS = frozenset({"authorization", "cookie"})

_VERSION = b"\x01"
_NONCE_LEN = 12
_AAD = b"treg-redirect v1"
_INFO = b"treg-redirect"


@frozen_value
class RedirectGrant:
    """What a ``/redirect/<opaque>`` value carries."""

    org_id: str
    member_id: str
    url: str  # absolute http(s) URL, query kept, no fragment
    parent_call_id: str
    expires_at: int  # unix seconds
    #: the project of the tool whose answer redirected: its project-scoped deny rules follow the hop
    project_id: str | None = None


def _cipher(master: bytes) -> AESGCM:
    # a key of its own (derived once per process, treg/infra/form_tokens.py): a redirect value never opens
    # as a secret blob, nor a secret blob as one
    return AESGCM(form_tokens.purpose_key(master, _INFO))


def seal(svc: Services, grant: RedirectGrant) -> str:
    plain = json.dumps([grant.org_id, grant.member_id, grant.url, grant.parent_call_id, grant.expires_at,
                        grant.project_id], separators=(",", ":")).encode()
    nonce = os.urandom(_NONCE_LEN)
    blob = _VERSION + nonce + _cipher(svc.box.current).encrypt(nonce, plain, _AAD)
    return base64.urlsafe_b64encode(blob).rstrip(b"=").decode()


def open_grant(svc: Services, opaque: str) -> RedirectGrant | None:
    """The grant sealed in ``opaque``, or None when it is not one of treg's (malformed or altered).
    The keys tried are the current master key's and the previous ones': a rotation does not void the
    links of the last few minutes."""
    try:
        blob = base64.urlsafe_b64decode(opaque + "=" * (-len(opaque) % 4))
    except (binascii.Error, ValueError):
        return None
    if blob[:1] != _VERSION or len(blob) < 1 + _NONCE_LEN + 16:
        return None
    nonce, sealed = blob[1:1 + _NONCE_LEN], blob[1 + _NONCE_LEN:]
    for master in (svc.box.current, *svc.box.previous):
        try:
            plain = _cipher(master).decrypt(nonce, sealed, _AAD)
        except InvalidTag:
            continue
        # five fields: a link sealed before grants carried the project (it has none)
        return RedirectGrant(*json.loads(plain))
    return None


def _unknown() -> NotFound:
    # one answer for altered, expired and someone else's: a value's existence is not confirmed
    return NotFound("this redirect link is unknown, has expired, or was issued to another member; "
                    "repeat the call that answered with it", code="redirect_not_found", refused_by="redirect")


def redirect_target(svc: Services, ident: Identity, inp: CallInput) -> tuple[CallInput, ResolvedTarget]:
    """Resolve stage of ``/redirect/<opaque>``: the sealed URL, no tool, no bindings. The input comes
    back as a call to that URL (for its audit row) without the caller's own credentials."""
    grant = open_grant(svc, inp.rest)
    if (grant is None or grant.org_id != ident.org_id or grant.member_id != ident.member_id
            or grant.expires_at < time.time()):
        raise _unknown()
    url, _, query = grant.url.partition("?")
    inp = replace(inp, rest=url, raw_query=query, parent_call_id=grant.parent_call_id,
                  headers=tuple((k, v) for k, v in inp.headers if k.lower() not in CALLER_CREDENTIALS))
    return inp, ResolvedTarget(upstream_url=url, query=tuple(split_query(query)), tool=None, bindings=(),
                               provider=urlsplit(url).hostname, scope_project_id=grant.project_id)


def _within_tool(tool: ToolRef, url: str, name: str | None = None) -> str | None:
    """``url`` as a named call to ``tool`` (``/call/<name>/…``, the tool's own name unless given: a hub
    call's is its ref) when it lies inside the tool's base URL (same scheme, host and port, path prefix
    on a segment boundary), else None."""
    head, _, query = url.partition("?")
    scheme, sep, rest = head.partition("://")
    bscheme, _, brest = tool.base.partition("://")
    if not sep or scheme.lower() != bscheme.lower():
        return None
    netloc, slash, path = rest.partition("/")
    bnetloc, _, bpath = brest.partition("/")
    if netloc.rpartition("@")[2].lower() != bnetloc.rpartition("@")[2].lower():
        return None
    path, bpath = slash + path, ("/" + bpath).rstrip("/")
    if not (path == bpath or path.startswith(bpath + "/")):
        return None
    pairs = split_query(query)
    if tool.base_query and tuple(pairs[:len(tool.base_query)]) == tool.base_query:
        pairs = pairs[len(tool.base_query):]  # the call adds the base URL's own query pairs again
    out = "/call/" + quote(name or tool.name, safe="") + path[len(bpath):]
    if pairs:
        out += "?" + "&".join(k if v is None else f"{k}={v}" for k, v in pairs)
    return out


def treg_location(svc: Services, ident: Identity, inp: CallInput, target: ResolvedTarget, value: str,
                  mask: Callable[[str], str], ttl_s: int) -> str | None:
    """The treg URL a relayed ``Location``/``Content-Location`` value becomes, or None: the value is
    dropped. Only a value the strict grammar of :mod:`treg.uri_grammar` reads (an http(s) URL or a
    relative reference every client reads alike) is rewritten; anything else — a spelling some client
    would read as another host (``http://x[@evil/``, ``http:////evil``, ``http:/evil``), another scheme
    (``ftp:``, ``javascript:``, ``myapp:``), a user-info part — never reaches the caller as a
    ``Location`` at all, so no client can follow it with its treg token (the upstream's value stays
    in ``X-Treg-Upstream-Location``, which no client follows)."""
    # relative to what the caller asked for (never the sent URL: it may carry an injected key)
    resolved = uri_grammar.resolve(target.full_url, value.strip(" \t"))
    if resolved is None:
        return None
    absolute = mask(resolved)
    url, hash_, fragment = absolute.partition("#")
    prefix = path_prefix(svc.settings)  # behind a reverse proxy, its path prefix (operability.md)
    hub = target.hub_for(ident.org_id) is not None
    if target.tool is not None and inp.surface != "redirect":
        # a hub call's caller may call the ref, never the publisher's tool by its own name
        named = _within_tool(target.tool, url, target.hub.ref if target.hub is not None else None)
        if named is not None:
            if inp.surface == "call" and parse_rest(inp.rest)[0] == "url":
                return prefix + "/call/" + absolute  # the caller's passthrough form
            return prefix + named + hash_ + fragment
    # the hop runs under the caller's deny rules: a hub tool's project is the publisher's, not theirs
    grant = RedirectGrant(ident.org_id, ident.member_id, url, inp.call_id, int(time.time()) + ttl_s,
                          None if hub else target.project_id)
    return prefix + "/redirect/" + seal(svc, grant) + hash_ + fragment


def _treg_links(svc: Services, ident: Identity, inp: CallInput, target: ResolvedTarget, value: str,
                mask: Callable[[str], str], ttl_s: int) -> str | None:
    """A ``Link`` value with each link's URL rewritten as a ``Location`` is (:func:`treg_location`), its
    parameters as they came; a link whose URL treg cannot read is left out, and a value that is not
    RFC 8288's grammar is dropped whole (None), as no client may read it otherwise than treg did."""
    links = link_grammar.link_values(value)
    if links is None:
        return None
    out = []
    for url, params in links:
        if "<" in params or ">" in params:
            # requests' and httpx's ``links`` split a value at ``, <`` even inside a quoted parameter, so
            # ``title="x, <https://elsewhere/>; rel=next"`` is a link of its own to them, never rewritten
            continue
        rewritten = treg_location(svc, ident, inp, target, url, mask, ttl_s)
        if rewritten is not None:
            out.append(f"<{rewritten}>{params}")
    return ", ".join(out) or None


def rewrite_locations(svc: Services, ident: Identity, inp: CallInput, target: ResolvedTarget,
                      headers: Iterable[tuple[str, str]], mask: Callable[[str], str]) -> list[tuple[str, str]]:
    """The relayed headers with every ``Location``/``Content-Location``, and every URL of a ``Link``,
    pointing into treg (or dropped: :func:`treg_location`, :func:`_treg_links`), and the upstream's own
    values (injected credentials masked) in treg's ``X-Treg-Upstream-*`` headers."""
    out: list[tuple[str, str]] = []
    kept: list[tuple[str, str]] = []
    ttl_s = svc.settings.redirect_ttl_s
    # a hub caller is not told where the publisher's API points (its base URL is the publisher's)
    keep_upstream = target.hub_for(ident.org_id) is None
    for k, v in headers:
        name = k.lower()
        keep = KEPT_AS.get(name)
        if keep is None:
            out.append((k, v))
            continue
        if name == "link":
            rewritten = _treg_links(svc, ident, inp, target, v, mask, ttl_s)
        else:
            rewritten = treg_location(svc, ident, inp, target, v, mask, ttl_s)
        if rewritten is not None:
            out.append((k, rewritten))
        if keep_upstream:
            kept.append((keep, mask(v)))
    return out + kept
