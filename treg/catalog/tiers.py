"""The pure tier choice of a catalog call: which credential tier a caller gets for an endpoint.

The tiers and their order are ladder.py's docstring (catalog.md "Credential tiers"). This module holds
only what the ladder, the capability alternatives and the search hints need (what the org holds, which
tier it gives, how to get one): no database, no I/O, so :mod:`treg.catalog.alternatives` and
:mod:`treg.catalog.search` need no import of the ladder (which imports both). What the org holds is read
by :func:`treg.org_data.load_org_credentials`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping

from treg.bindings import Binding
from treg.catalog.model import Endpoint, Provider, Tier
from treg.frozen import frozen_value
from treg.settings import Settings


@dataclass(frozen=True)
class OwnTool:
    """An org tool the caller may use, bound to a secret of some catalog provider."""

    id: str
    name: str
    bindings: tuple[Binding, ...]


#: no credential of a kind: one empty mapping shared by every ``OrgCredentials`` (it is read-only)
_NONE: Mapping[str, Any] = MappingProxyType({})


def _none() -> Mapping[str, Any]:
    return _NONE


@frozen_value
class OrgCredentials:
    """What the caller's org holds per provider (read once per call by :func:`treg.org_data.load_org_credentials`)."""

    org_id: str
    #: provider → the caller-usable tools bound to a secret of that provider, by name
    own_tools: Mapping[str, tuple[OwnTool, ...]] = dataclasses.field(default_factory=_none)
    #: provider → the id of the org's newest secret with that provider
    team_secrets: Mapping[str, str] = dataclasses.field(default_factory=_none)
    #: provider → the caller's newest active OAuth connection there that is its own (unshared), and the
    #: org's newest shared one (docs/oauth.md): within a tier a connection wins over a secret
    own_connections: Mapping[str, str] = dataclasses.field(default_factory=_none)
    team_connections: Mapping[str, str] = dataclasses.field(default_factory=_none)

    def own_for(self, provider_id: str) -> tuple[OwnTool, ...]:
        return self.own_tools.get(provider_id, ())

    def team_secret_for(self, provider_id: str) -> str | None:
        return self.team_secrets.get(provider_id)

    def own_connection_for(self, provider_id: str) -> str | None:
        return self.own_connections.get(provider_id)

    def team_connection_for(self, provider_id: str) -> str | None:
        return self.team_connections.get(provider_id)


def platform_key_configured(provider: Provider, settings: Settings) -> bool:
    value = settings.platform_value(provider.platform_setting)
    return bool(value)


def offer_tier(provider: Provider, endpoint: Endpoint, creds: OrgCredentials | None,
               settings: Settings) -> Tier | None:
    """The tier this caller would get for ``endpoint`` (None: no credential). ``creds`` None: only what the
    settings decide (anonymous, platform) is considered."""
    if endpoint.route is not None:  # a generated treg.<capability>: the tier of the child tried first
        return endpoint.route.offer_tier(creds, settings)  # type: ignore[no-any-return]
    if creds is not None and (creds.own_for(provider.id) or (provider.auth and creds.own_connection_for(provider.id))):
        return "own"
    if creds is not None and provider.auth and (creds.team_connection_for(provider.id)
                                                or creds.team_secret_for(provider.id)):
        return "team"
    if endpoint.anonymous and provider.id in settings.anonymous_providers:
        return "anonymous"
    if not endpoint.platform_blocked and provider.auth and platform_key_configured(provider, settings):
        return "platform"
    return None


def needed_tier(provider: Provider, endpoint: Endpoint) -> Tier:
    """What a caller with no tier for ``endpoint`` would need: the team's credential when the provider
    takes a key, else the operator's anonymous allow-list (a keyless endpoint), else an own tool."""
    if endpoint.route is not None:
        return endpoint.route.needed_tier()  # type: ignore[no-any-return]
    if provider.auth:
        return "team"
    if endpoint.anonymous:
        return "anonymous"
    return "own"


def how_to_get_credential(provider: Provider, endpoint: Endpoint) -> str:
    if endpoint.route is not None:
        return endpoint.route.how_to_get_credential()  # type: ignore[no-any-return]
    ways = []
    if provider.oauth is not None and provider.auth:
        ways.append(f"connect an account: a person opens the connect_url of POST /api/v1/connections "
                    f"{{\"provider\": \"{provider.id}\"}}")
    if provider.auth:
        ways.append(f"add a secret with \"provider\": \"{provider.id}\" (POST /api/v1/secrets)")
    ways.append(f"register a tool bound to a secret with provider {provider.id!r}")
    if endpoint.anonymous:
        ways.append(f"ask the operator to list {provider.id!r} in TREG_ANONYMOUS_PROVIDERS (keyless, free)")
    if provider.auth and not endpoint.platform_blocked:
        ways.append(f"ask the operator for a platform key ({provider.platform_setting})")
    return "; ".join(ways[:-1]) + (", or " if len(ways) > 1 else "") + ways[-1]
