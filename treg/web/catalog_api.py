"""Catalog browsing routes (``/api/v1/catalog``): endpoints, their price, parameters and the credential
tier the caller would get. Thin: the work is in :mod:`treg.catalog`."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from treg import org_data
from treg.catalog import tiers
from treg.catalog.alternatives import alternatives
from treg.catalog.errors import EndpointNotFound
from treg.catalog.tiers import OrgCredentials
from treg.catalog.model import Endpoint
from treg.catalog.registry import CatalogRegistry
from treg.catalog import search
from treg.catalog.search import with_pointer
from treg.catalog.suggest import did_you_mean
from treg.call.overflow_stage import overflow_usability
from treg.context import Services
from treg.errors import BadRequest
from treg.web.api import identify
from treg.web.jsonio import json_response

routes = web.RouteTableDef()

_STATUSES = ("live", "retired", "broken")


def _tier_view(registry: CatalogRegistry, ep: Endpoint, creds: OrgCredentials, svc: Services) -> dict[str, Any]:
    provider = registry.provider_of(ep)
    tier = tiers.offer_tier(provider, ep, creds, svc.settings) if ep.is_live else None
    out: dict[str, Any] = {"credential_tier": tier, "callable": tier is not None,
                           "billed": tier == "platform"}
    if tier is None and ep.is_live:
        out["needs"] = tiers.needed_tier(provider, ep)
        out["how_to_get_credential"] = tiers.how_to_get_credential(provider, ep)
    if ep.route is not None:  # a routed endpoint's children, each with the tier this caller would get
        out["children"] = ep.route.children_json(creds, svc.settings)
    return out


@routes.get("/api/v1/catalog/endpoints")
async def list_endpoints(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    q = request.query
    status = q.get("status") or None
    if status is not None and status not in _STATUSES:
        raise BadRequest(f"status must be one of {', '.join(_STATUSES)}", code="invalid_filter")
    registry = svc.catalog
    words, provider = q.get("q") or None, q.get("provider") or None
    if words and status in (None, "live"):
        # by words, best match first (treg.catalog.search): what a not-found answer's hint links to
        found = [ep for ep in search.rank(registry, words, q.get("capability") or None, limit=len(registry))
                 if provider is None or ep.provider == provider]
    else:
        found = registry.search(provider=provider, capability=q.get("capability") or None, q=words, status=status)
    creds = await org_data.load_org_credentials(svc, ident, {ep.provider for ep in found}
                                              | {p for ep in found if ep.route for p in ep.route.provider_ids})
    # each row says how to call it: an agent reading a search needs no second request per endpoint
    usable = await overflow_usability(svc, ident, found)
    rows = [{**ep.summary_json(usable(ep.provider)), "params": [p.to_json() for p in ep.params],
             "example": f"{ep.method} {search.example_query(ep)}", **_tier_view(registry, ep, creds, svc)}
            for ep in found]
    # a search that found nothing says what to try next, as MCP's catalog_search does (one function)
    return json_response({"endpoints": rows, **(search.no_match(registry) if not rows else {})})


@routes.get("/api/v1/catalog/endpoints/{endpoint_id}")
async def get_endpoint(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    registry = svc.catalog
    endpoint_id = request.match_info["endpoint_id"]
    ep = registry.get(endpoint_id)
    if ep is None:
        raise with_pointer(registry, EndpointNotFound(endpoint_id, did_you_mean(registry, endpoint_id)), endpoint_id)
    alts_providers = {a.provider for a in registry.with_capability(ep.capability)} if ep.capability else set()
    creds = await org_data.load_org_credentials(svc, ident, {ep.provider} | alts_providers)
    body = ep.to_json((await overflow_usability(svc, ident, [ep]))(ep.provider))
    body.update(_tier_view(registry, ep, creds, svc))
    provider = registry.provider_of(ep)
    body["url"] = registry.template_url(ep)
    body["provider_name"] = provider.name
    body["required_headers"] = dict(provider.required_headers)
    body["alternatives"] = alternatives(registry, ep, svc.settings, creds)
    return json_response(body)


@routes.get("/api/v1/catalog/providers")
async def list_providers(request: web.Request) -> web.Response:
    svc, ident = await identify(request)
    registry = svc.catalog
    rows = []
    for provider in registry.providers.values():
        row = provider.to_json()
        row["platform_key_configured"] = tiers.platform_key_configured(provider, svc.settings)
        row["anonymous_allowed"] = provider.id in svc.settings.anonymous_providers
        rows.append(row)
    return json_response({"providers": rows})
