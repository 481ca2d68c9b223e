"""A provider row's ``oauth`` block, validated at startup like every row (oauth.md "A provider declares
OAuth"): https URLs (plain http only while TREG_SSRF_ALLOW is set), no names resolved, a closed set of
keys, constants that cannot replace what treg sends, auth bindings to inject the token."""

from __future__ import annotations

import pytest

from treg.catalog.errors import CatalogError
from treg.catalog.load import build_catalog
from treg.startup import invoke_startup
from treg.testing import ProviderPlugin, contract_provider, make_settings
from treg.testing.catalogs import _builtin_injectors

BLOCK = {"authorize_url": "https://auth.acme.example/oauth/authorize",
         "token_url": "https://auth.acme.example/oauth/token", "revoke_url": "https://auth.acme.example/oauth/revoke",
         "scopes": ["items.read"], "scope_separator": " ", "client_auth": "basic",
         "authorize_params": {"access_type": "offline"}}


def _problems(oauth, *, http: bool = False, **row):
    data = contract_provider() | {"oauth": oauth} | row
    try:
        build_catalog([("acme-plugin", [data])], _builtin_injectors(), oauth_http=http)
    except CatalogError as exc:
        return [(p.field, p.message) for p in exc.problems]
    return []


def test_the_contract_block_loads_into_a_frozen_type():
    data = contract_provider() | {"oauth": BLOCK}
    registry = build_catalog([("acme-plugin", [data])], _builtin_injectors())
    block = registry.providers["acme"].oauth
    assert block.token_url == BLOCK["token_url"] and block.scopes == ("items.read",)
    assert block.authorize_params == (("access_type", "offline"),) and block.client_auth == "basic"
    assert registry.providers["acme"].to_json()["oauth"]["revoke_url"] == BLOCK["revoke_url"]
    minimal = contract_provider() | {"oauth": {"authorize_url": BLOCK["authorize_url"],
                                               "token_url": BLOCK["token_url"]}}
    block = build_catalog([("p", [minimal])], _builtin_injectors()).providers["acme"].oauth
    assert block.revoke_url is None and block.scope_separator == " " and block.client_auth == "basic"


@pytest.mark.parametrize("change, field", [
    ({"token_url": "http://auth.acme.example/token"}, "oauth.token_url"),
    ({"authorize_url": "ftp://auth.acme.example/a"}, "oauth.authorize_url"),
    ({"token_url": "https://user:pw@auth.acme.example/token"}, "oauth.token_url"),
    ({"revoke_url": "https://auth.acme.example/revoke#x"}, "oauth.revoke_url"),
    ({"token_url": "https://auth.acme.example/to ken"}, "oauth.token_url"),
    ({"authorize_url": None}, "oauth.authorize_url"),
    ({"scopes": "items.read"}, "oauth.scopes"),
    ({"scopes": ["items read"]}, "oauth.scopes[0]"),
    ({"scopes": ["a", "a"]}, "oauth.scopes[1]"),
    ({"client_auth": "jwt"}, "oauth.client_auth"),
    ({"scope_separator": ""}, "oauth.scope_separator"),
    ({"authorize_params": {"state": "fixed"}}, "oauth.authorize_params.state"),
    ({"authorize_params": {"code_challenge_method": "plain"}}, "oauth.authorize_params.code_challenge_method"),
    ({"authorize_params": {"prompt": 1}}, "oauth.authorize_params.prompt"),
    ({"pkce": False}, "oauth.pkce"),
])
def test_a_bad_block_stops_startup_naming_the_field(change, field):
    problems = _problems(BLOCK | change)
    assert field in [f for f, _ in problems], problems


def test_an_oauth_provider_needs_auth_bindings_for_the_token():
    assert "auth" in [f for f, _ in _problems(BLOCK, auth=[])]


def test_plain_http_only_while_the_ssrf_guard_exempts_addresses(tmp_path):
    local = {"authorize_url": "http://127.0.0.1:9/authorize", "token_url": "http://127.0.0.1:9/token"}
    assert _problems(local) and not _problems(local, http=True)
    row = contract_provider() | {"oauth": local}
    with pytest.raises(CatalogError) as refused:
        invoke_startup(make_settings(tmp_path / "a"), extra_plugins=(ProviderPlugin([row]),))
    assert "oauth.token_url" in [p.field for p in refused.value.problems]
    started = invoke_startup(make_settings(tmp_path / "b", ssrf_allow=("127.0.0.0/8",)),
                             extra_plugins=(ProviderPlugin([row]),))
    assert started.catalog.providers["acme"].oauth.token_url == "http://127.0.0.1:9/token"


def test_startup_resolves_no_name(monkeypatch):
    import socket

    def refuse(*a, **kw):
        raise AssertionError("startup resolved a name")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    data = contract_provider() | {"oauth": BLOCK | {"token_url": "https://no-such-host.invalid/token"}}
    assert build_catalog([("p", [data])], _builtin_injectors()).providers["acme"].oauth is not None
