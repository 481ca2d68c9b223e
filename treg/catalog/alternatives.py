"""Capability alternatives: live endpoints with the same capability, cheapest first (pure, no I/O).

Suggested, never substituted: the caller chooses. Each entry says which credential tier the caller
would get, or, when none is available yet, what it would need, so an endpoint the caller cannot call
yet is listed too (catalog.md "Alternatives").
"""

from __future__ import annotations

from typing import Any

from treg.catalog.model import Endpoint
from treg.catalog.registry import CatalogRegistry
from treg.catalog.tiers import OrgCredentials, needed_tier, offer_tier
from treg.settings import Settings


def alternatives(registry: CatalogRegistry, endpoint: Endpoint, settings: Settings,
                 creds: OrgCredentials | None = None) -> list[dict[str, Any]]:
    """``[{id, price_micro, tier, callable}]`` for ``endpoint``'s capability, itself excluded.

    ``creds`` (the caller's org credentials, when already read) makes ``tier`` exact for the own/team
    tiers; without it only what settings alone decide (anonymous, platform) is known, and an endpoint
    needing the team's credential says ``team`` with ``callable: false``.
    """
    if not endpoint.capability:
        return []
    rows = []
    for other in registry.with_capability(endpoint.capability):
        if other.id == endpoint.id or not other.is_live:
            continue
        provider = registry.provider_of(other)
        tier = offer_tier(provider, other, creds, settings)
        rows.append({"id": other.id, "price_micro": other.price.list_micro,
                     "tier": tier or needed_tier(provider, other), "callable": tier is not None})
    # cheapest first; among equals, what the caller can call now first, then by id (stable)
    rows.sort(key=lambda r: (r["price_micro"], not r["callable"], r["id"]))
    return rows
