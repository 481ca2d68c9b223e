"""The credential ladder of a catalog call: own tool → team credential → anonymous → platform key.

Pure: what the org holds comes in as an :class:`~treg.catalog.tiers.OrgCredentials`, read by
:func:`treg.org_data.load_org_credentials` from the same per-org caches the resolver reads (the org's
tools and secret rows, LISTEN/NOTIFY-invalidated), so a catalog call on a warm cache costs no query and a
secret's change is seen on the next call; the tier choice is unit-testable and the listing routes can
show each endpoint's tier without re-reading per endpoint.

Tiers (catalog.md "Credential tiers", tried in this order):

* ``own``: a tool the caller may use whose binding uses a secret with ``provider`` = the endpoint's
  provider; the call goes to the endpoint's URL with that tool's bindings. Several such tools: the
  first by name (a deterministic choice the org can see in its tool list).
* ``team``: the org's newest secret with that ``provider``, injected with the provider's ``auth``.
* ``anonymous``: an endpoint declared ``platform_auth: "anonymous"`` of a provider listed in
  ``TREG_ANONYMOUS_PROVIDERS``: no credential injected, free. Free beats paid, so before ``platform``.
* ``platform``: the deployment's key ``TREG_PLATFORM_KEY_<PROVIDER>``, injected with the provider's
  ``auth``; the only billed tier, and the only one that runs the tier-4 checks (``check_platform``,
  then the row's request guards: ``treg/catalog/guards.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from treg.bindings import Binding
from treg.catalog.alternatives import alternatives
from treg.catalog import guards as request_guards
from treg.catalog.enforce import CheckedRequest, QueryPairs, check_platform, check_request
from treg.catalog.errors import NoCredential
from treg.catalog.model import Endpoint, Provider, RateLimit, Tier, join_url
from treg.catalog.placeholders import fill_path
from treg.catalog.registry import CatalogRegistry
# the tier choice lives in tiers.py (alternatives needs it too, and is imported here); its names stay
# importable from this module, as callers and plugins have used them
from treg.catalog.tiers import (OrgCredentials, OwnTool, how_to_get_credential, needed_tier,  # noqa: F401
                                offer_tier, platform_key_configured)
from treg.errors import GatewayFailed
from treg.settings import Settings


@dataclass(frozen=True)
class CatalogTarget:
    """Where and how one catalog call goes, decided before any money or upstream I/O."""

    tier: Tier
    endpoint: Endpoint
    provider: Provider
    #: the full upstream URL: approved root + path with placeholders encoded (+ the template's fixed query,
    #: if it has one); ``query`` is appended to it
    upstream_url: str
    #: the caller's raw query pairs to relay (path slots removed; encoding, order, duplicates kept)
    query: tuple[tuple[str, str | None], ...]
    #: credentials to inject: the own tool's bindings, the provider auth with the team ``secret_id`` or the
    #: ``platform_setting``; empty for anonymous
    bindings: tuple[Binding, ...]
    #: the provider's constant headers, set on every tier (overwriting a caller's value)
    required_headers: tuple[tuple[str, str], ...]
    #: True on the platform tier only: a hold for ``hold_micro`` (when > 0) and settlement follow
    billed: bool
    #: the catalog price of this call (flat, usage estimate, or the chosen table row), whatever the tier
    price_micro: int
    #: what to reserve: ``price_micro`` when billed, else 0 (a 0 places no hold)
    hold_micro: int
    #: the table price row chosen by the body (platform tier, table prices), for settlement
    table_value: str | None = None
    tool_id: str | None = None
    tool_name: str | None = None
    secret_id: str | None = None
    #: the provider's rate limit; the pipeline smooths platform-tier calls with it
    rate_limit: RateLimit | None = None
    #: the parsed JSON body when a check read it (body_allowlist, platform checks), else None
    json_body: Mapping[str, Any] | None = None
    #: the OAuth connection whose token the provider's auth injects (own or team tier), else None
    connection_id: str | None = None
    #: what the row's request guards add on the platform tier (treg.catalog.guards.Applied): the defaults
    #: of missing parameters, already in ``query`` and ``json_body``; the body to send when one was added
    guarded: request_guards.Applied = request_guards.NOTHING

    @property
    def scope_idempotency_key(self) -> bool:
        """Rewrite a caller's Idempotency-Key to a digest of (org, label): one shared provider account."""
        return self.tier == "platform"

    @property
    def spooled_response(self) -> bool:
        return self.endpoint.spooled_response

    def settle_micro(self, answer: Any) -> int:
        """The observed price of a 2xx answer (``answer``: its parsed JSON, or None)."""
        return self.endpoint.price.observed_micro(answer, self.table_value)


def plan_call(registry: CatalogRegistry, endpoint: Endpoint, checked: CheckedRequest, creds: OrgCredentials,
              settings: Settings, *, body: bytes | None = None) -> CatalogTarget:
    """Choose the tier and build the target of a live ``endpoint`` whose request passed
    :func:`check_request`. Raises ``NoCredential`` (404, with alternatives), ``InvalidParameters``
    (tier-4 checks), ``GatewayFailed`` (502, a catalog host that is not approved)."""
    provider = registry.provider_of(endpoint)
    tier = offer_tier(provider, endpoint, creds, settings)
    if tier is None:
        raise NoCredential(f"no credential can call {endpoint.id}: {how_to_get_credential(provider, endpoint)}",
                           refused_by="credential",
                           alternatives=alternatives(registry, endpoint, settings, creds),
                           provider=provider.id)
    root = registry.root_url(endpoint)
    if endpoint.host is not None and endpoint.host not in provider.catalog_hosts:
        # load refuses this; checked again because a credential must never follow a host of the data's choice
        raise GatewayFailed(f"{endpoint.id} targets a host the provider did not approve", code="catalog_host_refused",
                            blame="treg")
    upstream_url = join_url(root, fill_path(endpoint.path, checked.path_values))

    tool: OwnTool | None = None
    secret_id = None
    table_value = None
    json_body = checked.json_body
    connection_id = None
    guarded = request_guards.NOTHING  # own and team: the account is the team's, neither guarded nor defaulted
    if tier == "own" and (connection_id := creds.own_connection_for(provider.id)) and provider.auth:
        # within a tier the newest connection wins, then the newest secret (docs/oauth.md)
        bindings = tuple(dataclasses.replace(b, connection_id=connection_id) for b in provider.auth)
    elif tier == "own":
        tool = creds.own_for(provider.id)[0]
        bindings = tool.bindings
    elif tier == "team" and (connection_id := creds.team_connection_for(provider.id)):
        bindings = tuple(dataclasses.replace(b, connection_id=connection_id) for b in provider.auth)
    elif tier == "team":
        secret_id = creds.team_secret_for(provider.id)
        bindings = tuple(dataclasses.replace(b, secret_id=secret_id) for b in provider.auth)
    elif tier == "anonymous":
        bindings = ()
    else:
        pc = check_platform(endpoint, checked, body)
        table_value, json_body = pc.table_value, pc.json_body
        # treg's own key: the row's integer ranges refused, its defaults sent (before any hold)
        guarded = request_guards.apply(endpoint.guards, checked.query, body, json_body)
        if guarded.body_fields:
            json_body = MappingProxyType({**(json_body or {}), **guarded.body_fields})
        bindings = tuple(dataclasses.replace(b, platform_setting=provider.platform_setting) for b in provider.auth)
    billed = tier == "platform"
    price = endpoint.price.estimate_for(table_value)
    return CatalogTarget(
        tier=tier, endpoint=endpoint, provider=provider, upstream_url=upstream_url,
        query=checked.query + guarded.query,
        bindings=bindings, required_headers=provider.required_headers, billed=billed, price_micro=price,
        hold_micro=price if billed else 0, table_value=table_value, tool_id=tool.id if tool else None,
        tool_name=tool.name if tool else None, secret_id=secret_id, rate_limit=provider.rate_limit,
        json_body=json_body, connection_id=connection_id, guarded=guarded)


def prepare_call(registry: CatalogRegistry, endpoint: Endpoint, *, method: str, query: QueryPairs,
                 body: bytes | None, creds: OrgCredentials, settings: Settings,
                 surface: str = "/catalog/call") -> CatalogTarget:
    """:func:`check_request` then :func:`plan_call`, for a live endpoint (see :func:`treg.catalog.lookup.ensure_live`)."""
    checked = check_request(endpoint, method=method, query=query, body=body, surface=surface)
    return plan_call(registry, endpoint, checked, creds, settings, body=body)
