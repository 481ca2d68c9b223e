"""Which headers cross the relay, in each direction (the seed's _DROP_REQUEST / _DROP_RESPONSE)."""

from __future__ import annotations

from typing import Container, Iterable, Sequence

from treg.cookie_names import BUILTIN_HOST_COOKIES, TREG_COOKIES, HostCookies
from treg.http_grammar import PER_HOP as HOP_BY_HOP, list_elements
from treg.memo import BoundedMemo

#: treg's control/infra headers and edge forwarding headers: never reach an upstream
CONTROL = frozenset({"x-treg-token", "x-treg-org", "ngrok-skip-browser-warning", "x-real-ip", "forwarded", "via"})

NOSNIFF = ("X-Content-Type-Options", "nosniff")
SANDBOX = ("Content-Security-Policy", "sandbox")


def connection_tokens(headers: Iterable[tuple[str, str]]) -> set[str]:
    """Header names a peer marked hop-by-hop in its Connection header (RFC 7230 §6.1)."""
    out: set[str] = set()
    for k, v in headers:
        if k.lower() == "connection":
            out.update(t.strip().lower() for t in v.split(",") if t.strip())
    return out


#: request headers whose negotiation treg's edge already completed with the caller: ``Expect:
#: 100-continue`` was answered (100 Continue) before the body was read, so the body is coming either way;
#: relayed, it made aiohttp's client wait for an upstream 100 that many servers never send (a stalled call)
EDGE_HANDLED = frozenset({"expect"})


#: dropped from a request by name, and by prefix
_DROP_REQUEST = HOP_BY_HOP | EDGE_HANDLED | CONTROL
_DROP_REQUEST_PREFIXES = ("x-treg-", "proxy-", "x-forwarded-")
#: what a browser applies to the origin that answered, which is treg's, not the upstream's: one tool's
#: vendor (or any upstream a caller reaches) would set policy for treg's own origin. HSTS with
#: ``max-age=0`` clears the operator's own policy for the dashboard (the first such header wins);
#: ``Clear-Site-Data: "cookies"`` on an answer a browser reads logs the user out of treg and of every
#: site on its registrable domain; ``Alt-Svc`` announces other endpoints for treg's origin; ``Refresh``
#: navigates a browser showing the answer anywhere (an open redirect on treg's origin, which the
#: rewriting of ``Location`` closes; no API client follows it)
ORIGIN_POLICY = frozenset({"strict-transport-security", "clear-site-data", "alt-svc", "refresh"})
#: what the reverse proxy in front of treg obeys in a backend's answer, and treg's answers are its
#: backend's: nginx's ``X-Accel-Redirect`` served whatever location an upstream named (a site's internal
#: files, another treg call as the caller), its other ``X-Accel-*`` set the rate (``Limit-Rate: 1``),
#: buffering, caching and charset of the caller's answer; Apache's mod_xsendfile and lighttpd send the
#: file an ``X-Sendfile`` names. Never an upstream's to set: dropped by these names and the prefix
FRONT_PROXY = frozenset({"x-sendfile", "x-sendfile2", "x-lighttpd-send-file"})
FRONT_PROXY_PREFIX = "x-accel-"
#: a relayed answer is one caller's: fetched with its org's credential, for its token. A cache shared
#: between callers (a CDN, nginx's ``proxy_cache`` in front of treg) keys on the URL alone and does not
#: know ``X-Treg-Token`` is a credential, so an upstream's ``Cache-Control: public, max-age=600`` made it
#: serve one org's answer to anyone asking for the same URL, without a token. Every relayed answer says
#: ``private`` (the caller's own client may still cache it: :func:`private_cache_control`), and these
#: fields, which target a shared cache and which such a cache obeys in place of ``Cache-Control``
#: (RFC 9213's CDN-Cache-Control and its vendors' spellings, the Edge Architecture's Surrogate-Control),
#: are dropped
SHARED_CACHE = frozenset({"cdn-cache-control", "cloudflare-cdn-cache-control", "akamai-cache-control",
                          "surrogate-control", "edge-control"})
#: dropped from an answer by name (Content-Length is relayed: the caller's framing is the upstream's)
_DROP_RESPONSE = ((HOP_BY_HOP - {"content-length"}) | {"x-content-type-options"} | ORIGIN_POLICY | FRONT_PROXY
                  | SHARED_CACHE)
_DROP_RESPONSE_PREFIXES = ("x-treg-", FRONT_PROXY_PREFIX)


def scrub_cookie(value: str, host: HostCookies = BUILTIN_HOST_COOKIES) -> str | None:
    """The Cookie header without treg's own cookies nor its host's (others kept verbatim, in order)."""
    parts = value.split(";")
    ours = [host.owns(part.strip().split("=", 1)[0].strip()) for part in parts]
    if not any(ours):
        return value  # nothing of treg's: the caller's bytes, spacing and all
    kept = [part for part, is_ours in zip(parts, ours) if part.strip() and not is_ours]
    if not kept:
        return None
    return ";".join(kept).strip()


#: what :func:`request_headers` and :func:`response_headers` do with a header, by its name (``_COOKIE``:
#: the direction's cookie header, ``Cookie`` going up, ``Set-Cookie`` coming back; ``_CACHE``: an
#: answer's Cache-Control, rewritten by :func:`private_cache_control`)
_KEEP, _DROP, _CONNECTION, _COOKIE, _CACHE = range(5)


def _verdict(name: str, drop: frozenset[str], prefixes: tuple[str, ...], cookie: str, cache: str = "") -> int:
    n = name.lower()
    if n == "connection":
        return _CONNECTION
    if n in drop or n.startswith(prefixes):
        return _DROP
    if n == cache:
        return _CACHE
    return _COOKIE if n == cookie else _KEEP


#: request verdicts by the name as the caller spelled it: :data:`_RESPONSE_VERDICTS`' trick, for the
#: names a client sends on every call (bounded: a caller may send any names)
_REQUEST_VERDICTS: BoundedMemo[str, int] = BoundedMemo(1024)


def request_headers(raw: Sequence[tuple[str, str]],
                    host: HostCookies = BUILTIN_HOST_COOKIES) -> list[tuple[str, str]]:
    """The caller's headers that go upstream: order and duplicates kept, hop-by-hop and control dropped,
    and the cookies of treg and of its host (``host``) taken out of ``Cookie``."""
    out = []
    listed: set[str] | None = None
    known = _REQUEST_VERDICTS.get
    for k, v in raw:
        verdict = known(k)
        if verdict is None:
            verdict = _REQUEST_VERDICTS.put(k, _verdict(k, _DROP_REQUEST, _DROP_REQUEST_PREFIXES, "cookie"))
        if verdict == _KEEP:
            out.append((k, v))
        elif verdict == _COOKIE:
            scrubbed = scrub_cookie(v, host)
            if scrubbed is not None:
                out.append((k, scrubbed))
        elif verdict == _CONNECTION:
            listed = connection_tokens(raw)
    if listed:  # names the caller's Connection header marked hop-by-hop (rare: a second pass)
        out = [(k, v) for k, v in out if k.lower() not in listed]
    return out


#: the directives of a cache shared between callers (``private`` too: the answer's own comes first,
#: unqualified, and covers an upstream's ``private="Set-Cookie"``)
_SHARED_DIRECTIVES = frozenset({"public", "private", "s-maxage", "proxy-revalidate"})
#: rewritten values by the upstream's (an upstream sends the same few on every answer)
_PRIVATE: BoundedMemo[str, str] = BoundedMemo(256)


def private_cache_control(value: str | None) -> str:
    """The Cache-Control a caller gets for an upstream's (``None``: it sent none): ``private`` first,
    then the upstream's directives in order, minus those only a shared cache reads (``public``,
    ``s-maxage``, ``proxy-revalidate``) and its own ``private``. ``max-age``, ``no-store``, ``no-cache``
    and the rest still tell the caller's client what the upstream meant."""
    if value is None:
        return "private"
    found = _PRIVATE.get(value)
    if found is None:
        kept = [e for e in list_elements(value) if e.split("=", 1)[0].strip().lower() not in _SHARED_DIRECTIVES]
        found = _PRIVATE.put(value, ", ".join(["private", *kept]))
    return found


def replayed(stored: Iterable[Sequence[str]], drop: Container[str]) -> list[tuple[str, str]]:
    """A stored answer's headers for its replay (an idempotent one): without ``drop`` (lower-case names, the
    original call's own), and with what a shared cache reads said as :func:`response_headers` says it
    now, whenever the answer was stored: one ``Cache-Control`` starting with ``private``, no
    :data:`SHARED_CACHE` field (an entry stored before treg said so still holds the vendor's ``public``)."""
    out: list[tuple[str, str]] = []
    cache: str | None = None
    for k, v in stored:
        n = k.lower()
        if n == "cache-control":
            cache = v if cache is None else f"{cache}, {v}"
        elif n not in drop and n not in SHARED_CACHE:
            out.append((k, v))
    out.append(("Cache-Control", private_cache_control(cache)))
    return out


def _sets_treg_cookie(value: str) -> bool:
    name = value.split("=", 1)[0].strip()
    return name in TREG_COOKIES


#: verdicts by the name as the upstream spelled it: an answer's names repeat from call to call, and
#: lower-casing and testing each on every answer cost more than this lookup (a speed trick:
#: docs/performance.md, round 6); bounded, as any upstream may send any names
_RESPONSE_VERDICTS: BoundedMemo[str, int] = BoundedMemo(1024)
#: the same for an answer whose length treg sets itself (:func:`response_headers` with ``length=False``)
_LENGTHLESS_VERDICTS: BoundedMemo[str, int] = BoundedMemo(1024)
_DROP_RESPONSE_LENGTH = _DROP_RESPONSE | {"content-length"}


def response_headers(raw: Sequence[tuple[str, str]], *, length: bool = True) -> list[tuple[str, str]]:
    """The upstream's headers the caller gets: every one (both Set-Cookie lines, Content-Length kept)
    minus hop-by-hop framing, X-Treg-*, treg's cookie names, policy for treg's origin (:data:`ORIGIN_POLICY`),
    instructions to the proxy in front of it (:data:`FRONT_PROXY`, ``X-Accel-*``) and to shared caches
    (:data:`SHARED_CACHE`); its Cache-Control made ``private`` (one line, last); plus nosniff and CSP
    sandbox. ``length=False``: without Content-Length (an answer read whole, whose length treg sets)."""
    out = []
    listed: set[str] | None = None
    cache: str | None = None
    memo, drop = (_RESPONSE_VERDICTS, _DROP_RESPONSE) if length else (_LENGTHLESS_VERDICTS, _DROP_RESPONSE_LENGTH)
    known = memo.get
    for k, v in raw:
        verdict = known(k)
        if verdict is None:
            verdict = memo.put(k, _verdict(k, drop, _DROP_RESPONSE_PREFIXES, "set-cookie", "cache-control"))
        if verdict == _KEEP:
            out.append((k, v))
        elif verdict == _CACHE:
            cache = v if cache is None else f"{cache}, {v}"  # several lines are one list (RFC 9110 §5.3)
        elif verdict == _CONNECTION:
            listed = connection_tokens(raw)
        elif verdict == _COOKIE and not _sets_treg_cookie(v):
            out.append((k, v))
    if listed:  # names the upstream's Connection header marked hop-by-hop; never its Content-Length
        out = [(k, v) for k, v in out if k.lower() == "content-length" or k.lower() not in listed]
        if "cache-control" in listed:
            cache = None
    out.append(("Cache-Control", private_cache_control(cache)))
    out.append(NOSNIFF)
    out.append(SANDBOX)  # beside any upstream policy: browsers enforce both
    return out
