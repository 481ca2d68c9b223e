"""GET /api/v1/openapi.json describes exactly the management routes the app registers (both ways), and
is a document schemathesis can load."""

from __future__ import annotations

import schemathesis

from treg import testing
from treg.app import create_app
from treg.web import openapi


def registered_api_routes(app) -> set[tuple[str, str]]:
    """(method, path template) of every route under /api/v1 the router holds; HEAD is aiohttp's
    companion of each GET (allow_head), implied by GET."""
    out = set()
    for route in app.router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        if path.startswith("/api/v1") and route.method != "HEAD":
            out.add((route.method, path))
    return out


def documented_routes(doc) -> set[tuple[str, str]]:
    return {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops}


def test_the_document_lists_every_registered_route_and_nothing_else(tmp_path):
    app = create_app(testing.make_settings(tmp_path / "home"))
    registered = registered_api_routes(app)
    documented = documented_routes(openapi.document())
    assert registered - documented == set(), "routes with no row in treg/web/openapi.py OPERATIONS"
    assert documented - registered == set(), "rows in treg/web/openapi.py OPERATIONS with no route"
    # the comparison can fail: the app really has the routes (not an empty set matching an empty set)
    assert ("PATCH", "/api/v1/tools/{tool_id}") in registered and len(registered) >= 25


def test_a_route_missing_from_the_table_is_caught(tmp_path):
    app = create_app(testing.make_settings(tmp_path / "home"))
    doc = openapi.document()
    del doc["paths"]["/api/v1/me"]
    assert registered_api_routes(app) - documented_routes(doc) == {("GET", "/api/v1/me")}


async def test_served_without_a_token_as_openapi_3_1(client):
    resp = await client.get("/api/v1/openapi.json")
    assert resp.status == 200 and resp.content_type == "application/json"
    doc = await resp.json()
    assert doc["openapi"].startswith("3.1")
    assert doc["components"]["securitySchemes"]["TregToken"] == {"type": "apiKey", "in": "header",
                                                                  "name": "X-Treg-Token"}
    assert set(doc["components"]["schemas"]["Error"]["required"]) == {"error", "detail", "blame"}
    assert doc["paths"]["/api/v1/openapi.json"]["get"]["security"] == []
    # every $ref resolves, and every operation names its answers and refusals
    schema = schemathesis.openapi.from_dict(doc)
    ops = [result.ok() for result in schema.get_all_operations()]
    assert len(ops) == len(documented_routes(doc))
    for method, path in documented_routes(doc):
        responses = doc["paths"][path][method.lower()]["responses"]
        if path != openapi.PATH:
            assert {"400", "401"} <= set(responses), (method, path)


async def test_a_refusal_matches_the_documented_error_body(client):
    resp = await client.get("/api/v1/me")
    assert resp.status == 401 and resp.headers["X-Treg-Error"] == "1"
    body = await resp.json()
    assert set(openapi.SCHEMAS["Error"]["required"]) <= set(body)
    assert body["blame"] in openapi.SCHEMAS["Error"]["properties"]["blame"]["enum"]


# -- closed body schemas are what the routes enforce (issue 20 item 11: the three PUT /api/v1/limits/…
# routes took unknown fields their schemas forbid) -----------------------------------------------------

def _bodies() -> list[tuple[str, str]]:
    return [(m, p) for (m, p), op in openapi.OPERATIONS.items() if "requestBody" in op]


def test_every_request_body_schema_is_closed():
    """A body schema that took any field would make a typo a silent no-op; every one says so."""
    bodies = _bodies()
    assert ("PUT", "/api/v1/limits/daily-cap") in bodies and len(bodies) >= 11
    open_ones = [(m, p) for m, p in bodies if openapi.body_fields(m, p) is None]
    assert open_ones == [], "request bodies whose schema is not additionalProperties: false"


async def test_an_unknown_field_is_refused_on_every_route_that_takes_a_body(gateway):
    """One rule, from the document: each closed schema's route answers 400 invalid_field for a field it
    does not name, before anything else about the body is looked at (and nothing changes)."""
    member = await gateway.member("m@acme.test")
    ids = {"tool_id": (await gateway.tool("t", "https://93.184.216.34/"))["id"], "tag": "team",
           "member_id": member["member_id"], "provider": "no-such-provider"}
    before = await gateway.api("GET", "/api/v1/limits", expect=200)
    for method, path in _bodies():
        url = path.format(**ids)
        allowed = openapi.body_fields(method, path)
        good = {"micro": 5, "budget_micro": 5, "daily_cap_micro": 5}
        body = {k: v for k, v in good.items() if k in allowed} | {"zz_typo": 1}
        r = await gateway.client.request(method, url, json=body, headers=gateway.owner)
        got = await r.json()
        assert r.status == 400 and got["error"] == "invalid_field" and "zz_typo" in got["detail"], (method, path, got)
        assert r.headers["X-Treg-Error"] == "1" and got["blame"] == "caller"
    assert await gateway.api("GET", "/api/v1/limits", expect=200) == before  # no limit was set


async def test_the_limits_routes_refuse_a_misspelt_limit(gateway):
    member = await gateway.member("m@acme.test")
    for url, ok, typo in (("/api/v1/limits/daily-cap", {"micro": 5}, {"budget_micro": 9}),
                          ("/api/v1/limits/tags/team", {"budget_micro": 5}, {"budget": 9}),
                          (f"/api/v1/limits/members/{member['member_id']}", {"daily_cap_micro": 5}, {"cap": 9})):
        r = await gateway.client.put(url, json=ok | typo, headers=gateway.owner)
        assert r.status == 400 and (await r.json())["error"] == "invalid_field", url
        assert (await gateway.client.put(url, json=ok, headers=gateway.owner)).status == 200
