"""Generation of routed endpoints (treg/catalog/routed.py): pure, on catalogs built from plugin rows."""

from __future__ import annotations

from typing import Any

import pytest

from treg import plugins
from treg.catalog.errors import CatalogError
from treg.catalog.load import build_catalog
from treg.catalog.routed import ROUTED_PROVIDER
from treg.catalog.tiers import OrgCredentials, offer_tier
from treg.settings import SecretStr

INJECTORS = plugins.collect_injectors(plugins.create_manager())


def ep(eid: str, price: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return {"id": eid, "method": kw.pop("method", "GET"), "path": "/" + eid.split(".", 1)[1].replace(".", "/"),
            "params": kw.pop("params", [{"name": "q", "in": "query", "required": True}]), "price": price,
            "capability": "people.find", **kw}


def provider(pid: str, *endpoints: dict[str, Any]) -> dict[str, Any]:
    return {"id": pid, "base_url": f"https://{pid}.example",
            "auth": [{"location": "header", "name": "Authorization", "format": "Bearer {secret}"}],
            "endpoints": list(endpoints)}


def build(*providers: dict[str, Any]):
    return build_catalog([("test", list(providers))], INJECTORS)


def test_one_routed_endpoint_per_shared_capability_children_cheapest_first():
    reg = build(
        provider("alpha", ep("alpha.find", {"per_call_micro": 900}),
                 ep("alpha.old", {"per_call_micro": 1}, status="retired")),
        provider("beta", ep("beta.find", {"usage": [{"path": "n", "micro_per_unit": 1}], "estimate_micro": 300})),
        # a table price lists at its cheapest row; equal list prices: the smaller dearest row first
        provider("gamma", ep("gamma.find", {"table": {"field": "size", "prices": {"s": 300, "l": 5000}}},
                             params=[{"name": "q", "in": "query"}, {"name": "size", "in": "body"}], method="POST")),
        provider("delta", ep("delta.find", {"per_call_micro": 300}),
                 ep("delta.solo", {"per_call_micro": 5}, capability="solo.thing")),
    )
    routed = reg.get("treg.people.find")
    assert routed is not None and routed.provider == ROUTED_PROVIDER and routed.route is not None
    # 300 (hold 300: beta, delta by id), 300 (hold 5000: gamma), 900; retired alpha.old not a child
    assert routed.route.child_ids == ("beta.find", "delta.find", "gamma.find", "alpha.find")
    assert routed.price.list_micro == 300 and routed.method == "GET"  # the methods differ: the cheapest's
    # shared parameters only (size is gamma's alone); required where any child requires it
    assert [(p.name, p.required) for p in routed.params] == [("q", True)]
    assert reg.get("treg.solo.thing") is None  # one endpoint: nothing to route
    summary = routed.summary_json()
    assert summary["kind"] == "routed" and [c["id"] for c in summary["children"]][0] == "beta.find"
    assert reg.get("alpha.find").summary_json()["kind"] == "endpoint"
    # listed under provider treg, but never in the capability index (so never an alternative)
    assert reg.providers[ROUTED_PROVIDER].endpoint_ids == ("treg.people.find",)
    assert "treg.people.find" not in reg.capabilities["people.find"]
    assert list(reg.endpoints) == sorted(reg.endpoints) and list(reg.providers) == sorted(reg.providers)


def test_a_broken_sibling_does_not_make_a_route_and_no_route_adds_no_provider():
    reg = build(provider("alpha", ep("alpha.find", {"per_call_micro": 1})),
                provider("beta", ep("beta.find", {"per_call_micro": 1}, status="broken")))
    assert reg.get("treg.people.find") is None and ROUTED_PROVIDER not in reg.providers


def test_the_provider_id_treg_is_reserved():
    with pytest.raises(CatalogError) as info:
        build(provider("treg", ep("treg.find", {"per_call_micro": 1})))
    problem = info.value.problems[0]
    assert (problem.plugin, problem.field) == ("test", "id") and "reserved" in problem.message


def test_the_tier_of_a_routed_endpoint_is_its_first_usable_childs(make_settings_with_keys):
    reg = build(provider("alpha", ep("alpha.find", {"per_call_micro": 100})),
                provider("beta", ep("beta.find", {"per_call_micro": 200})))
    routed = reg.get("treg.people.find")
    treg = reg.providers[ROUTED_PROVIDER]
    nothing = make_settings_with_keys({})
    assert offer_tier(treg, routed, None, nothing) is None
    beta_key = make_settings_with_keys({"TREG_PLATFORM_KEY_BETA": SecretStr("k")})
    assert offer_tier(treg, routed, None, beta_key) == "platform"
    creds = OrgCredentials(org_id="o", team_secrets={"alpha": "sec_1"})
    assert offer_tier(treg, routed, creds, beta_key) == "team"
    assert [(c["id"], c["tier"], c["callable"]) for c in routed.route.children_json(creds, nothing)] == [
        ("alpha.find", "team", True), ("beta.find", "team", False)]


@pytest.fixture
def make_settings_with_keys(settings):
    return lambda keys: settings.replace(platform=keys)
