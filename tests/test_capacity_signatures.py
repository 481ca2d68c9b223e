"""Signature rows validated at startup, the pure classifier, the generic built-ins, a third-party plugin."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone

import pytest

from treg import hookimpl, plugins
from treg.app import create_app
from treg.capacity.classify import UNRECORDED_LOG, Signal, Unrecorded, classify, parse_reset
from treg.capacity.signatures import build_signatures, load_signatures
from treg.catalog.errors import CatalogError
from treg.catalog.load import load_catalog
from treg.overflow.aggregator import collect_aggregators

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=timezone.utc)
ACME = {"id": "acme", "base_url": "https://api.acme.test", "auth": [{"location": "header", "name": "X-Key"}],
        "endpoints": [{"id": "acme.items-get", "method": "GET", "path": "/items/{item_id}",
                       "params": [{"name": "item_id", "in": "path"}], "price": {"per_call_micro": 1000},
                       "overflow": [{"aggregator": "orthogonal", "api": "acme", "path": "/items/{item_id}",
                                     "price_micro": 12000},
                                    {"aggregator": "monid", "provider": "acme", "endpoint": "items-get",
                                     "price_micro": 15000}]}]}
CONTRACT_ROWS = [
    {"provider": "acme", "kind": "balance", "status": [402], "body_contains": "insufficient credits"},
    {"provider": "acme", "kind": "quota", "status": [429], "header": {"name": "x-quota", "equals": "daily"},
     "resets_at": {"header": "x-quota-reset", "format": "epoch"}},
    {"provider": "acme", "kind": "quota", "status": [403], "body_json": {"path": "error.code", "equals": "monthly_limit"}},
]


class AcmePlugin:
    @hookimpl
    def treg_register_providers(self):
        return [ACME]

    @hookimpl
    def treg_register_capacity_signatures(self):
        return CONTRACT_ROWS


@pytest.fixture(scope="module")
def registry():
    pm = plugins.create_manager(None, extra=[AcmePlugin()])
    catalog = load_catalog(pm, plugins.collect_injectors(pm))
    return load_signatures(pm, catalog), catalog


def test_contract_rows_classify(registry):
    reg, _ = registry
    sig = classify(reg, "acme", "acme.items-get", 402, {}, b'{"error": "Insufficient Credits left"}', NOW)
    assert isinstance(sig, Signal) and sig.kind == "balance" and sig.key == "acme" and sig.strikes
    reset = int((NOW + timedelta(hours=2)).timestamp())
    sig = classify(reg, "acme", "acme.items-get", 429, [("X-Quota", "daily"), ("X-Quota-Reset", str(reset))], b"", NOW)
    assert sig.kind == "quota" and sig.key == "acme.items-get" and sig.resets_at == NOW + timedelta(hours=2)
    sig = classify(reg, "acme", "acme.items-get", 403, {}, b'{"error": {"code": "monthly_limit"}}', NOW)
    assert sig.kind == "quota" and sig.resets_at is None
    assert classify(reg, "acme", "acme.items-get", 403, {}, b'{"error": {"code": "other"}}', NOW) is None
    assert classify(reg, "acme", "acme.items-get", 200, {}, b"insufficient credits", NOW) is None


def test_generic_burst_only_when_no_row_claims_and_retry_after_is_short(registry):
    reg, _ = registry
    burst = classify(reg, "acme", "acme.items-get", 429, {"Retry-After": "3"}, b"", NOW)
    assert burst.kind == "burst" and burst.key is None and burst.retry_after_s == 3 and not burst.strikes
    assert classify(reg, "acme", "acme.items-get", 429, {"Retry-After": "61"}, b"", NOW) is None
    assert classify(reg, "acme", "acme.items-get", 429, {}, b"", NOW) is None
    claimed = classify(reg, "acme", "acme.items-get", 429, {"Retry-After": "3", "x-quota": "daily"}, b"", NOW)
    assert claimed.kind == "quota"  # the provider's own row wins over the trylast generic one
    date = (NOW + timedelta(seconds=30)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    assert classify(reg, "other", None, 429, {"Retry-After": date}, b"", NOW).kind == "burst"


@pytest.mark.parametrize("headers,body", [
    ({"cf-mitigated": "challenge"}, b"<html>Just a moment</html>"),
    ({}, b'<html><div id="cf-error-details">Attention Required! | Cloudflare</div></html>'),
    ({}, b'{"type": "https://developers.cloudflare.com/support/troubleshooting/http-status-codes/cloudflare-1xxx-errors/'
         b'error-1020/", "title": "Error 1020: Access denied", "status": 403, "error_code": 1020}'),
])
def test_generic_edge_block(registry, headers, body):
    reg, _ = registry
    assert classify(reg, "acme", "acme.items-get", 403, headers, body, NOW).kind == "edge_block"


def test_unrecorded_tripwire(registry, caplog):
    reg, _ = registry
    out = classify(reg, "acme", "acme.items-get", 400, {}, b'{"message": "Your QUOTA is exhausted"}', NOW)
    assert isinstance(out, Unrecorded) and out.word == "quota" and out.kind == "unrecorded"
    with caplog.at_level(logging.WARNING):
        logging.getLogger("treg.test").warning(*out.log_args())
    assert UNRECORDED_LOG in caplog.text and "acme.items-get" in caplog.text
    assert classify(reg, "acme", "acme.items-get", 400, {}, b'{"message": "bad id"}', NOW) is None
    assert classify(reg, "acme", "acme.items-get", 500, {}, b"no credits", NOW) is None  # a 4xx only


def test_parse_reset_formats():
    assert parse_reset("120", "seconds", NOW) == NOW + timedelta(seconds=120)
    assert parse_reset(str(int(NOW.timestamp()) + 60), "epoch", NOW) == NOW + timedelta(seconds=60)
    assert parse_reset(str((int(NOW.timestamp()) + 60) * 1000), "epoch", NOW) == NOW + timedelta(seconds=60)
    assert parse_reset("Tue, 01 Dec 2026 11:00:00 GMT", "http-date", NOW) == NOW + timedelta(hours=1)
    assert parse_reset("soon", "epoch", NOW) is None
    assert parse_reset(str(int(NOW.timestamp()) - 5), "epoch", NOW) is None  # in the past


def test_bad_rows_stop_startup_naming_plugin_row_and_field(registry):
    _, catalog = registry
    bad = [{"provider": "nope", "kind": "balance", "status": [402]},
           {"provider": "acme", "kind": "empty", "status": [402]},
           {"provider": "acme", "kind": "quota", "status": [200]},
           {"provider": "acme", "kind": "quota", "status": [429], "resets_at": {"header": "x", "format": "iso"}},
           {"provider": "acme", "kind": "balance"},
           {"provider": "*", "kind": "balance", "status": [402]},
           {"provider": "acme", "kind": "burst", "status": [429], "colour": "red"}]
    with pytest.raises(CatalogError) as err:
        build_signatures([("vendorx", bad, False)], catalog)
    got = {(p.plugin, p.row.split(" ")[1], p.field) for p in err.value.problems}
    assert {("vendorx", "#0", "provider"), ("vendorx", "#1", "kind"), ("vendorx", "#2", "status"),
            ("vendorx", "#3", "resets_at.format"), ("vendorx", "#4", ""), ("vendorx", "#5", "kind"),
            ("vendorx", "#6", "colour")} <= got


def test_overflow_routes_are_validated_at_catalog_load():
    pm = plugins.create_manager(None)
    injectors = plugins.collect_injectors(pm)
    from treg.catalog.load import build_catalog

    row = {**ACME, "endpoints": [{**ACME["endpoints"][0], "overflow": [
        {"aggregator": "nowhere", "price_micro": 1},
        {"aggregator": "orthogonal", "path": "items", "price_micro": 1},
        {"aggregator": "monid", "provider": "acme", "price_micro": -1}]}]}
    with pytest.raises(CatalogError) as err:
        build_catalog([("p", [row])], injectors, collect_aggregators(pm))
    fields = {p.field for p in err.value.problems}
    assert {"overflow[0].aggregator", "overflow[1].api", "overflow[1].path", "overflow[2].price_micro"} <= fields


def test_listing_shows_the_first_usable_route(registry):
    _, catalog = registry
    ep = catalog.get("acme.items-get")
    assert (ep.to_json()["overflow_aggregator"], ep.to_json()["overflow_price_micro"]) == ("orthogonal", 12000)
    later = ep.summary_json(overflow_usable=lambda r: r.aggregator != "orthogonal")
    assert (later["overflow_aggregator"], later["overflow_price_micro"]) == ("monid", 15000)
    none = ep.summary_json(overflow_usable=lambda r: False)
    assert none["overflow_aggregator"] is None and none["overflow_price_micro"] is None


THIRD_PARTY = '''
from treg import hookimpl
from treg.overflow.aggregator import Aggregator, OverflowResult


class Relay(Aggregator):
    name = "relayco"
    default_url = "https://relay.example"

    def check_route(self, route):
        return [] if isinstance(route.get("slug"), str) else [("slug", "required")]

    async def run(self, session, *, base_url, key, route, call, poll_max_s):
        return OverflowResult(vendor_status=200, vendor_body={}, price_micro=route.price_micro)


@hookimpl
def treg_register_aggregators():
    return [Relay()]


@hookimpl
def treg_register_providers():
    return [{"id": "vendorz", "base_url": "https://api.vendorz.test", "auth": [{"location": "header", "name": "K"}],
             "endpoints": [{"id": "vendorz.get", "method": "GET", "path": "/get", "price": {"per_call_micro": 5},
                            "overflow": [{"aggregator": "relayco", "slug": "vz", "price_micro": 7}]}]}]


@hookimpl
def treg_register_capacity_signatures():
    return [{"provider": "vendorz", "kind": "balance", "status": [402], "body_contains": "top up"}]
'''


def test_a_plugin_dir_adds_a_signature_and_an_aggregator_without_a_core_edit(tmp_path, dsn):
    plugdir = tmp_path / "plugins"
    plugdir.mkdir()
    (plugdir / "vendorz.py").write_text(THIRD_PARTY)
    from treg import testing

    settings = testing.make_settings(tmp_path / "home", plugins_dir=plugdir)
    create_app(settings, dsn=dsn)  # startup validates the catalog (the route names relayco) and plugins
    pm = plugins.create_manager(plugdir)
    aggs = collect_aggregators(pm)
    catalog = load_catalog(pm, plugins.collect_injectors(pm), aggs)
    sigs = load_signatures(pm, catalog)
    assert "relayco" in aggs and {"orthogonal", "monid"} <= set(aggs)
    assert catalog.get("vendorz.get").overflow[0].get("slug") == "vz"
    assert classify(sigs, "vendorz", "vendorz.get", 402, {}, b"please top up", NOW).kind == "balance"


def test_startup_refuses_a_bad_signature_row(tmp_path, dsn):
    plugdir = tmp_path / "plugins"
    plugdir.mkdir()
    (plugdir / "bad.py").write_text(THIRD_PARTY.replace('"status": [402]', '"status": ["402"]'))
    from treg import testing

    with pytest.raises(CatalogError) as err:
        create_app(testing.make_settings(tmp_path / "home", plugins_dir=plugdir), dsn=dsn)
    assert [(p.plugin, p.field) for p in err.value.problems] == [("dir:bad.py", "status")]


def test_provider_capacity_refusal_body_and_headers():
    from treg.capacity.errors import ProviderCapacity

    err = ProviderCapacity(provider="acme", endpoint="acme.items-get", kind="quota",
                           resets_at=NOW + timedelta(seconds=90.2), alternatives=[{"id": "beta.items"}], now=NOW)
    assert (err.status, err.blame, err.refused_by, err.headers) == (503, "treg", "capacity", {"Retry-After": "91"})
    body = err.body()
    assert body["error"] == "provider_capacity" and body["resets_at"] == "2026-12-01T10:01:30.200000Z"
    assert (body["provider"], body["endpoint"], body["kind"], body["alternatives"]) == (
        "acme", "acme.items-get", "quota", [{"id": "beta.items"}])
    unknown = ProviderCapacity(provider="acme", endpoint=None, kind="balance", resets_at=None, alternatives=[])
    assert unknown.headers == {} and unknown.body()["resets_at"] is None and unknown.body()["endpoint"] is None
    assert "overflow_refused" not in unknown.body()
