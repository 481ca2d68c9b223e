"""Catalog listing routes over real HTTP, and ``treg catalog``."""

from __future__ import annotations

import json
from typing import Any

import pytest

from treg import cli, membership
from treg.keys import SERVICES
from treg.settings import SecretStr


@pytest.fixture
def start(make_app, aiohttp_client):
    async def go(**overrides: Any):
        client = await aiohttp_client(make_app(**overrides))
        org = await membership.create_org(client.app[SERVICES], slug="acme", email="owner@acme.test")
        org["headers"] = {"X-Treg-Token": org["token"]}
        return client, org
    return go


async def get(client, org, path: str, status: int = 200) -> Any:
    resp = await client.get(path, headers=org["headers"])
    assert resp.status == status, await resp.text()
    return await resp.json()


async def test_listing_needs_a_token(client):
    resp = await client.get("/api/v1/catalog/endpoints")
    assert resp.status == 401 and (await resp.json())["blame"] == "caller"


async def test_list_filters_and_tiers(start):
    client, org = await start(anonymous_providers=("open-meteo",),
                              platform={"TREG_PLATFORM_KEY_GITHUB": SecretStr("k")})
    rows = (await get(client, org, "/api/v1/catalog/endpoints"))["endpoints"]
    ids = [r["id"] for r in rows]
    assert ids == sorted(ids) and "open-meteo.forecast" in ids and "openai.edits.create" in ids
    by_id = {r["id"]: r for r in rows}
    assert by_id["open-meteo.forecast"]["credential_tier"] == "anonymous"
    assert by_id["github.repos.get"]["credential_tier"] == "platform" and by_id["github.repos.get"]["billed"]
    assert by_id["github.repos.get"]["price_micro"] == 100
    assert by_id["github.issues.create"]["credential_tier"] is None          # BYOK only
    assert by_id["github.issues.create"]["needs"] == "team"
    assert by_id["openai.chat.completions.create"]["callable"] is False
    assert by_id["openai.edits.create"]["status"] == "retired" and by_id["openai.edits.create"]["credential_tier"] is None

    gh = (await get(client, org, "/api/v1/catalog/endpoints?provider=github"))["endpoints"]
    assert gh and all(r["provider"] == "github" for r in gh)
    cap = (await get(client, org, "/api/v1/catalog/endpoints?capability=weather.forecast"))["endpoints"]
    # two live endpoints share the capability: the routed treg.weather.forecast is listed too (lifecycle.md)
    assert [r["id"] for r in cap] == ["open-meteo.forecast", "openweathermap.forecast", "treg.weather.forecast"]
    text = (await get(client, org, "/api/v1/catalog/endpoints?q=Repository+github"))["endpoints"]
    assert {r["id"] for r in text} >= {"github.repos.get"} and all(r["provider"] == "github" for r in text)
    retired = (await get(client, org, "/api/v1/catalog/endpoints?status=retired"))["endpoints"]
    assert [r["id"] for r in retired] == ["openai.edits.create"]
    assert (await get(client, org, "/api/v1/catalog/endpoints?status=dead", 400))["error"] == "invalid_filter"
    assert (await get(client, org, "/api/v1/catalog/endpoints?provider=nope"))["endpoints"] == []


async def test_a_team_secret_changes_the_tier_shown(start):
    client, org = await start()
    path = "/api/v1/catalog/endpoints/openai.chat.completions.create"
    before = await get(client, org, path)
    assert before["credential_tier"] is None and before["needs"] == "team"
    assert '"provider": "openai"' in before["how_to_get_credential"]
    resp = await client.post("/api/v1/secrets", json={"name": "oa", "value": "sk-x", "provider": "openai"},
                             headers=org["headers"])
    assert resp.status == 201
    after = await get(client, org, path)
    assert after["credential_tier"] == "team" and after["callable"] and not after["billed"]
    assert "needs" not in after


async def test_endpoint_detail_shows_price_parameters_and_tier(start):
    client, org = await start(anonymous_providers=("open-meteo",))
    body = await get(client, org, "/api/v1/catalog/endpoints/github.repos.get")
    assert body["price"] == {"per_call_micro": 100} and body["price_micro"] == 100
    assert [p["name"] for p in body["params"]] == ["owner", "repo"] and body["params"][0]["in"] == "path"
    assert body["url"] == "https://api.github.com/repos/{owner}/{repo}"
    assert body["query_form"] == "/catalog/call/github.repos.get?owner=<owner>&repo=<repo>"
    assert body["required_headers"] == {"X-GitHub-Api-Version": "2022-11-28"}
    assert body["credential_tier"] is None and body["strict_query"] is True
    fc = await get(client, org, "/api/v1/catalog/endpoints/open-meteo.forecast")
    assert fc["credential_tier"] == "anonymous" and fc["platform_auth"] == "anonymous"
    assert fc["alternatives"] == [{"id": "openweathermap.forecast", "price_micro": 150, "tier": "team",
                                   "callable": False}]
    geo = await get(client, org, "/api/v1/catalog/endpoints/open-meteo.geocoding.search")
    assert geo["url"] == "https://geocoding-api.open-meteo.com/v1/search"
    img = await get(client, org, "/api/v1/catalog/endpoints/openai.images.generate")
    assert img["price"]["table"]["field"] == "size" and img["price_micro"] == 40000
    old = await get(client, org, "/api/v1/catalog/endpoints/openai.edits.create")
    assert old["status"] == "retired" and old["superseded_by"] == "openai.chat.completions.create"


async def test_an_unknown_endpoint_is_a_404_with_did_you_mean(start):
    client, org = await start()
    resp = await client.get("/api/v1/catalog/endpoints/github.repos.gett", headers=org["headers"])
    body = await resp.json()
    assert resp.status == 404 and body["error"] == "endpoint_not_found"
    assert body["did_you_mean"][0] == "github.repos.get" and resp.headers["X-Treg-Error"] == "1"


async def test_providers_listing(start):
    client, org = await start(platform={"TREG_PLATFORM_KEY_OPENAI": SecretStr("k")})
    rows = {p["id"]: p for p in (await get(client, org, "/api/v1/catalog/providers"))["providers"]}
    assert rows["openai"]["platform_key_configured"] is True and rows["github"]["platform_key_configured"] is False
    assert rows["open-meteo"]["auth"] == [] and rows["github"]["platform_setting"] == "TREG_PLATFORM_KEY_GITHUB"
    assert "k" not in json.dumps(rows["openai"]["auth"])


# -- treg catalog -------------------------------------------------------------------------------------------

BAD_PLUGIN = '''
from treg import hookimpl

@hookimpl
def treg_register_providers():
    return [{"id": "shop", "base_url": "https://shop.example", "auth": [],
             "endpoints": [{"id": "shop.items", "method": "GET", "path": "/items", "params": [],
                            "price": {"per_call_micro": -1}}]}]
'''


@pytest.fixture
def cli_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TREG_HOME", str(tmp_path / "home"))
    for key in ("TREG_PLUGINS_DIR", "TREG_ANONYMOUS_PROVIDERS", "TREG_CONFIG"):
        monkeypatch.delenv(key, raising=False)
    return tmp_path


def test_cli_lists_and_validates(cli_env, capsys, monkeypatch):
    monkeypatch.setenv("TREG_ANONYMOUS_PROVIDERS", "open-meteo")
    assert cli.main(["catalog", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["valid"] is True
    by_id = {e["id"]: e for e in out["endpoints"]}
    assert by_id["open-meteo.forecast"]["offered_tier"] == "anonymous"
    assert cli.main(["catalog", "--provider", "github"]) == 0
    text = capsys.readouterr().out
    assert "github.repos.get" in text and "open-meteo" not in text and "catalog valid" in text
    assert cli.main(["catalog", "--provider", "nope"]) == 1


def test_cli_exits_non_zero_on_an_invalid_catalog(cli_env, capsys, monkeypatch):
    folder = cli_env / "plugins"
    folder.mkdir()
    (folder / "shop.py").write_text(BAD_PLUGIN)
    monkeypatch.setenv("TREG_PLUGINS_DIR", str(folder))
    assert cli.main(["catalog", "--json"]) == 1
    captured = capsys.readouterr()
    problems = json.loads(captured.out)["problems"]
    assert problems == [{"plugin": "dir:shop.py", "row": "endpoint 'shop.items'", "field": "price.per_call_micro",
                         "message": problems[0]["message"]}]
    assert "dir:shop.py" in captured.err and "price.per_call_micro" in captured.err


async def test_the_built_in_free_provider_is_anonymous_when_allowed(start):
    # fake DNS knows no public name, so the relay fails without leaving the machine: what matters here is
    # that the ladder chose the anonymous tier for the built-in keyless provider and charged nothing
    client, org = await start(anonymous_providers=("open-meteo",))
    resp = await client.get("/catalog/call/open-meteo.forecast?latitude=52.52&longitude=13.41&hourly=temperature_2m",
                            headers=org["headers"])
    assert resp.headers["X-Treg-Credential-Tier"] == "anonymous" and resp.headers["X-Treg-Cost-Micro"] == "0"


async def test_the_built_in_free_provider_needs_the_allow_list(start):
    client, org = await start()
    resp = await client.get("/catalog/call/open-meteo.forecast?latitude=52.52&longitude=13.41",
                            headers=org["headers"])
    body = await resp.json()
    assert resp.status == 404 and body["error"] == "no_credential" and "TREG_ANONYMOUS_PROVIDERS" in body["detail"]
