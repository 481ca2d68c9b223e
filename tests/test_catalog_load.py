"""Catalog validation at startup: every field of a bad row is named with its plugin and row."""

from __future__ import annotations

import copy
from typing import Any, Callable

import pytest

import treg
from treg import plugins
from treg.catalog.errors import CatalogError
from treg.catalog.load import build_catalog, check_root_url, load_catalog
from treg.errors import ConfigError
from treg.testing import (build_catalog_of as build, catalog_problems as problems_of,
                          contract_provider as acme, endpoint_row as get_ep)
from treg_plugins.injectors import HeaderInjector, JsonInjector, QueryInjector

INJECTORS = {"header": HeaderInjector(), "query": QueryInjector(), "json": JsonInjector()}


def test_the_contract_example_builds():
    reg = build(acme())
    ep = reg.get("acme.items.get")
    assert ep is not None and ep.provider == "acme" and ep.operation == "items.get"
    assert ep.slots == ("item_id",) and ep.price.list_micro == 2000 and ep.capability == "items.lookup"
    prov = reg.provider("acme")
    assert prov.required_headers == (("X-Api-Version", "2025-11-01"),)
    assert prov.platform_setting == "TREG_PLATFORM_KEY_ACME"
    assert prov.endpoint_ids == ("acme.items.get", "acme.items.create")
    assert reg.with_capability("items.lookup") == (ep,)
    assert ep.plugin == "acme-plugin"


def test_platform_setting_name_upper_cases_and_replaces_dashes():
    data = acme()
    data["id"] = "open-meteo"
    for ep in data["endpoints"]:
        ep["id"] = ep["id"].replace("acme.", "open-meteo.")
    assert build(data).provider("open-meteo").platform_setting == "TREG_PLATFORM_KEY_OPEN_METEO"


B = "provider 'acme'"
E = "endpoint 'acme.items.get'"
C = "endpoint 'acme.items.create'"

CASES: list[tuple[str, Callable[[dict[str, Any]], Any], str, str]] = [
    ("provider id upper-case", lambda d: d.update(id="Acme"), "provider #0", "id"),
    ("provider id with dot", lambda d: d.update(id="ac.me"), "provider #0", "id"),
    ("unknown provider key", lambda d: d.update(endpoint=[]), B, "endpoint"),
    ("provider name not a string", lambda d: d.update(name=3), B, "name"),
    ("base_url plain http", lambda d: d.update(base_url="http://api.acme.example"), B, "base_url"),
    ("base_url ftp", lambda d: d.update(base_url="ftp://api.acme.example"), B, "base_url"),
    ("base_url with a query", lambda d: d.update(base_url="https://api.acme.example/v1?x=1"), B, "base_url"),
    ("base_url with user-info", lambda d: d.update(base_url="https://u:p@api.acme.example"), B, "base_url"),
    ("base_url missing", lambda d: d.pop("base_url"), B, "base_url"),
    ("auth not a list", lambda d: d.update(auth={"location": "header"}), B, "auth"),
    ("auth unknown location", lambda d: d["auth"][0].update(location="cookie"), B, "auth[0].location"),
    ("auth foreign placeholder", lambda d: d["auth"][0].update(format="Bearer {token}"), B, "auth[0].format"),
    ("auth carries a secret id", lambda d: d["auth"][0].update(secret_id="sec_1"), B, "auth[0]"),
    ("auth header name invalid", lambda d: d["auth"][0].update(name="Bad Header"), B, "auth[0]"),
    ("auth aimed at an X-Treg header", lambda d: d["auth"][0].update(name="X-Treg-Key"), B, "auth[0]"),
    ("auth twice on one header", lambda d: d["auth"].append({"location": "header", "name": "authorization"}),
     B, "auth[1]"),
    ("auth empty secret_field", lambda d: d["auth"][0].update(secret_field=""), B, "auth[0].secret_field"),
    ("required header X-Treg-*", lambda d: d["required_headers"].update({"X-Treg-Foo": "1"}), B,
     "required_headers.X-Treg-Foo"),
    ("required header hop-by-hop", lambda d: d["required_headers"].update({"Content-Length": "1"}), B,
     "required_headers.Content-Length"),
    ("required header with CRLF", lambda d: d["required_headers"].update({"X-A": "1\r\nX-B: 2"}), B,
     "required_headers.X-A"),
    ("required header not a string", lambda d: d["required_headers"].update({"X-A": 1}), B, "required_headers.X-A"),
    ("required header also in auth", lambda d: d["required_headers"].update({"authorization": "x"}), B,
     "required_headers.authorization"),
    ("catalog host plain http", lambda d: d.update(catalog_hosts=["http://eu.acme.example"]), B, "catalog_hosts[0]"),
    ("catalog host twice", lambda d: d["catalog_hosts"].append("https://eu.api.acme.example/v1"), B,
     "catalog_hosts[1]"),
    ("catalog_hosts not a list", lambda d: d.update(catalog_hosts="https://eu.api.acme.example"), B,
     "catalog_hosts"),
    ("rate limit zero", lambda d: d.update(rate_limit={"limit": 0, "window_s": 60}), B, "rate_limit.limit"),
    ("rate limit window zero", lambda d: d.update(rate_limit={"limit": 1, "window_s": 0}), B, "rate_limit.window_s"),
    ("rate limit shape", lambda d: d.update(rate_limit={"per_minute": 5}), B, "rate_limit"),
    ("no endpoints", lambda d: d.update(endpoints=[]), B, "endpoints"),
    ("endpoint not a dict", lambda d: d.update(endpoints=["acme.x"]), "provider 'acme' endpoints[0]", ""),
    ("endpoint id of another provider", lambda d: get_ep(d).update(id="other.items.get"),
     "provider 'acme' endpoints[0]", "id"),
    ("endpoint id without operation", lambda d: get_ep(d).update(id="acme."), "provider 'acme' endpoints[0]", "id"),
    ("endpoint id with a slash", lambda d: get_ep(d).update(id="acme.items/get"), "provider 'acme' endpoints[0]",
     "id"),
    ("unknown endpoint key (typo)", lambda d: get_ep(d).update(strict_querry=True), E, "strict_querry"),
    ("method unknown", lambda d: get_ep(d).update(method="FETCH"), E, "method"),
    ("path without a leading slash", lambda d: get_ep(d).update(path="items/{item_id}"), E, "path"),
    ("path slot without a param", lambda d: get_ep(d).update(path="/items/{item_id}/{sub}"), E, "path"),
    ("path param without a slot", lambda d: get_ep(d)["params"].append({"name": "sub", "in": "path"}), E,
     "params.sub"),
    ("path with a space", lambda d: get_ep(d).update(path="/items/{item_id}/a b"), E, "path"),
    ("path with a stray %", lambda d: get_ep(d).update(path="/items/{item_id}/50%"), E, "path"),
    ("path with a dot-dot segment", lambda d: get_ep(d).update(path="/items/../{item_id}"), E, "path"),
    ("path with a lone brace", lambda d: get_ep(d).update(path="/items/{item_id}/{"), E, "path"),
    ("path slot in its query", lambda d: get_ep(d).update(path="/items/{item_id}?x={item_id}"), E, "path"),
    ("path param optional", lambda d: get_ep(d)["params"][0].update(required=False), E, "params.item_id.required"),
    ("param in a header", lambda d: get_ep(d)["params"][1].update({"in": "header"}), E, "params.fields.in"),
    ("param declared twice", lambda d: get_ep(d)["params"].append({"name": "fields", "in": "query"}), E,
     "params.fields"),
    ("param without a name", lambda d: get_ep(d)["params"].append({"in": "query"}), E, "params[2].name"),
    ("unknown param key", lambda d: get_ep(d)["params"][1].update(default="id"), E, "params.fields.default"),
    ("body param on a GET", lambda d: get_ep(d)["params"].append({"name": "x", "in": "body"}), E, "params.x"),
    ("enum empty", lambda d: get_ep(d)["params"][1].update(enum=[]), E, "params.fields.enum"),
    ("query enum of numbers", lambda d: get_ep(d)["params"][1].update(enum=[1, 2]), E, "params.fields.enum"),
    ("enum value twice", lambda d: get_ep(d)["params"][1].update(enum=["id", "id"]), E, "params.fields.enum"),
    ("enum not of its type", lambda d: get_ep(d)["params"][1].update(type="integer"), E, "params.fields.enum"),
    ("type unknown", lambda d: get_ep(d)["params"][1].update(type="date"), E, "params.fields.type"),
    ("array type on a query param", lambda d: get_ep(d)["params"][1].update(type="array", enum=None), E,
     "params.fields.type"),
    ("min_items on a query param", lambda d: get_ep(d)["params"].append({"name": "ids", "in": "query",
                                                                        "min_items": 1}), E, "params.ids.min_items"),
    ("min_items above max_items", lambda d: get_ep(d, 1)["params"][1].update(min_items=5), C,
     "params.tags.min_items"),
    ("max_items negative", lambda d: get_ep(d, 1)["params"][1].update(max_items=-1), C, "params.tags.max_items"),
    ("required not a bool", lambda d: get_ep(d)["params"][1].update(required="yes"), E, "params.fields.required"),
    ("price missing", lambda d: get_ep(d).pop("price"), E, "price"),
    ("price of two forms", lambda d: get_ep(d).update(price={"per_call_micro": 1, "table": {}}), E, "price"),
    ("per-call price negative", lambda d: get_ep(d).update(price={"per_call_micro": -1}), E, "price.per_call_micro"),
    ("per-call price in dollars", lambda d: get_ep(d).update(price={"per_call_micro": 0.002}), E,
     "price.per_call_micro"),
    ("per-call price a bool", lambda d: get_ep(d).update(price={"per_call_micro": True}), E, "price.per_call_micro"),
    ("per-call price absurd", lambda d: get_ep(d).update(price={"per_call_micro": 10 ** 13}), E,
     "price.per_call_micro"),
    ("usage without an estimate", lambda d: get_ep(d).update(price={"usage": [{"path": "u", "micro_per_unit": 1}]}),
     E, "price"),
    ("usage estimate zero", lambda d: get_ep(d).update(price={"usage": [{"path": "u", "micro_per_unit": 1}],
                                                              "estimate_micro": 0}), E, "price.estimate_micro"),
    ("usage rate negative", lambda d: get_ep(d).update(price={"usage": [{"path": "u", "micro_per_unit": -1}],
                                                              "estimate_micro": 5}), E,
     "price.usage[0].micro_per_unit"),
    ("usage path not dotted", lambda d: get_ep(d).update(price={"usage": [{"path": "usage/total",
                                                                            "micro_per_unit": 1}],
                                                                 "estimate_micro": 5}), E, "price.usage[0].path"),
    ("usage empty", lambda d: get_ep(d).update(price={"usage": [], "estimate_micro": 5}), E, "price.usage"),
    ("table price on a GET", lambda d: get_ep(d).update(price={"table": {"field": "model", "prices": {"a": 1}}}), E,
     "price.table"),
    ("table price not whole", lambda d: get_ep(d, 1).update(price={"table": {"field": "name", "prices": {"a": 1.5}}}),
     C, "price.table.prices.a"),
    ("table price empty", lambda d: get_ep(d, 1).update(price={"table": {"field": "name", "prices": {}}}), C,
     "price.table.prices"),
    ("table field declared in the query",
     lambda d: (get_ep(d, 1)["params"].append({"name": "tier", "in": "query"}),
                get_ep(d, 1).update(price={"table": {"field": "tier", "prices": {"a": 1}}})), C, "price.table.field"),
    ("table field enum value unpriced",
     lambda d: (get_ep(d, 1)["params"][0].update(enum=["a", "b"]),
                get_ep(d, 1).update(price={"table": {"field": "name", "prices": {"a": 1}}})), C, "price.table.prices"),
    ("status unknown", lambda d: get_ep(d).update(status="dead"), E, "status"),
    ("capability with spaces", lambda d: get_ep(d).update(capability="Items Lookup"), E, "capability"),
    ("superseded_by unknown", lambda d: get_ep(d).update(status="retired", superseded_by="acme.items.fetch"), E,
     "superseded_by"),
    ("superseded_by itself", lambda d: get_ep(d).update(status="retired", superseded_by="acme.items.get"), E,
     "superseded_by"),
    ("superseded_by on a live row", lambda d: get_ep(d).update(superseded_by="acme.items.create"), E, "superseded_by"),
    ("status_note not a string", lambda d: get_ep(d).update(status_note=5), E, "status_note"),
    ("platform_auth unknown", lambda d: get_ep(d).update(platform_auth="public"), E, "platform_auth"),
    ("anonymous on a POST", lambda d: get_ep(d, 1).update(platform_auth="anonymous", price={"per_call_micro": 0}), C,
     "platform_auth"),
    ("anonymous but priced", lambda d: get_ep(d).update(platform_auth="anonymous"), E, "platform_auth"),
    ("strict_query not a bool", lambda d: get_ep(d).update(strict_query="yes"), E, "strict_query"),
    ("spooled_response not a bool", lambda d: get_ep(d).update(spooled_response=1), E, "spooled_response"),
    ("strict_query with body params", lambda d: get_ep(d, 1).update(strict_query=True), C, "strict_query"),
    ("body_allowlist on a GET", lambda d: get_ep(d).update(body_allowlist=True), E, "body_allowlist"),
    ("host not approved", lambda d: get_ep(d).update(host="https://evil.example/v1"), E, "host"),
]


@pytest.mark.parametrize("mutate,row,field", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_row_names_plugin_row_and_field(mutate, row, field):
    problems = problems_of(mutate)
    assert (problems[0].plugin, problems[0].row, problems[0].field) == ("acme-plugin", row, field), problems
    text = str(problems[0])
    assert "acme-plugin" in text and row in text and repr(field) in text


def test_every_problem_is_collected_and_the_detail_names_the_first():
    data = acme()
    data["rate_limit"] = {"limit": 0, "window_s": 60}
    data["endpoints"][0]["method"] = "FETCH"
    data["endpoints"][1]["price"] = {"per_call_micro": -5}
    with pytest.raises(CatalogError) as info:
        build(data)
    fields = [p.field for p in info.value.problems]
    assert fields == ["rate_limit.limit", "method", "price.per_call_micro"]
    assert isinstance(info.value, ConfigError) and info.value.code == "invalid_catalog"
    assert "rate_limit.limit" in info.value.detail and "2 more" in info.value.detail


def test_two_plugins_declaring_one_provider_stop_startup():
    with pytest.raises(CatalogError) as info:
        build_catalog([("first", [acme()]), ("second", [acme()])], INJECTORS)
    (problem,) = info.value.problems
    assert problem.plugin == "second" and problem.field == "id" and "'first'" in problem.message


def test_one_endpoint_id_twice_stops_startup():
    data = acme()
    data["endpoints"].append(copy.deepcopy(data["endpoints"][0]))
    problems = problems_of(lambda d: d.update(endpoints=data["endpoints"]))
    assert (problems[0].row, problems[0].field) == (E, "id") and "twice" in problems[0].message


def test_a_hook_returning_a_dict_instead_of_a_list_is_refused():
    with pytest.raises(CatalogError) as info:
        build_catalog([("p", acme())], INJECTORS)
    assert info.value.problems[0].row == "treg_register_providers"


def test_none_and_empty_results_add_nothing():
    reg = build_catalog([("a", None), ("b", []), ("c", [acme()])], INJECTORS)
    assert list(reg.providers) == ["acme"]


def test_forms_that_are_valid():
    data = acme()
    data["catalog_hosts"].append("http://127.0.0.1:8080/v2")  # loopback may be plain http (development)
    data["endpoints"][0]["host"] = "https://eu.api.acme.example/v1"
    data["endpoints"][1].update(
        price={"table": {"field": "name", "prices": {"small": 100, "large": 900}}}, body_allowlist=True)
    data["endpoints"].append({
        "id": "acme.chat", "method": "post", "path": "/chat?stream=false",
        "params": [{"name": "model", "in": "body", "enum": ["m1"]}],
        "price": {"usage": [{"path": "usage.in", "micro_per_unit": 0.15}, {"path": "usage.out", "micro_per_unit": 2}],
                  "estimate_micro": 300},
    })
    data["endpoints"].append({"id": "acme.old", "method": "GET", "path": "", "params": [], "price": {"per_call_micro": 0},
                              "status": "retired", "superseded_by": "acme.items.get", "platform_auth": "anonymous"})
    reg = build(data)
    assert reg.root_url(reg.get("acme.items.get")) == "https://eu.api.acme.example/v1"
    assert reg.template_url(reg.get("acme.items.get")) == "https://eu.api.acme.example/v1/items/{item_id}"
    chat = reg.get("acme.chat")
    assert chat.method == "POST" and chat.price.kind == "usage" and chat.price.list_micro == 300
    assert reg.get("acme.items.create").price.estimate_for("large") == 900
    assert reg.template_url(reg.get("acme.old")) == "https://api.acme.example/v1"


@pytest.mark.parametrize("url,ok", [
    ("https://api.example.com", True), ("https://api.example.com/v1/", True), ("http://127.0.0.1:9/x", True),
    ("http://localhost:9", True), ("http://[::1]:9", True), ("http://api.example.com", False),
    ("https://api.example.com/a b", False), ("https://api.example.com#x", False), ("https://", False),
    ("https://api.example.com:99999", False), ("https://api.example.com/%zz", False),
])
def test_root_urls(url, ok):
    assert (check_root_url(url) is None) == ok


class BadProviderPlugin:
    @treg.hookimpl
    def treg_register_providers(self):
        data = acme()
        data["endpoints"][0]["price"] = {"per_call_micro": "free"}
        return [data]


class RaisingPlugin:
    @treg.hookimpl
    def treg_register_providers(self):
        raise RuntimeError("boom")


def test_the_app_refuses_to_build_with_a_bad_row(make_app):
    with pytest.raises(CatalogError) as info:
        make_app(extra_plugins=(BadProviderPlugin(),))
    problem = info.value.problems[0]
    assert "BadProviderPlugin" in problem.plugin and problem.row == E and problem.field == "price.per_call_micro"
    assert "BadProviderPlugin" in info.value.detail


def test_a_plugin_whose_hook_raises_is_named():
    pm = plugins.create_manager(None, extra=(RaisingPlugin(),))
    with pytest.raises(CatalogError) as info:
        load_catalog(pm, plugins.collect_injectors(pm))
    assert "RaisingPlugin" in info.value.problems[0].plugin and "boom" in info.value.problems[0].message


def test_the_built_in_providers_load_through_entry_points():
    pm = plugins.create_manager(None)
    reg = load_catalog(pm, plugins.collect_injectors(pm))
    assert {"open-meteo", "openweathermap", "github", "openai", "anthropic"} <= set(reg.providers)
    assert reg.get("open-meteo.forecast").anonymous and reg.get("open-meteo.forecast").price.is_free
    assert reg.provider("github").required_headers == (("X-GitHub-Api-Version", "2022-11-28"),)
    edits = reg.get("openai.edits.create")
    assert edits.status == "retired" and edits.superseded_by == "openai.chat.completions.create"
    assert reg.get("openai.images.generate").price.kind == "table"
    assert reg.get("open-meteo.geocoding.search").host == "https://geocoding-api.open-meteo.com/v1"
    sources = {impl.plugin_name for impl in pm.impls("treg_register_providers")}
    assert {"providers-github", "providers-llm", "providers-weather"} <= sources


def test_unknown_anonymous_providers_are_logged_not_refused(caplog):
    from treg.catalog.load import warn_unknown_anonymous
    from treg.settings import Settings

    data = acme()
    data["endpoints"][0].update(price={"per_call_micro": 0}, platform_auth="anonymous")
    reg = build(data)
    assert warn_unknown_anonymous(reg, Settings(anonymous_providers=("acme",))) == []
    assert warn_unknown_anonymous(reg, Settings(anonymous_providers=("acme", "ghost"))) == ["ghost"]
    assert "ghost" in caplog.text
    plain = build(acme())
    assert warn_unknown_anonymous(plain, Settings(anonymous_providers=("acme",))) == ["acme"]
