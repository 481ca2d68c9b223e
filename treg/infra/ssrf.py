"""SSRF address policy: which upstream addresses treg refuses to reach.

Targets must be globally routable unicast addresses. Refused: loopback, private, link-local,
reserved, multicast, unspecified, CGNAT 100.64.0.0/10 (Tailscale, Fly, Alibaba's metadata
100.100.100.200), NAT64 64:ff9b::/96 and 64:ff9b:1::/48 mapping a non-global IPv4, IPv4-mapped and
-compatible IPv6 of a non-global IPv4, 6to4/Teredo wrapping one. Numeric host spellings that
``inet_aton`` accepts (``2130706433``, ``0x7f000001``, ``0177.0.0.1``, ``127.1``) are normalized
first, so they cannot slip past as "not an IP". ``TREG_SSRF_ALLOW`` CIDRs are exempt.

A host as written is normalised before any of that (:func:`normalize_host`): percent-encoded octets
decoded, IDNA UTS-46 mapping (full-width and enclosed digits and dots: ``①②⑦.⓪.⓪.①`` and
``１２７.０.０.１`` are ``127.0.0.1``). Special-use names are internal by name: the loopback names
(:func:`loopback_name`) mean 127.0.0.1 and ::1 and are never asked of DNS; ``*.local`` (mDNS) and
``*.internal`` (cloud-private zones) only ever name a network's inside, so they are refused unless every
address they resolve to is exempted by ``TREG_SSRF_ALLOW`` (:func:`site_local_name`).
"""

from __future__ import annotations

import ipaddress
import socket
import unicodedata
from dataclasses import dataclass
from typing import Iterable
from urllib.parse import unquote

import idna

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


#: names that are the loopback by definition (RFC 6761) or by every system's hosts file
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
_SITE_LOCAL = ("local", "internal")
LOOPBACK = (ipaddress.IPv4Address("127.0.0.1"), ipaddress.IPv6Address("::1"))


def normalize_host(host: str) -> str:
    """The name or address a host spelling means to a resolver: percent-encoded octets decoded
    (repeatedly: ``%2531`` is ``1`` to a client that decodes twice), IDNA UTS-46 mapping (full-width
    and enclosed characters become ASCII, upper case lower), no trailing dot. An IPv6 literal or a name
    IDNA refuses (``_`` in a label) is NFKC-normalised and lower-cased instead."""
    h = host.strip()
    for _ in range(4):
        decoded = unquote(h)
        if decoded == h:
            break
        h = decoded
    if h.startswith("[") or ":" in h:
        return h.lower()
    if not h.isascii():
        try:
            h = idna.encode(h, uts46=True).decode("ascii")
        except (idna.IDNAError, UnicodeError):
            h = unicodedata.normalize("NFKC", h)
    return h.rstrip(".").lower()


def loopback_name(name: str) -> bool:
    """``localhost``, ``*.localhost``, ``localhost.localdomain``, ``ip6-localhost`` (a normalised name)."""
    return name in _LOOPBACK_NAMES or name.endswith(".localhost")


def site_local_name(name: str) -> bool:
    """``*.local`` and ``*.internal`` (a normalised name): special-use names of a network's inside."""
    return name.rpartition(".")[2] in _SITE_LOCAL


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

    def exempt(self, addr: IPAddress) -> bool:
        """Is ``addr`` inside a ``TREG_SSRF_ALLOW`` CIDR (or the guard off)?"""
        if not self.enabled:
            return True
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        return any(addr in net for net in self.allow if net.version == addr.version)

    def refused(self, addrs: Iterable[IPAddress]) -> list[IPAddress]:
        return [a for a in addrs if not self.allowed(a)]
