"""Discovery for agents holding only the base URL and a token (surfaces.md, "Discovery over plain HTTP"),
and the walk from nothing to a correct catalog call in at most three requests, over HTTP and over MCP."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from treg import membership
from treg.keys import SERVICES
from treg.testing import Gateway, ProviderPlugin, http_response, raw_upstream

#: a weather provider the test's upstream stands in for, beside the built-in catalog's four weather
#: endpoints (which need a key or the operator's anonymous allow-list, so are not callable here)
SKYFACTS = {
    "id": "skyfacts", "name": "SkyFacts", "base_url": "",
    "auth": [{"location": "header", "name": "Authorization", "format": "Bearer {secret}"}],
    "endpoints": [
        {"id": "skyfacts.forecast", "method": "GET", "path": "/forecast", "capability": "weather.forecast",
         "description": "Hourly weather forecast for coordinates.",
         "params": [{"name": "latitude", "in": "query", "required": True},
                    {"name": "longitude", "in": "query", "required": True},
                    {"name": "hours", "in": "query", "type": "integer"}],
         "price": {"per_call_micro": 0}, "strict_query": True},
        {"id": "skyfacts.geocode", "method": "GET", "path": "/geocode", "capability": "geo.geocode",
         "description": "Coordinates of a place name.",
         "params": [{"name": "name", "in": "query", "required": True}], "price": {"per_call_micro": 0}},
    ],
}
#: what the agent knows about its task: the values it would fill in
KNOWN = {"latitude": "52.52", "longitude": "13.41"}


@pytest.fixture
async def sky(aiohttp_client, make_app):
    async with raw_upstream(lambda ex: http_response(200, b'{"hourly": [1, 2]}',
                                                     [("Content-Type", "application/json")])) as up:
        app = make_app(extra_plugins=(ProviderPlugin([{**SKYFACTS, "base_url": up.url + "/v2"}]),),
                       ssrf_allow=("127.0.0.0/8",))
        client = await aiohttp_client(app)
        org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
        gw = Gateway(client, org)
        await gw.secret("sky-key", name="sky", provider="skyfacts")
        yield gw, up
        await client.close()


async def test_index_answers_without_a_token_and_names_the_ways_in(client):
    resp = await client.get("/")
    assert resp.status == 200 and resp.content_type == "application/json"
    body = await resp.json()
    assert "gateway" in body["about"]
    assert body["call"] == {"own_tool": "/call/<tool>/<path>?<query>", "by_url": "/call/https://<host>/<path>",
                            "catalog": "/catalog/call/<endpoint-id>?<param>=<value>"}
    assert body["mcp"]["tools_and_catalog"] == "/mcp" and body["mcp"]["catalog_only"] == "/catalog/mcp"
    assert body["catalog"]["search"] == "/api/v1/catalog/endpoints?q=<words>"
    assert "weather.forecast" in body["catalog"]["capabilities"]
    assert "you" not in body


async def test_index_with_a_token_names_org_role_and_tools_and_a_bad_one_is_said_so(gateway, up):
    await gateway.tool("weather-tool", up.url)
    await gateway.tool("private", up.url, allowed_member_ids=[gateway.org["member_id"]])
    member = await gateway.member("m@acme.test")
    you = (await (await gateway.client.get("/", headers=gateway.owner)).json())["you"]
    assert you["org_slug"] == "acme" and you["role"] == "owner" and you["tools"] == ["private", "weather-tool"]
    you = (await (await gateway.client.get("/", headers=member["headers"])).json())["you"]
    assert you["role"] == "member" and you["tools"] == ["weather-tool"]
    resp = await gateway.client.get("/", headers={"X-Treg-Token": "treg_wrong"})
    assert resp.status == 200 and (await resp.json())["you"]["token_accepted"] is False


async def test_a_browser_is_sent_to_the_dashboard(client):
    resp = await client.get("/", headers={"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"},
                            allow_redirects=False)
    assert resp.status == 303 and resp.headers["Location"] == "/ui/"


async def test_tool_not_found_points_at_the_catalog_with_the_callers_words(gateway):
    r = await gateway.call("GET", "/call/weather.forecast?latitude=1&longitude=2")
    body = await r.json()
    assert r.status == 404 and body["error"] == "tool_not_found"
    assert "/api/v1/catalog/endpoints?q=weather+forecast" in body["hint"]
    # four weather endpoints in the built-in catalog: the forecast ones first, by words across providers
    assert body["did_you_mean"][:2] == ["open-meteo.forecast", "openweathermap.forecast"]
    assert "open-meteo.archive" in body["did_you_mean"]
    # the hint's URL finds them
    found = await gateway.api("GET", "/api/v1/catalog/endpoints?q=weather+forecast", expect=200)
    assert [e["id"] for e in found["endpoints"]][:2] == ["open-meteo.forecast", "openweathermap.forecast"]
    assert {p["name"] for p in found["endpoints"][0]["params"]} >= {"latitude", "longitude"}


async def test_endpoint_not_found_keeps_provider_local_misspellings_first(gateway):
    r = await gateway.call("GET", "/catalog/call/open-meteo.forcast")
    body = await r.json()
    assert r.status == 404 and body["error"] == "endpoint_not_found"
    assert body["did_you_mean"][0] == "open-meteo.forecast"
    assert len(body["did_you_mean"]) > 1  # then by words
    assert "/api/v1/catalog/endpoints?q=open+meteo+forcast" in body["hint"]
    detail = await gateway.api("GET", "/api/v1/catalog/endpoints/open-meteo.forcast", expect=404)
    assert detail["did_you_mean"][0] == "open-meteo.forecast" and "hint" in detail


async def test_a_connected_tool_stays_the_first_pointer(gateway, up):
    await gateway.tool("weather", up.url)
    r = await gateway.call("GET", "/call/weather.forecast")
    body = await r.json()
    assert r.status == 404 and body["did_you_mean"][0] == "/call/weather/<path>"
    assert "weather is a tool of this org" in body["hint"] and "/api/v1/catalog/endpoints?q=" in body["hint"]
    assert "open-meteo.forecast" in body["did_you_mean"]


async def test_passthrough_miss_points_at_the_catalog_too(gateway):
    r = await gateway.call("GET", "/call/https://api.weather.example/forecast")
    body = await r.json()
    assert r.status == 404 and body["error"] == "tool_not_found"
    assert "q=weather+example+forecast" in body["hint"] and "open-meteo.forecast" in body["did_you_mean"]


# -- the walk: an agent with only the base URL and a token ---------------------------------------------

def fill(params: list[dict]) -> dict[str, str]:
    """The agent fills the required parameters it knows values for."""
    return {p["name"]: KNOWN[p["name"]] for p in params if p["required"]}


async def test_walk_over_plain_http_from_a_miss(sky):
    gw, up = sky
    requests = 0
    # 1: the agent guesses
    r = await gw.call("GET", "/call/weather.forecast?latitude=52.52&longitude=13.41")
    requests += 1
    miss = await r.json()
    assert r.status == 404
    # 2: it follows the hint
    url = miss["hint"].split("GET ", 1)[1].split(" ", 1)[0]
    found = (await (await gw.call("GET", url)).json())["endpoints"]
    requests += 1
    pick = next(e for e in found if e["callable"])
    # 3: it calls the first match it can call, with the parameters the answer named
    r = await gw.call("GET", f"/catalog/call/{pick['id']}?{urlencode(fill(pick['params']))}")
    requests += 1
    assert r.status == 200 and await r.json() == {"hourly": [1, 2]}
    assert requests <= 3 and pick["id"] == "skyfacts.forecast"
    assert up.last.target == "/v2/forecast?latitude=52.52&longitude=13.41"
    assert up.last.header("Authorization") == "Bearer sky-key"


async def test_walk_over_plain_http_from_the_index(sky):
    gw, up = sky
    index = await (await gw.call("GET", "/")).json()                                   # 1
    search = index["catalog"]["search"].replace("<words>", "weather+forecast")
    found = (await (await gw.call("GET", search)).json())["endpoints"]                 # 2
    pick = next(e for e in found if e["callable"])
    r = await gw.call("GET", f"/catalog/call/{pick['id']}?{urlencode(fill(pick['params']))}")  # 3
    assert r.status == 200 and up.last.target == "/v2/forecast?latitude=52.52&longitude=13.41"


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_walk_over_mcp_in_three_requests(sky, mode):
    gw, up = sky
    posts: list[str] = []

    async def count(request):
        if request.method == "POST":
            posts.append(json.loads(request.content)["method"])

    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {gw.org['token']}"}, timeout=30,
                              event_hooks={"request": [count]})
    url = str(gw.client.make_url("/mcp"))
    async with http, Client(streamable_http_client(url, http_client=http), mode=mode) as c:
        connected = len(posts)  # the handshake (initialize) or the probe (server/discover)
        tools = {t.name: t for t in (await c.list_tools()).tools}                     # 1
        assert "query" in tools["catalog_search"].input_schema["properties"]
        found = (await c.call_tool("catalog_search", {"query": "weather forecast for Berlin"})).structured_content
        pick = next(e for e in found["endpoints"] if e["callable"])                    # 2
        args = {**pick["call"]["arguments"], "params": fill(pick["params"])}
        result = await c.call_tool(pick["call"]["tool"], args)                         # 3
    assert len([p for p in posts[connected:] if p != "notifications/initialized"]) <= 3, posts
    assert result.is_error is False and result.structured_content["body"] == {"hourly": [1, 2]}
    assert result.structured_content["credential_tier"] == "team"
    assert up.last.target == "/v2/forecast?latitude=52.52&longitude=13.41"
