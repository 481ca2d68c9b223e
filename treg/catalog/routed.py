"""Routed endpoints: ``treg.<capability>``, generated for every capability with two or more live endpoints
(lifecycle.md "Routed endpoints"). Pure: built from the validated catalog each time it loads.

A routed endpoint is an :class:`~treg.catalog.model.Endpoint` of the reserved provider ``treg`` whose
``route`` is a :class:`RoutedPlan`: its children, **cheapest first**. Cheapest is read from the price
model as the listings show it (``Price.list_micro``: the flat price, the usage estimate, the cheapest
table row); equal list prices are ordered by the most a child's hold can reserve
(``Price.estimate_for(None)``: a table's dearest row), then by id, so the order is total and stable.
The order is the same for every caller; which child a caller gets first depends on its credentials
(``RoutedPlan.offer_tier``: the first child it has a tier for). Calling one is treg/call/routed.py.

Routed endpoints are listed (``registry.endpoints``, so the listing, detail, search and MCP see them)
but are not in ``registry.capabilities``: they are never an alternative to their own children, and a
routed endpoint is never the child of another.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from treg.catalog.errors import CatalogError, Problem
from treg.catalog.model import Endpoint, Param, Provider, Tier
from treg.catalog.registry import CatalogRegistry
from treg.catalog.tiers import OrgCredentials, how_to_get_credential, needed_tier, offer_tier
from treg.settings import Settings

#: the provider id of the generated endpoints (a plugin may not declare it)
ROUTED_PROVIDER = "treg"
#: what the provider row says its base URL is: routed endpoints have no upstream of their own
ROUTED_BASE_URL = "treg://routed"


def cheapest_key(ep: Endpoint) -> tuple[int, int, str]:
    """The children's order: list price, then the most a hold can reserve, then id."""
    return (ep.price.list_micro, ep.price.estimate_for(None), ep.id)


@dataclass(frozen=True)
class RoutedPlan:
    """A routed endpoint's children, cheapest first, each beside its provider."""

    capability: str
    children: tuple[tuple[Endpoint, Provider], ...]

    @property
    def child_ids(self) -> tuple[str, ...]:
        return tuple(ep.id for ep, _ in self.children)

    @property
    def provider_ids(self) -> frozenset[str]:
        return frozenset(p.id for _, p in self.children)

    def offer_tier(self, creds: OrgCredentials | None, settings: Settings) -> Tier | None:
        """The tier of the child that would be tried first (None: the caller has a tier for no child)."""
        for ep, provider in self.children:
            tier = offer_tier(provider, ep, creds, settings)
            if tier is not None:
                return tier
        return None

    def needed_tier(self) -> Tier:
        ep, provider = self.children[0]
        return needed_tier(provider, ep)

    def how_to_get_credential(self) -> str:
        ep, provider = self.children[0]
        return (f"a credential for any child of treg.{self.capability} will do ({', '.join(self.child_ids)}); "
                f"for the cheapest: {how_to_get_credential(provider, ep)}")

    def summary_json(self) -> list[dict[str, Any]]:
        """The children as every listing shows them (no caller known)."""
        return [{"id": ep.id, "provider": ep.provider, "price_micro": ep.price.list_micro} for ep, _ in self.children]

    def children_json(self, creds: OrgCredentials | None, settings: Settings) -> list[dict[str, Any]]:
        """The children for one caller: the tier each would get (or what it needs), in the order tried."""
        rows = []
        for ep, provider in self.children:
            tier = offer_tier(provider, ep, creds, settings)
            rows.append({"id": ep.id, "provider": ep.provider, "price_micro": ep.price.list_micro,
                         "tier": tier or needed_tier(provider, ep), "callable": tier is not None})
        return rows


def _shared_params(children: tuple[Endpoint, ...]) -> tuple[Param, ...]:
    """The parameters every child declares (same name and place), as the cheapest declares them; a
    parameter some child requires is shown required. Each child still checks the request its own way."""
    first = children[0]
    out = []
    for p in first.params:
        same = [c.param(p.name, p.location) for c in children]
        if all(s is not None for s in same):
            required = any(s.required for s in same if s is not None)
            out.append(p if p.required == required else replace(p, required=required))
    return tuple(out)


def _routed_endpoint(capability: str, children: tuple[tuple[Endpoint, Provider], ...]) -> Endpoint:
    eps = tuple(ep for ep, _ in children)
    cheapest = eps[0]
    methods = {ep.method for ep in eps}
    return Endpoint(
        id=f"{ROUTED_PROVIDER}.{capability}", provider=ROUTED_PROVIDER,
        # one method when the children agree; else the cheapest's (a child refusing the method passes on)
        method=cheapest.method if len(methods) > 1 else methods.pop(),
        path="", params=_shared_params(eps), price=cheapest.price, capability=capability,
        description=(f"Routed {capability}: tries {', '.join(ep.id for ep in eps)} in this order (cheapest "
                     "first, skipping those you have no credential for) and answers with the first success; "
                     "only the child that answered is charged"),
        plugin=ROUTED_PROVIDER, route=RoutedPlan(capability, children))


def _routable(ep: Endpoint) -> bool:
    """A live endpoint whose one answer is the whole result: an async submission (its money follows the
    job, not the answer) or a row acting on an owned object (its owner is the org that created it) would
    need the routed call to outlive its children, so neither is a child."""
    return ep.is_live and ep.async_job is None and ep.managed_resource is None


def with_routed(registry: CatalogRegistry) -> CatalogRegistry:
    """``registry`` plus its routed endpoints (the same registry when no capability has two live ones).
    A plugin declaring the provider ``treg`` stops startup, as any bad row does."""
    if ROUTED_PROVIDER in registry.providers:
        plugin = registry.providers[ROUTED_PROVIDER].plugin
        raise CatalogError([Problem(plugin, f"provider {ROUTED_PROVIDER!r}", "id",
                                    f"{ROUTED_PROVIDER!r} is reserved for treg's routed endpoints (treg.<capability>)")])
    routed = []
    for capability, ids in sorted(registry.capabilities.items()):
        live = sorted((registry.endpoints[i] for i in ids if _routable(registry.endpoints[i])), key=cheapest_key)
        if len(live) >= 2:
            routed.append(_routed_endpoint(capability, tuple((ep, registry.provider_of(ep)) for ep in live)))
    if not routed:
        return registry
    provider = Provider(id=ROUTED_PROVIDER, base_url=ROUTED_BASE_URL, auth=(),
                        endpoint_ids=tuple(ep.id for ep in routed), name="treg routed endpoints",
                        description="generated: one per capability with two or more live endpoints",
                        plugin=ROUTED_PROVIDER)
    providers = {**registry.providers, ROUTED_PROVIDER: provider}
    endpoints = {**registry.endpoints, **{ep.id: ep for ep in routed}}
    return CatalogRegistry(MappingProxyType(dict(sorted(providers.items()))),
                           MappingProxyType(dict(sorted(endpoints.items()))),
                           registry.capabilities)  # children only: see the module's docstring
