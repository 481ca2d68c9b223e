"""The endpoint catalog: provider plugins' endpoints, validated at startup, and the pure stages a
catalog call runs through before any money or upstream I/O. Nothing here reads the database: what
the caller's org holds comes in (``treg/org_data.py``), so every layer above can use the catalog.

The call pipeline uses it in this order (each step raises a :class:`~treg.errors.TregError`)::

    registry = svc.catalog                                   # built by the app factory
    ep = lookup.resolve_catalog_call(registry, rest)         # /catalog/call/<rest>
    # or: ep = lookup.resolve_named_miss(registry, rest)     # /call/<rest> after no org tool matched
    lookup.ensure_live(registry, ep, svc.settings)           # 410 for a tombstone
    checked = enforce.check_request(ep, method=..., query=raw_pairs, body=body_if_ep.needs_body)
    creds = await org_data.load_org_credentials(svc, ident, [ep.provider])  # the resolver's cached tools, secrets
    target = ladder.plan_call(registry, ep, checked, creds, svc.settings, body=body)
"""

from treg.catalog.errors import (CatalogError, CatalogPathNotAllowed, EndpointNotFound, EndpointRetired,
                                 InvalidParameters, MethodNotAllowed, NoCredential, Problem)
from treg.catalog.model import TIERS, Endpoint, Param, Price, Provider, RateLimit, Tier, UsageTerm
from treg.catalog.registry import CatalogRegistry

__all__ = [
    "CatalogError", "CatalogPathNotAllowed", "CatalogRegistry", "Endpoint", "EndpointNotFound", "EndpointRetired",
    "InvalidParameters", "MethodNotAllowed", "NoCredential", "Param", "Price", "Problem", "Provider", "RateLimit",
    "TIERS", "Tier", "UsageTerm",
]
