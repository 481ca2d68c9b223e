"""What a trusted reverse proxy may tell treg about the client (operability.md, "Behind a reverse proxy").

``X-Forwarded-For`` and ``X-Forwarded-Proto`` are believed only from a peer inside
``TREG_TRUSTED_PROXIES``; from anyone else they are ignored (a caller could write anything there). They
never reach an upstream either way (treg/call/headers.py drops ``x-forwarded-*``).

``X-Forwarded-For`` is read from the right: each proxy appends the address it got the request from, so
the entries a trusted proxy wrote are the last ones; the client is the first entry, walking leftwards,
that is not itself a trusted proxy. Whatever is left of it came from the client and is not read. A
malformed entry ends the walk at the last address a trusted hop vouched for.

The public demo's hourly limit counts calls by the same client address (:func:`demo_client`: this one
reading, bucketed: an IPv6 client by its /64), so a visitor behind a proxy that appends to the header
cannot pick its own bucket by writing an address first (docs/sharing.md, "The client address").

Plain Python: the edge hands in the connection's peer address and the request's headers.
"""

from __future__ import annotations

import functools
import ipaddress
from typing import Iterable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@functools.lru_cache(maxsize=8)
def trusted_networks(entries: tuple[str, ...]) -> tuple[Network, ...]:
    """``TREG_TRUSTED_PROXIES`` as networks (a bare address is its /32 or /128)."""
    return tuple(ipaddress.ip_network(e.strip(), strict=False) for e in entries if e.strip())


def _address(text: str) -> Address | None:
    text = text.strip()
    if text.startswith("[") and "]" in text:  # [v6] or [v6]:port (RFC 7239 spelling, some proxies use it)
        text = text[1:text.index("]")]
    elif text.count(":") == 1:  # v4:port
        text = text.partition(":")[0]
    try:
        addr = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def _trusted(addr: Address, trusted: tuple[Network, ...]) -> bool:
    return any(addr.version == net.version and addr in net for net in trusted)


def _values(headers: Iterable[tuple[str, str]], name: str) -> list[str]:
    # every instance of the header, in order, split at commas: two headers are one comma-joined list
    out: list[str] = []
    for key, value in headers:
        if key.lower() == name:
            out.extend(part.strip() for part in value.split(","))
    return out


def client_address(peer: str | None, headers: Iterable[tuple[str, str]], trusted: tuple[Network, ...]) -> str | None:
    """The client's address: ``peer`` (the connection's), or, when ``peer`` is a trusted proxy, what the
    trusted hops of ``X-Forwarded-For`` say (read from the right)."""
    if not trusted or peer is None:
        return peer
    addr = _address(peer)
    if addr is None or not _trusted(addr, trusted):
        return peer
    client = addr
    for entry in reversed(_values(headers, "x-forwarded-for")):
        hop = _address(entry)
        if hop is None:
            break  # garbage from a hop we trust to write addresses: stop at the last one it vouched for
        client = hop
        if not _trusted(hop, trusted):
            break
    return str(client)


def forwarded_proto(peer: str | None, headers: Iterable[tuple[str, str]], trusted: tuple[Network, ...]) -> str | None:
    """``http`` or ``https`` as a trusted proxy states the client's scheme (the value the nearest hop
    wrote: the last one); None from any other peer or when it states nothing usable."""
    if not trusted or peer is None:
        return None
    addr = _address(peer)
    if addr is None or not _trusted(addr, trusted):
        return None
    values = _values(headers, "x-forwarded-proto")
    last = values[-1].lower() if values else ""
    return last if last in ("http", "https") else None


#: an IPv6 client of the demo counts by this prefix: one host is routinely given a whole /64
DEMO_V6_PREFIX = 64


def demo_client(peer: str | None, headers: Iterable[tuple[str, str]], trusted: tuple[Network, ...]) -> str:
    """The client address the public demo counts calls by (sharing.md): :func:`client_address`'s, as text:
    an IPv4 address, or an IPv6 client's /64 (``2001:db8::/64``); an IPv4-mapped IPv6 address is its IPv4
    address. No usable address (a Unix socket, a peer that is not an address): ``unknown``, one shared
    bucket."""
    client = client_address(peer, headers, trusted)
    addr = _address(client) if client is not None else None
    if addr is None:
        return "unknown"
    if isinstance(addr, ipaddress.IPv6Address):
        return str(ipaddress.ip_network(f"{addr}/{DEMO_V6_PREFIX}", strict=False))
    return str(addr)
