"""Deny-rule matching (pure): host/path/method × member × project, each NULL-means-any, ANDed.

The path match is anchored at a segment boundary: ``/v1/charges`` matches ``/v1/charges`` and
``/v1/charges/ch_1`` but never ``/v1/chargesX``. A rule host without a port matches that host on any
port; ``host:port`` matches only that port. Hosts compare case-insensitively.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class DenyRule:
    id: str
    host: str
    path: str | None = None
    method: str | None = None
    member_id: str | None = None
    project_id: str | None = None
    reason: str | None = None


def split_host(netloc: str) -> tuple[str, str | None]:
    """(hostname, port or None) of ``host`` / ``host:port`` / ``[v6]:port``."""
    netloc = netloc.lower()
    if netloc.startswith("["):
        end = netloc.find("]")
        host, rest = netloc[:end + 1], netloc[end + 1:]
        return host, rest[1:] if rest.startswith(":") and rest[1:] else None
    if netloc.count(":") == 1:
        host, _, port = netloc.partition(":")
        return host, port or None
    return netloc, None


def path_matches(rule_path: str | None, path: str) -> bool:
    if not rule_path or rule_path == "/":
        return True
    base = rule_path.rstrip("/")
    return path == base or path.startswith(base + "/")


def host_matches(rule_host: str, host: str, scheme: str) -> bool:
    rh, rp = split_host(rule_host)
    h, p = split_host(host)
    if rh != h:
        return False
    if rp is None:
        return True
    effective = p or {"http": "80", "https": "443"}.get(scheme)
    return rp == effective


def first_match(rules: Iterable[DenyRule], *, scheme: str, host: str, path: str, method: str,
                member_id: str, project_id: str | None) -> DenyRule | None:
    for rule in rules:
        if rule.member_id is not None and rule.member_id != member_id:
            continue
        if rule.project_id is not None and rule.project_id != project_id:
            continue
        if rule.method is not None and rule.method.upper() != method.upper():
            continue
        if not host_matches(rule.host, host, scheme):
            continue
        if not path_matches(rule.path, path):
            continue
        return rule
    return None
