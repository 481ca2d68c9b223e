"""SSRF address policy: which upstream addresses treg refuses to reach.

Targets must be globally routable unicast addresses. Refused: loopback, private, link-local,
reserved, multicast, unspecified, CGNAT 100.64.0.0/10 (Tailscale, Fly, Alibaba's metadata
100.100.100.200), NAT64 64:ff9b::/96 and 64:ff9b:1::/48 mapping a non-global IPv4, IPv4-mapped and
-compatible IPv6 of a non-global IPv4, 6to4/Teredo wrapping one. Numeric host spellings that
``inet_aton`` accepts (``2130706433``, ``0x7f000001``, ``0177.0.0.1``, ``127.1``) are normalized
first, so they cannot slip past as "not an IP". ``TREG_SSRF_ALLOW`` CIDRs are exempt.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Iterable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = (ipaddress.ip_network("64:ff9b::/96"), ipaddress.ip_network("64:ff9b:1::/48"))
#: not globally reachable, yet ``is_global`` says otherwise on some Python versions (3.11 treats the
#: IPv4 dummy address 192.0.0.8 and the deprecated site-local fec0::/10 as global): refused explicitly
#: so the policy does not change with the interpreter
_ALSO_INTERNAL = tuple(ipaddress.ip_network(n) for n in (
    "192.0.0.0/24",  # IETF protocol assignments
    "192.88.99.0/24",  # deprecated 6to4 relay anycast
    "fec0::/10",  # deprecated site-local
))


def parse_numeric_host(host: str) -> IPAddress | None:
    """The address a numeric host spelling means, or None when ``host`` is a name.

    Covers dotted quads, IPv6 literals (bracketed or not, zone ids dropped) and the legacy forms
    ``inet_aton`` accepts: one to four parts in decimal, octal (leading 0) or hex (0x).
    """
    h = host.strip().rstrip(".")
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    h = h.split("%", 1)[0]
    try:
        return ipaddress.ip_address(h)
    except ValueError:
        pass
    if not h or any(c not in "0123456789abcdefxABCDEFX." for c in h):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(h))
    except OSError:
        return None


def _embedded_v4(addr: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    for net in _NAT64:
        if addr in net:
            return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    if addr.sixtofour is not None:
        return addr.sixtofour
    if addr.teredo is not None:
        return addr.teredo[1]
    # IPv4-compatible (deprecated) ::a.b.c.d
    if int(addr) >> 32 == 0 and int(addr) > 1:
        return ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF)
    return None


def is_internal(addr: IPAddress) -> bool:
    """True when ``addr`` is not a globally routable unicast address."""
    if isinstance(addr, ipaddress.IPv6Address):
        inner = _embedded_v4(addr)
        if inner is not None:
            return is_internal(inner)
    if isinstance(addr, ipaddress.IPv4Address) and addr in _CGNAT:
        return True
    if any(addr in net for net in _ALSO_INTERNAL if net.version == addr.version):
        return True
    return (not addr.is_global or addr.is_multicast or addr.is_private or addr.is_loopback
            or addr.is_link_local or addr.is_reserved or addr.is_unspecified)


@dataclass(frozen=True)
class SsrfPolicy:
    enabled: bool = True
    allow: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()

    @classmethod
    def from_settings(cls, enabled: bool, allow: Iterable[str]) -> "SsrfPolicy":
        return cls(enabled, tuple(ipaddress.ip_network(c, strict=False) for c in allow))

    def allowed(self, addr: IPAddress) -> bool:
        """May treg connect to ``addr``?"""
        if not self.enabled:
            return True
        if any(addr in net for net in self.allow if net.version == addr.version):
            return True
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            if any(addr.ipv4_mapped in net for net in self.allow if net.version == 4):
                return True
        return not is_internal(addr)

    def refused(self, addrs: Iterable[IPAddress]) -> list[IPAddress]:
        return [a for a in addrs if not self.allowed(a)]
