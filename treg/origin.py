"""treg's own origin and path prefix, from the settings alone (operability.md, "Behind a reverse proxy").

``TREG_PUBLIC_URL`` (``https://gw.example.com/treg``) is the URL browsers and callers reach treg at: its
``scheme://host[:port]`` is treg's own origin (the dashboard's login and the MCP Origin check accept only
it), its path the prefix every URL treg builds for a browser keeps (``/treg/ui/…``), and its scheme
decides the session cookie's ``Secure``. Unset, the origin is the address and port the connection came
in on. Never the request's ``Host`` header: a DNS-rebinding page or a forged request controls it.

Plain Python, no I/O: the dashboard, the MCP edge, the Location rewrite and the settings loader (which
refuses at startup a ``TREG_PUBLIC_URL`` no origin or prefix can be built from) read these functions,
so they agree.
"""

from __future__ import annotations

import ipaddress
import re
from contextvars import ContextVar
from functools import lru_cache
from typing import Any, Protocol
from urllib.parse import urlsplit


class OriginSettings(Protocol):
    """What these functions read of :class:`treg.settings.Settings`: this module sits below the settings,
    whose loader checks ``TREG_PUBLIC_URL`` with :func:`check`."""

    @property
    def public_url(self) -> str | None: ...

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...


#: a prefix's segments: RFC 3986 path characters, no empty segment (``//treg`` would read as a host)
_PREFIX = re.compile(r"\A(?:/(?:[A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})+)*\Z")


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


@lru_cache(maxsize=8)
def _split(url: str) -> tuple[str | None, str]:
    parts = urlsplit(url.strip())
    return normalized_origin(f"{parts.scheme}://{parts.netloc}"), parts.path.rstrip("/")


def check(url: str) -> str:
    """``url`` when it can be treg's public URL (an http(s) origin, optionally a path; no query,
    fragment or user-info), else ValueError saying why (the settings loader's ``bad_setting``)."""
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 (a ValueError for a bad port)
    except ValueError as exc:
        raise ValueError(f"{url!r} is not a URL: {exc}") from exc
    if parts.query or parts.fragment or "@" in parts.netloc:
        raise ValueError(f"{url!r}: a public URL has no query, fragment or user-info")
    origin, prefix = _split(url)
    if origin is None:
        raise ValueError(f"{url!r} is not an http(s) URL with a host, such as https://gw.example.com/treg")
    if not _PREFIX.match(prefix):
        raise ValueError(f"{url!r}: its path must be plain segments, such as /treg")
    return url.strip()


def public_origin(settings: OriginSettings) -> str | None:
    """treg's public origin (``scheme://host[:port]``), None when ``TREG_PUBLIC_URL`` is unset."""
    return _split(settings.public_url)[0] if settings.public_url else None


def path_prefix(settings: OriginSettings) -> str:
    """The path a reverse proxy mounts treg under (``/treg``; ``""`` at the root or unset): every path
    treg hands out (a dashboard link, a rewritten ``Location``) is ``path_prefix(settings) + "/…"``, the
    proxy stripping it before treg sees the request."""
    return _split(settings.public_url)[1] if settings.public_url else ""


def public_https(settings: OriginSettings) -> bool:
    """Whether treg's own origin is https: a proxy terminating TLS speaks plain http to treg, and the
    browser is on https all the same."""
    origin = public_origin(settings)
    return origin is not None and origin.startswith("https://")


def own_origins(settings: OriginSettings, sockname: Any) -> set[str]:
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


#: the local address the request being served came in on (``sockname``), noted by the edges whose work
#: builds absolute URLs (the call surfaces and MCP: a ``connect_url`` in a refusal), for when
#: ``TREG_PUBLIC_URL`` is unset
_LISTEN: ContextVar[Any] = ContextVar("treg_listen", default=None)


def own_base(settings: OriginSettings, sockname: Any) -> str:
    """treg's own origin and path prefix as one URL to append paths to (``https://gw.example.com/treg``):
    ``TREG_PUBLIC_URL`` when set, else ``http://<address>:<port>`` of the connection ``sockname`` (never
    the Host header); without either, the configured listen address."""
    if settings.public_url:
        origin, prefix = _split(settings.public_url)
        return f"{origin}{prefix}"
    if isinstance(sockname, tuple) and len(sockname) >= 2:
        host = str(sockname[0]).split("%", 1)[0]
        try:
            if ipaddress.ip_address(host).version == 6:
                host = f"[{host}]"
        except ValueError:
            pass
        return f"http://{host}:{sockname[1]}"
    host = settings.host if ":" not in settings.host else f"[{settings.host}]"
    return f"http://{host}:{settings.port}"


def note_listen(sockname: Any) -> None:
    """Remember, for the rest of this request's task, the address it came in on (see :func:`request_base`)."""
    _LISTEN.set(sockname)


def request_base(settings: OriginSettings) -> str:
    """:func:`own_base` of the request being served (the address an edge noted with :func:`note_listen`)."""
    return own_base(settings, _LISTEN.get())
