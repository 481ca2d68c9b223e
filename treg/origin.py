"""treg's own origin and path prefix, from the settings alone (operability.md, "Behind a reverse proxy").

``TREG_PUBLIC_URL`` (``https://gw.example.com/treg``) is the URL browsers and callers reach treg at: its
``scheme://host[:port]`` is treg's own origin (the dashboard's login and the MCP Origin check accept only
it), its path the prefix every URL treg builds for a browser keeps (``/treg/ui/…``), and its scheme
decides the session cookie's ``Secure``. Unset, the origin is the address and port the connection came
in on. Never the request's ``Host`` header: a DNS-rebinding page or a forged request controls it.

Plain Python: the dashboard, the MCP edge and anything else building or checking treg's own URLs read
these functions, so they agree.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

from treg.settings import Settings


def normalized_origin(value: str) -> str | None:
    """``scheme://host[:port]`` lower-cased, default port dropped; None when not an http(s) origin
    (``null``, a path, userinfo, garbage)."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") \
            or parts.query or parts.username is not None:
        return None
    host = parts.hostname.lower()
    if ":" in host:
        host = f"[{host}]"
    default = 80 if parts.scheme == "http" else 443
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None and port != default else "")


def origin_of_url(url: str) -> str | None:
    """The origin of a full URL (a ``Referer``), None when it has none."""
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        return None
    if parts.username is not None or parts.password is not None:
        return None
    return normalized_origin(f"{parts.scheme}://{parts.netloc}") if parts.netloc else None


def public_origin(settings: Settings) -> str | None:
    """``TREG_PUBLIC_URL``'s origin; None when unset (or not an http(s) URL)."""
    if not settings.public_url:
        return None
    return origin_of_url(settings.public_url)


def path_prefix(settings: Settings) -> str:
    """``TREG_PUBLIC_URL``'s path without its trailing ``/`` (``/treg``), ``""`` when there is none: what
    every path treg hands a browser starts with (the proxy strips it before treg sees the request)."""
    if not settings.public_url:
        return ""
    try:
        path = urlsplit(settings.public_url.strip()).path
    except ValueError:
        return ""
    return path.rstrip("/")


def public_https(settings: Settings) -> bool:
    """Whether treg's own origin is https: a proxy terminating TLS speaks plain http to treg, and the
    browser is on https all the same."""
    origin = public_origin(settings)
    return origin is not None and origin.startswith("https://")


def own_origins(settings: Settings, sockname: Any) -> set[str]:
    """treg's own origin: ``TREG_PUBLIC_URL``'s when set, else the address and port the connection came
    in on (with ``localhost`` and ``127.0.0.1`` for a loopback address) — never the request's Host header,
    which a DNS-rebinding page controls."""
    if settings.public_url:
        own = public_origin(settings)
        return {own} if own else set()
    if not isinstance(sockname, tuple) or len(sockname) < 2:
        return set()
    host, port = str(sockname[0]).split("%", 1)[0], sockname[1]
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return set()
    names = [f"[{host}]" if ip.version == 6 else host]
    if ip.is_loopback:
        names += ["localhost", "127.0.0.1", "[::1]"]
    return {o for o in (normalized_origin(f"http://{n}:{port}") for n in names) if o}


def sent_from(origin: str | None, referer: str | None, own: set[str]) -> bool:
    """Whether a browser's form post came from one of ``own`` origins: its ``Origin`` when it sent one
    (``null``, a sandboxed frame's or a privacy-redirect's, is no origin of ours), else its ``Referer``'s;
    neither is never ours (a request without either comes from no page treg can vouch for)."""
    if origin is not None:
        return normalized_origin(origin) in own
    if referer is not None:
        return origin_of_url(referer) in own
    return False
