"""A catalog provider's injection plan (:class:`~treg.bindings.InjectionPlan`: which injector writes each
of its auth bindings), compiled once per provider and memoized on the services: the team and platform
tiers fill the same bindings, so they share it. An org's tools get theirs when the tools cache loads them
(``treg/org_data.py``)."""

from __future__ import annotations

from treg.bindings import InjectionPlan, compile_plan
from treg.catalog.model import Provider
from treg.context import Services


def provider_plan(svc: Services, provider: Provider) -> InjectionPlan:
    """The plan of a provider's auth bindings (the team and platform tiers fill them), compiled once."""
    memo = svc.provider_plans
    found = memo.get(provider.id)
    if found is None or found[0] is not provider.auth:  # held: no other tuple can take its place
        found = memo.put(provider.id, (provider.auth, compile_plan(svc.injectors, provider.auth)))
    return found[1]
