"""treg's own origin and path prefix, as ``TREG_PUBLIC_URL`` names them (operability.md "Behind a
reverse proxy"): ``https://gw.example.com/treg`` is the origin ``https://gw.example.com`` and the
prefix ``/treg``. Whatever treg hands a client to come back to (a rewritten ``Location``) starts with
the prefix; whatever checks a browser's ``Origin`` compares it with the origin.

Plain functions of the settings, no I/O: importable from every layer above ``treg.settings``.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from treg.settings import Settings

#: a prefix's segments: RFC 3986 path characters, no empty segment (``//treg`` would read as a host)
_PREFIX = re.compile(r"\A(?:/(?:[A-Za-z0-9\-._~!$&'()*+,;=:@]|%[0-9A-Fa-f]{2})+)*\Z")


def normalized_origin(value: str) -> str | None:
    """``scheme://host[:port]`` lower-cased, default port dropped; None when not an http(s) origin."""
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


@lru_cache(maxsize=8)
def _split(url: str) -> tuple[str | None, str]:
    parts = urlsplit(url.strip())
    return normalized_origin(f"{parts.scheme}://{parts.netloc}"), parts.path.rstrip("/")


def check(url: str) -> str:
    """``url`` when it can be treg's public URL (an http(s) origin, optionally a path; no query,
    fragment or user-info), else ValueError saying why (the settings loader's ``bad_setting``)."""
    try:
        parts = urlsplit(url.strip())
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


def own_origin(settings: Settings) -> str | None:
    """treg's public origin (``scheme://host[:port]``), None when ``TREG_PUBLIC_URL`` is unset."""
    return _split(settings.public_url)[0] if settings.public_url else None


def path_prefix(settings: Settings) -> str:
    """The path a reverse proxy mounts treg under (``/treg``; ``""`` at the root or unset): a
    path-absolute URL treg hands out is ``path_prefix(settings) + "/call/…"``."""
    return _split(settings.public_url)[1] if settings.public_url else ""
