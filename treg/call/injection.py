"""Injection plans: which injector writes each of a target's bindings, and whether one needs the JSON
body, decided once when the bindings load instead of on every call.

Compiled for an org's tools when the tools cache loads them (``ToolRef.plan``, dropped with the entry on
any change of the org) and for a catalog provider's auth once per provider (``provider_plan``): a plan
depends only on each binding's location, not on which secret or platform key fills it, so the team and
platform tiers share their provider's. The values themselves are never part of a plan: the relay looks
them up per call (``treg/call/relay.py``: decrypted once per cached secrets entry)."""

from __future__ import annotations

from typing import Mapping, NamedTuple

from treg.bindings import Binding, Injector
from treg.catalog.model import Provider
from treg.context import Services


class InjectionPlan(NamedTuple):
    #: per binding, in order: its injector, or None when no loaded plugin serves its location any more
    #: (the call then fails closed, ``injector_missing``)
    injectors: tuple[Injector | None, ...]
    needs_json: bool
    #: a binding names an OAuth connection: its token is fetched (refreshed if due) before injecting
    connections: bool = False


EMPTY = InjectionPlan((), False)


def compile_plan(injectors: Mapping[str, Injector], bindings: tuple[Binding, ...]) -> InjectionPlan:
    if not bindings:
        return EMPTY
    found = tuple(injectors.get(b.location) for b in bindings)
    return InjectionPlan(found, any(i is not None and i.needs_json_body for i in found),
                         any(b.connection_id for b in bindings))


def provider_plan(svc: Services, provider: Provider) -> InjectionPlan:
    """The plan of a provider's auth bindings (the team and platform tiers fill them), compiled once."""
    memo = svc.provider_plans
    found = memo.get(provider.id)
    if found is None or found[0] is not provider.auth:  # held: no other tuple can take its place
        found = memo.put(provider.id, (provider.auth, compile_plan(svc.injectors, provider.auth)))
    return found[1]
