"""Pure catalog stages: placeholder encoding, request checks, prices, lookups, alternatives, tier choice."""

from __future__ import annotations

import json
from typing import Any

import pytest

from treg.catalog import enforce, ladder, lookup
from treg.catalog.alternatives import alternatives
from treg.catalog.errors import (CatalogPathNotAllowed, EndpointNotFound, EndpointRetired, InvalidParameters,
                                 MethodNotAllowed, NoCredential)
from treg.catalog.load import build_catalog
from treg.catalog.placeholders import decode_query_value, encode_segment, fill_path
from treg.catalog.suggest import did_you_mean, near_tools
from treg.bindings import Binding
from treg.errors import GatewayFailed
from treg.settings import SecretStr, Settings
from treg_plugins.injectors import HeaderInjector, JsonInjector, QueryInjector

INJECTORS = {"header": HeaderInjector(), "query": QueryInjector(), "json": JsonInjector()}
FREE = {"per_call_micro": 0}


def catalog():
    acme = {
        "id": "acme", "base_url": "https://api.acme.example/v1",
        "auth": [{"location": "header", "name": "Authorization", "format": "Bearer {secret}"}],
        "required_headers": {"X-Api-Version": "2025-11-01"},
        "catalog_hosts": ["https://eu.api.acme.example/v1"],
        "rate_limit": {"limit": 120, "window_s": 60},
        "endpoints": [
            {"id": "acme.items.get", "method": "GET", "path": "/items/{item_id}",
             "params": [{"name": "item_id", "in": "path"}, {"name": "fields", "in": "query", "enum": ["id", "all"]}],
             "price": {"per_call_micro": 2000}, "capability": "items.lookup"},
            {"id": "acme.items.list", "method": "GET", "path": "/items",
             "params": [{"name": "q", "in": "query", "required": True}, {"name": "limit", "in": "query",
                                                                         "type": "integer"}],
             "price": {"per_call_micro": 1000}, "strict_query": True},
            {"id": "acme.sites.get", "method": "GET", "path": "/sites/{site}/owners/{owner}",
             "params": [{"name": "site", "in": "path"}, {"name": "owner", "in": "path"}],
             "price": FREE, "host": "https://eu.api.acme.example/v1"},
            {"id": "acme.items.create", "method": "POST", "path": "/items",
             "params": [{"name": "name", "in": "body", "required": True, "type": "string"},
                        {"name": "kind", "in": "body", "enum": ["a", "b", 3, True]},
                        {"name": "tags", "in": "body", "min_items": 1, "max_items": 2, "item_enum": ["x", "y"]},
                        {"name": "meta", "in": "body", "type": "object"}],
             "price": {"per_call_micro": 500}, "body_allowlist": True},
            {"id": "acme.images.make", "method": "POST", "path": "/images",
             "params": [{"name": "model", "in": "body", "required": True, "enum": ["m1"]},
                        {"name": "size", "in": "body", "enum": ["small", "large"]}],
             "price": {"table": {"field": "size", "prices": {"small": 100, "large": 900}}},
             "capability": "image.make"},
            {"id": "acme.chat", "method": "POST", "path": "/chat",
             "params": [{"name": "model", "in": "body", "required": True, "enum": ["cheap"]}],
             "price": {"usage": [{"path": "usage.in", "micro_per_unit": 0.15},
                                 {"path": "usage.out", "micro_per_unit": 2}], "estimate_micro": 3000}},
            {"id": "acme.weather", "method": "GET", "path": "/weather", "params": [], "price": FREE,
             "platform_auth": "anonymous", "capability": "weather"},
            {"id": "acme.old", "method": "GET", "path": "/old", "params": [], "price": FREE, "status": "retired",
             "status_note": "gone since 2024", "superseded_by": "acme.items.get", "capability": "items.lookup"},
            {"id": "acme.broken", "method": "GET", "path": "/b", "params": [], "price": FREE, "status": "broken",
             "capability": "items.lookup"},
            {"id": "acme.write", "method": "PUT", "path": "/w", "params": [], "price": {"per_call_micro": 10},
             "platform_blocked": True},
        ],
    }
    beta = {
        "id": "beta", "base_url": "https://beta.example", "auth": [{"location": "query", "name": "key"}],
        "endpoints": [
            {"id": "beta.lookup", "method": "GET", "path": "/l", "params": [], "price": {"per_call_micro": 1500},
             "capability": "items.lookup"},
            {"id": "beta.lookup-pricey", "method": "GET", "path": "/p", "params": [], "price": {"per_call_micro": 9000},
             "capability": "items.lookup"},
            {"id": "beta.lookup-down", "method": "GET", "path": "/d", "params": [], "price": FREE, "status": "broken",
             "capability": "items.lookup"},
        ],
    }
    keyless = {
        "id": "keyless", "base_url": "https://keyless.example", "auth": [],
        "endpoints": [{"id": "keyless.lookup", "method": "GET", "path": "/k", "params": [], "price": FREE,
                       "platform_auth": "anonymous", "capability": "items.lookup"}],
    }
    return build_catalog([("test", [acme, beta, keyless])], INJECTORS)


REG = catalog()


def ep(eid: str):
    e = REG.get(eid)
    assert e is not None
    return e


# -- placeholders --------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw,encoded", [
    ("7", "7"),
    ("sc-domain%3Aexample.com", "sc-domain%3Aexample.com"),   # decoded once → ':' → encoded back: %3A kept
    ("sc-domain%253Aexample.com", "sc-domain%3Aexample.com"),  # an already-encoded value: its %3A is kept
    ("sc-domain:example.com", "sc-domain%3Aexample.com"),
    ("a@b.c", "a@b.c"),                                        # @ literal (Tomba rejects %40)
    ("a%40b.c", "a@b.c"),
    ("a/b", "a%2Fb"),                                          # a value never adds a path segment
    ("a%2Fb", "a%2Fb"),
    ("a%252Fb", "a%2Fb"),
    ("a?b#c", "a%3Fb%23c"),
    ("a%3Fb%23c", "a%3Fb%23c"),
    ("100%25", "100%25"),                                      # a stray % (decoded once) is escaped
    ("100%2525", "100%25"),
    ("50%zz", "50%25zz"),                                      # an invalid escape: its % is escaped
    ("a+b", "a%20b"),                                          # form rules: + is a space
    ("a%2Bb", "a%2Bb"),
    ("caf%C3%A9", "caf%C3%A9"),
    ("café", "caf%C3%A9"),
    ("..", "%2E%2E"),                                          # no walking up the provider's path
    (".", "%2E"),
    ("...", "..."),
    ("a.b-c_d~e", "a.b-c_d~e"),
    ("x&y=z", "x%26y%3Dz"),
])
def test_placeholder_encoding(raw, encoded):
    assert encode_segment(decode_query_value(raw)) == encoded


def test_encoding_raw_bytes_that_are_not_utf8():
    assert encode_segment(decode_query_value("%FF%FE")) == "%FF%FE"
    assert encode_segment(b"%4") == "%254"


def test_fill_path():
    assert fill_path("/sites/{site}/owners/{owner}", {"site": "a%2Fb", "owner": "x@y"}) == "/sites/a%2Fb/owners/x@y"


# -- check_request ------------------------------------------------------------------------------------

def test_path_slots_come_from_the_query_and_leave_it():
    checked = enforce.check_request(ep("acme.items.get"), method="GET",
                                    query=[("fields", "all"), ("item_id", "7"), ("x", "1"), ("x", "2"), ("flag", None)])
    assert dict(checked.path_values) == {"item_id": "7"}
    assert checked.query == (("fields", "all"), ("x", "1"), ("x", "2"), ("flag", None))  # raw, order, duplicates


def test_other_query_pairs_keep_their_raw_encoding():
    checked = enforce.check_request(ep("acme.sites.get"), method="GET",
                                    query=[("site", "sc-domain%3Aexample.com"), ("owner", "a@b.c"), ("q", "a%2Fb+c")])
    assert dict(checked.path_values) == {"site": "sc-domain%3Aexample.com", "owner": "a@b.c"}
    assert checked.query == (("q", "a%2Fb+c"),)


def test_an_encoded_slot_name_still_names_the_slot():
    checked = enforce.check_request(ep("acme.items.get"), method="GET", query=[("item%5Fid", "7")])
    assert dict(checked.path_values) == {"item_id": "7"} and checked.query == ()


def refuse(exc_type=InvalidParameters, **kw: Any):
    with pytest.raises(exc_type) as info:
        enforce.check_request(**kw)
    return info.value


def test_a_missing_path_slot_names_it_and_the_query_form():
    err = refuse(endpoint=ep("acme.items.get"), method="GET", query=[])
    assert err.status == 400 and err.code == "invalid_parameters" and err.parameter == "item_id"
    assert "item_id" in err.detail and "/catalog/call/acme.items.get?item_id=<item_id>" in err.detail
    assert err.body()["parameter"] == "item_id" and err.blame == "caller"


def test_a_path_slot_given_twice_or_empty_is_refused():
    assert "2 times" in refuse(endpoint=ep("acme.items.get"), method="GET",
                               query=[("item_id", "1"), ("item_id", "2")]).detail
    assert "empty" in refuse(endpoint=ep("acme.items.get"), method="GET", query=[("item_id", "")]).detail
    assert "empty" in refuse(endpoint=ep("acme.items.get"), method="GET", query=[("item_id", None)]).detail


def test_enum_of_a_query_parameter_on_every_endpoint():
    err = refuse(endpoint=ep("acme.items.get"), method="GET", query=[("item_id", "1"), ("fields", "most")])
    assert err.parameter == "fields" and '"id", "all"' in err.detail
    enforce.check_request(ep("acme.items.get"), method="GET", query=[("item_id", "1"), ("fields", "id")])


def test_the_method_must_be_the_endpoints():
    err = refuse(MethodNotAllowed, endpoint=ep("acme.items.get"), method="POST", query=[("item_id", "1")])
    assert err.status == 405 and err.headers == {"Allow": "GET"}


def test_strict_query():
    e = ep("acme.items.list")
    enforce.check_request(e, method="GET", query=[("q", "x"), ("limit", "5")], body=b"")
    assert refuse(endpoint=e, method="GET", query=[]).parameter == "q"                       # required
    assert refuse(endpoint=e, method="GET", query=[("q", "x"), ("qq", "1")]).parameter == "qq"  # undeclared
    assert refuse(endpoint=e, method="GET", query=[("q", "x"), ("q", "y")]).parameter == "q"   # duplicate
    assert refuse(endpoint=e, method="GET", query=[("q", "x"), ("limit", "ten")]).parameter == "limit"  # type
    err = refuse(endpoint=e, method="GET", query=[("q", "x")], body=b'{"q": 1}')
    assert "no request body" in err.detail


def test_a_non_strict_endpoint_keeps_undeclared_parameters_and_duplicates():
    checked = enforce.check_request(ep("acme.items.get"), method="GET",
                                    query=[("item_id", "1"), ("other", "1"), ("other", "2")], body=b"anything")
    assert checked.query == (("other", "1"), ("other", "2")) and checked.json_body is None


def create(body: Any, raw: bytes | None = None):
    return enforce.check_request(ep("acme.items.create"), method="POST", query=[],
                                 body=raw if raw is not None else json.dumps(body).encode())


def test_body_allowlist_accepts_declared_fields():
    checked = create({"name": "n", "kind": 3, "tags": ["x", "y"], "meta": {"a": 1}})
    assert checked.json_body["kind"] == 3
    create({"name": "n", "kind": None})  # a null optional is absent


@pytest.mark.parametrize("body,parameter", [
    ({"name": "n", "extra": 1}, "extra"),          # undeclared top-level field
    ({}, "name"),                                  # missing required
    ({"name": None}, "name"),                      # null is missing
    ({"name": 5}, "name"),                         # type
    ({"name": "n", "kind": "c"}, "kind"),          # enum
    ({"name": "n", "kind": 1}, "kind"),            # True is not 1
    ({"name": "n", "kind": True, "meta": []}, "meta"),
    ({"name": "n", "tags": []}, "tags"),           # below min_items
    ({"name": "n", "tags": ["x", "y", "x"]}, "tags"),  # above max_items
    ({"name": "n", "tags": ["z"]}, "tags"),        # item enum
    ({"name": "n", "tags": "x"}, "tags"),          # not an array
])
def test_body_allowlist_refusals_name_the_parameter(body, parameter):
    with pytest.raises(InvalidParameters) as info:
        create(body)
    assert info.value.parameter == parameter and repr(parameter) in info.value.detail


@pytest.mark.parametrize("raw,fragment", [
    (b"[1]", "not a JSON list"), (b"not json", "does not parse"), (b'{"name": "a", "name": "b"}', "repeats"),
    (b'{"name": NaN}', "does not parse"),
])
def test_body_allowlist_needs_one_strict_json_object(raw, fragment):
    with pytest.raises(InvalidParameters) as info:
        create(None, raw)
    assert fragment in info.value.detail


def test_an_omitted_optional_array_is_allowed_and_an_empty_body_lacks_required_fields():
    create({"name": "n"})
    with pytest.raises(InvalidParameters):
        create(None, b"")


# -- check_platform (tier 4) --------------------------------------------------------------------------

def platform(eid: str, body: Any):
    e = ep(eid)
    raw = json.dumps(body).encode() if not isinstance(body, bytes) else body
    checked = enforce.check_request(e, method=e.method, query=[], body=raw)
    return enforce.check_platform(e, checked, raw)


def test_a_table_price_is_chosen_by_its_field():
    assert platform("acme.images.make", {"model": "m1", "size": "large"}).table_value == "large"
    for body in ({"model": "m1"}, {"model": "m1", "size": "huge"}, {"model": "m1", "size": 1}):
        with pytest.raises(InvalidParameters) as info:
            platform("acme.images.make", body)
        assert info.value.parameter == "size"


def test_a_singleton_enum_discriminator_must_equal_its_value_on_tier_4():
    with pytest.raises(InvalidParameters) as info:
        platform("acme.chat", {"model": "expensive"})
    assert info.value.parameter == "model" and '"cheap"' in info.value.detail
    with pytest.raises(InvalidParameters):
        platform("acme.chat", {})
    assert platform("acme.chat", {"model": "cheap", "anything": "else"}).table_value is None


def test_tier_4_refuses_duplicate_keys_that_could_disagree_with_the_provider():
    with pytest.raises(InvalidParameters) as info:
        platform("acme.chat", b'{"model": "cheap", "model": "expensive"}')
    assert "repeats" in info.value.detail


def test_own_tiers_do_not_run_the_tier_4_body_checks():
    e = ep("acme.chat")
    checked = enforce.check_request(e, method="POST", query=[], body=b'{"model": "expensive"}')
    assert checked.json_body is None  # faithful: not parsed, not refused


# -- prices ---------------------------------------------------------------------------------------------

def test_usage_price_settles_from_the_answer_rounded_up():
    price = ep("acme.chat").price
    assert price.observed_micro({"usage": {"in": 1000, "out": 10}}) == 170
    assert price.observed_micro({"usage": {"in": 1, "out": 0}}) == 1           # 0.15 rounds up
    assert price.observed_micro({"usage": {"in": 0, "out": 0}}) == 0
    assert price.observed_micro({"usage": {"in": 10}}) == 3000                 # missing term: the estimate
    assert price.observed_micro({"usage": {"in": -1, "out": 1}}) == 3000
    assert price.observed_micro({"usage": {"in": True, "out": 1}}) == 3000
    assert price.observed_micro("not an object") == 3000
    assert price.evidence_paths == ("usage.in", "usage.out") and price.estimate_for() == 3000


def test_flat_and_table_prices():
    assert ep("acme.items.get").price.observed_micro(None) == 2000
    table = ep("acme.images.make").price
    assert table.list_micro == 100 and table.estimate_for("large") == 900 and table.estimate_for(None) == 900
    assert table.observed_micro({}, "small") == 100
    assert table.to_json() == {"table": {"field": "size", "prices": {"small": 100, "large": 900}}}


# -- lookups --------------------------------------------------------------------------------------------

def test_catalog_call_accepts_exact_ids_only():
    assert lookup.resolve_catalog_call(REG, "acme.items.get") is ep("acme.items.get")
    with pytest.raises(EndpointNotFound) as info:
        lookup.resolve_catalog_call(REG, "acme.items.gett")
    assert info.value.status == 404 and info.value.body()["did_you_mean"][0] == "acme.items.get"


def test_a_catalog_id_with_a_path_is_a_400_naming_the_slots_and_the_query_form():
    with pytest.raises(CatalogPathNotAllowed) as info:
        lookup.resolve_named_miss(REG, "acme.sites.get/a/b")
    err = info.value
    assert err.status == 400 and err.code == "catalog_path_not_allowed"
    assert err.body()["slots"] == ["site", "owner"]
    assert err.body()["query_form"] == "/call/acme.sites.get?site=<site>&owner=<owner>"
    assert "site, owner" in err.detail
    with pytest.raises(CatalogPathNotAllowed) as info:
        lookup.resolve_catalog_call(REG, "acme.items.get/7")
    assert "/catalog/call/acme.items.get?item_id=<item_id>" in info.value.detail


def test_named_miss_fall_through():
    assert lookup.resolve_named_miss(REG, "acme.items.get") is ep("acme.items.get")
    assert lookup.resolve_named_miss(REG, "my-tool/path") is None
    assert lookup.resolve_named_miss(REG, "acme.nope/x") is None  # not a catalog id: the pipeline goes on


def test_final_dotted_lookup():
    err = lookup.named_miss_error(REG, "acme.itmes.get")
    assert err is not None and err.code == "endpoint_not_found" and "acme.items.get" in err.body()["did_you_mean"]
    assert lookup.named_miss_error(REG, "acme.zzzzzz") is not None         # its provider exists
    assert lookup.named_miss_error(REG, "nothing.like.it") is None         # not catalog-shaped
    assert lookup.named_miss_error(REG, "plain") is None
    assert lookup.named_miss_error(REG, "acme.items.get") is None          # it exists


def test_did_you_mean_is_provider_local():
    assert did_you_mean(REG, "acme.items") == ["acme.items.get", "acme.items.list", "acme.items.create"]
    assert "beta.lookup" not in did_you_mean(REG, "acme.lookup")
    assert did_you_mean(REG, "betta.lookup")[0] == "beta.lookup"      # a misspelt provider: its near twin
    assert "acme.old" not in did_you_mean(REG, "acme.olf")               # only live rows are suggested
    assert near_tools("google-analytics.report", ["google-analytics", "x"]) == ["google-analytics"]


def test_a_retired_endpoint_with_a_successor_is_a_410():
    with pytest.raises(EndpointRetired) as info:
        lookup.ensure_live(REG, ep("acme.old"), Settings())
    body = info.value.body()
    assert info.value.status == 410 and body["error"] == "endpoint_retired"
    assert body["status_note"] == "gone since 2024" and body["superseded_by"] == "acme.items.get"
    assert "alternatives" not in body and info.value.refused_by == "retired"


def test_a_broken_endpoint_without_a_successor_lists_alternatives():
    with pytest.raises(EndpointRetired) as info:
        lookup.ensure_live(REG, ep("acme.broken"), Settings())
    body = info.value.body()
    assert body["superseded_by"] is None and body["status_note"] is None
    assert [a["id"] for a in body["alternatives"]] == ["keyless.lookup", "beta.lookup", "acme.items.get",
                                                       "beta.lookup-pricey"]
    lookup.ensure_live(REG, ep("acme.items.get"), Settings())  # live: no refusal


# -- alternatives and tiers -----------------------------------------------------------------------------

KEYS = Settings(platform={"TREG_PLATFORM_KEY_BETA": SecretStr("k")}, anonymous_providers=("keyless", "acme"))


def test_alternatives_cheapest_first_with_the_tier_each_needs():
    alts = alternatives(REG, ep("acme.items.get"), KEYS)
    assert alts == [
        {"id": "keyless.lookup", "price_micro": 0, "tier": "anonymous", "callable": True},
        {"id": "beta.lookup", "price_micro": 1500, "tier": "platform", "callable": True},
        {"id": "beta.lookup-pricey", "price_micro": 9000, "tier": "platform", "callable": True},
    ]
    bare = alternatives(REG, ep("acme.items.get"), Settings())
    assert bare[0] == {"id": "keyless.lookup", "price_micro": 0, "tier": "anonymous", "callable": False}
    assert bare[1] == {"id": "beta.lookup", "price_micro": 1500, "tier": "team", "callable": False}
    creds = ladder.OrgCredentials(org_id="o", team_secrets={"beta": "sec_1"})
    assert alternatives(REG, ep("acme.items.get"), Settings(), creds)[1]["tier"] == "team"
    assert alternatives(REG, ep("acme.write"), KEYS) == []  # no capability: no alternatives


def own(provider: str) -> ladder.OrgCredentials:
    tool = ladder.OwnTool(id="tool_1", name="acme-tool",
                          bindings=(Binding(location="header", name="Authorization", format="Token {secret}",
                                            secret_id="sec_own"),))
    return ladder.OrgCredentials(org_id="o", own_tools={provider: (tool,)}, team_secrets={provider: "sec_team"})


def plan(eid: str, creds: ladder.OrgCredentials, settings: Settings, query=(), body: bytes | None = None):
    e = ep(eid)
    return ladder.prepare_call(REG, e, method=e.method, query=list(query), body=body, creds=creds, settings=settings)


def test_tier_order_own_team_anonymous_platform():
    s = Settings(platform={"TREG_PLATFORM_KEY_ACME": SecretStr("k")}, anonymous_providers=("acme",))
    none = ladder.OrgCredentials(org_id="o")
    team = ladder.OrgCredentials(org_id="o", team_secrets={"acme": "sec_team"})
    assert plan("acme.weather", own("acme"), s).tier == "own"
    assert plan("acme.weather", team, s).tier == "team"
    assert plan("acme.weather", none, s).tier == "anonymous"   # free beats paid
    assert plan("acme.items.get", none, s, [("item_id", "1")]).tier == "platform"
    with pytest.raises(NoCredential) as info:
        plan("acme.items.get", none, Settings(), [("item_id", "1")])
    err = info.value
    assert err.status == 404 and err.code == "no_credential"
    assert '"provider": "acme"' in err.detail and "TREG_PLATFORM_KEY_ACME" in err.detail
    assert [a["id"] for a in err.body()["alternatives"]] == ["keyless.lookup", "beta.lookup", "beta.lookup-pricey"]


def test_the_targets_of_each_tier():
    s = Settings(platform={"TREG_PLATFORM_KEY_ACME": SecretStr("k")})
    query = [("site", "sc-domain%3Aexample.com"), ("owner", "a@b.c"), ("x", "1")]
    t = plan("acme.sites.get", own("acme"), s, query)
    assert t.upstream_url == "https://eu.api.acme.example/v1/sites/sc-domain%3Aexample.com/owners/a@b.c"
    assert t.query == (("x", "1"),) and t.tool_id == "tool_1" and t.tool_name == "acme-tool"
    assert t.bindings[0].secret_id == "sec_own" and not t.billed and t.hold_micro == 0
    assert t.required_headers == (("X-Api-Version", "2025-11-01"),)  # every tier
    t = plan("acme.items.get", ladder.OrgCredentials(org_id="o", team_secrets={"acme": "sec_team"}), s,
             [("item_id", "a/b")])
    assert t.tier == "team" and t.upstream_url == "https://api.acme.example/v1/items/a%2Fb"
    assert t.bindings == (Binding(location="header", name="Authorization", format="Bearer {secret}",
                                  secret_id="sec_team"),)
    assert t.secret_id == "sec_team" and t.price_micro == 2000 and t.hold_micro == 0
    t = plan("acme.items.get", ladder.OrgCredentials(org_id="o"), s, [("item_id", "7")])
    assert t.tier == "platform" and t.billed and t.hold_micro == 2000 and t.scope_idempotency_key
    assert t.bindings == (Binding(location="header", name="Authorization", format="Bearer {secret}",
                                  platform_setting="TREG_PLATFORM_KEY_ACME"),)
    assert t.rate_limit is not None and t.rate_limit.limit == 120
    t = plan("acme.weather", ladder.OrgCredentials(org_id="o"), Settings(anonymous_providers=("acme",)))
    assert t.tier == "anonymous" and t.bindings == () and not t.billed and t.hold_micro == 0


def test_platform_tier_runs_the_tier_4_checks_and_prices_the_table_row():
    s = Settings(platform={"TREG_PLATFORM_KEY_ACME": SecretStr("k")})
    none = ladder.OrgCredentials(org_id="o")
    t = plan("acme.images.make", none, s, body=b'{"model": "m1", "size": "large"}')
    assert t.table_value == "large" and t.hold_micro == 900 and t.json_body["size"] == "large"
    assert t.settle_micro({"anything": 1}) == 900
    with pytest.raises(InvalidParameters):
        plan("acme.images.make", none, s, body=b'{"model": "m2", "size": "large"}')
    # the team's own key: the body is the team's business
    t = plan("acme.images.make", ladder.OrgCredentials(org_id="o", team_secrets={"acme": "s"}), s,
             body=b'{"model": "m2", "size": "huge"}')
    assert t.tier == "team" and t.table_value is None


def test_platform_blocked_and_keyless_providers_skip_tiers():
    s = Settings(platform={"TREG_PLATFORM_KEY_ACME": SecretStr("k"), "TREG_PLATFORM_KEY_KEYLESS": SecretStr("k")})
    with pytest.raises(NoCredential) as info:
        plan("acme.write", ladder.OrgCredentials(org_id="o"), s)
    assert "TREG_PLATFORM_KEY" not in info.value.detail  # BYOK only: the platform key is not suggested
    # a provider without auth: a team secret injects nothing, so it is not a tier
    creds = ladder.OrgCredentials(org_id="o", team_secrets={"keyless": "sec"})
    with pytest.raises(NoCredential) as info:
        plan("keyless.lookup", creds, s)
    assert "TREG_ANONYMOUS_PROVIDERS" in info.value.detail
    assert ladder.needed_tier(REG.provider("keyless"), ep("keyless.lookup")) == "anonymous"


def test_an_unapproved_host_never_receives_a_credential():
    import dataclasses

    rogue = dataclasses.replace(ep("acme.items.get"), host="https://evil.example")
    checked = enforce.check_request(rogue, method="GET", query=[("item_id", "1")])
    with pytest.raises(GatewayFailed) as info:
        ladder.plan_call(REG, rogue, checked, own("acme"), Settings())
    assert info.value.status == 502 and info.value.blame == "treg"


# -- the built-in providers on the ladder -------------------------------------------------------------------

def test_built_in_rows_on_each_tier():
    from treg import plugins
    from treg.catalog.load import load_catalog

    pm = plugins.create_manager(None)
    reg = load_catalog(pm, plugins.collect_injectors(pm))
    none = ladder.OrgCredentials(org_id="o")
    s = Settings(anonymous_providers=("open-meteo",), platform={"TREG_PLATFORM_KEY_GITHUB": SecretStr("k"),
                                                                "TREG_PLATFORM_KEY_OPENAI": SecretStr("k")})

    def go(eid, query=(), body=None):
        e = reg.get(eid)
        return ladder.prepare_call(reg, e, method=e.method, query=list(query), body=body, creds=none, settings=s)

    t = go("open-meteo.geocoding.search", [("name", "Berlin"), ("count", "1")])
    assert t.tier == "anonymous" and t.upstream_url == "https://geocoding-api.open-meteo.com/v1/search"
    with pytest.raises(InvalidParameters):  # strict_query: a typo is refused before anything is relayed
        go("open-meteo.geocoding.search", [("name", "Berlin"), ("cuont", "1")])
    t = go("github.repos.get", [("owner", "python"), ("repo", "cpython")])
    assert t.upstream_url == "https://api.github.com/repos/python/cpython" and t.hold_micro == 100
    assert t.required_headers == (("X-GitHub-Api-Version", "2022-11-28"),)
    assert t.bindings[0].render("k") == "Bearer k" and t.bindings[0].platform_setting == "TREG_PLATFORM_KEY_GITHUB"
    with pytest.raises(NoCredential):  # BYOK only
        go("github.issues.create", [("owner", "o"), ("repo", "r")], b'{"title": "t"}')
    chat = b'{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}'
    t = go("openai.chat.completions.create", body=chat)
    assert t.hold_micro == 20000
    assert t.settle_micro({"usage": {"prompt_tokens": 1000, "completion_tokens": 1000}}) == 750
    with pytest.raises(InvalidParameters) as info:
        go("openai.chat.completions.create", body=chat.replace(b"gpt-4o-mini", b"o1"))
    assert info.value.parameter == "model"
    t = go("openai.images.generate", body=b'{"model": "dall-e-3", "prompt": "a cat", "size": "1792x1024"}')
    assert t.hold_micro == 80000 and t.table_value == "1792x1024"
    with pytest.raises(EndpointRetired) as info:
        lookup.ensure_live(reg, reg.get("openai.edits.create"), s)
    assert info.value.body()["superseded_by"] == "openai.chat.completions.create"
