"""Bad input is the caller's 4xx with the error body, never a 500 (api.md: "A NUL character, or JSON
nested deeper than 64 levels, is 400"): a NUL in any string field of every POST/PATCH/PUT body, a
``%00`` in every ``{id}`` of every route, JSON nested 100,000 deep, and ``treg init``'s arguments."""

from __future__ import annotations

import json
import re
from typing import Any, Iterator

import pytest

from treg.testing import run_cli as treg

NUL = "a\u0000b"


def _refused(r, *statuses: int) -> dict[str, Any]:
    assert r.status in statuses, (r.status, r.body)
    assert r.header("X-Treg-Error") == "1"
    body = r.json()
    assert set(body) >= {"error", "detail", "blame"} and body["blame"] == "caller"
    return body


def _string_paths(doc: Any, path: tuple = ()) -> Iterator[tuple]:
    """The path of every string in ``doc``: each value, and (as ``("key", k)``) each key."""
    if isinstance(doc, str):
        yield path
    elif isinstance(doc, dict):
        for k, v in doc.items():
            yield path + (("key", k),)
            yield from _string_paths(v, path + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _string_paths(v, path + (i,))


def _with_nul(doc: Any, path: tuple) -> Any:
    doc = json.loads(json.dumps(doc))
    if not path:
        return NUL
    node = doc
    for step in path[:-1]:
        node = node[step]
    last = path[-1]
    if isinstance(last, tuple):  # a key
        node[last[1] + NUL] = node.pop(last[1])
    else:
        node[last] = node[last][:1] + NUL
    return doc


async def _bodies(gateway) -> list[tuple[str, str, dict[str, Any]]]:
    """Every management route that takes a JSON body, with a valid body using every string field."""
    project = (await gateway.api("POST", "/api/v1/projects", json={"name": "p"}, expect=201))["id"]
    member = await gateway.member("m@acme.test")
    secret = await gateway.secret("s3cr3t", name="key")
    tool = await gateway.tool("t", "https://api.example.com/v1",
                              [{"location": "header", "name": "Authorization", "format": "Bearer {secret}",
                                "secret_id": secret}])
    binding = {"location": "header", "name": "X-Key", "format": "K {secret}", "secret_id": secret}
    tool_body = {"name": "t2", "base_url": "https://api2.example.com/v1", "bindings": [binding],
                 "project_id": project, "allowed_member_ids": [member["member_id"]]}
    return [
        ("POST", "/api/v1/members", {"email": "new@acme.test", "role": "member", "project_ids": [project]}),
        ("POST", "/api/v1/projects", {"name": "q"}),
        ("POST", "/api/v1/secrets", {"name": "k2", "value": "v", "provider": "acme"}),
        ("POST", "/api/v1/secrets", {"name": "k3", "value": {"field": "v"}}),
        ("POST", "/api/v1/tools", tool_body),
        ("PATCH", f"/api/v1/tools/{tool['id']}", {**tool_body, "name": "t3"}),
        ("POST", "/api/v1/deny-rules", {"host": "api.example.com", "path": "/x", "method": "GET",
                                        "member_id": member["member_id"], "project_id": project, "reason": "no"}),
        ("POST", "/api/v1/tokens", {"member_id": member["member_id"]}),
        ("PUT", f"/api/v1/limits/members/{member['member_id']}", {"daily_cap_micro": 5}),
        ("PUT", "/api/v1/limits/tags/team", {"budget_micro": 5}),
        ("PUT", "/api/v1/limits/daily-cap", {"micro": 5}),
    ]


async def _raw_json(gateway, method: str, path: str, doc: Any):
    return await gateway.raw(method, path, [("Content-Type", "application/json")],
                             json.dumps(doc).encode())


async def test_a_nul_in_any_string_field_of_any_body_is_a_400(gateway):
    refused = 0
    for method, path, body in await _bodies(gateway):
        for where in _string_paths(body):
            r = await _raw_json(gateway, method, path, _with_nul(body, where))
            assert _refused(r, 400)["error"] == "invalid_json", (method, path, where)
            refused += 1
    assert refused > 30  # every field of every route above was tried


async def test_every_id_route_with_percent_00_is_a_4xx(gateway):
    app = gateway.client.app
    tried = 0
    for resource in app.router.resources():
        info = resource.get_info()
        formatter = info.get("formatter")
        if not formatter or not formatter.startswith("/api/"):
            continue
        path = re.sub(r"\{[^}]+\}", "%00", formatter)
        methods = {route.method for route in resource} - {"HEAD"}  # GET's twin, no body to check
        for method in methods:
            body = json.dumps({"name": "x"}).encode() if method in ("POST", "PUT", "PATCH") else None
            r = await gateway.raw(method, path, [("Content-Type", "application/json")], body)
            assert 400 <= r.status < 500, (method, path, r.status, r.body)
            _refused(r, 400, 404)
            tried += 1
    assert tried >= 8  # tools, secrets, deny-rules, tokens, calls, limits, catalog …


@pytest.mark.parametrize("path", ["/api/v1/tools/%00", "/api/v1/calls/a%00b", "/api/v1/secrets/%00"])
async def test_percent_00_in_an_id_names_the_parameter(gateway, path):
    r = await gateway.raw("DELETE" if "secrets" in path else "GET", path)
    assert _refused(r, 400)["error"] == "invalid_path"


async def test_percent_00_in_a_query_is_a_400(gateway):
    r = await gateway.raw("GET", "/api/v1/calls?limit=%00")
    _refused(r, 400)
    r = await gateway.raw("GET", "/api/v1/catalog/endpoints?provider=a%00b")
    _refused(r, 400)


@pytest.mark.parametrize("depth", [65, 100_000])
async def test_json_nested_deeper_than_64_is_a_400(gateway, depth):
    doc = b'{"name": ' + b"[" * depth + b"]" * depth + b"}"
    r = await gateway.raw("POST", "/api/v1/projects", [("Content-Type", "application/json")], doc)
    assert _refused(r, 400)["error"] == "invalid_json"
    r = await gateway.raw("POST", "/api/v1/projects", [("Content-Type", "application/json")],
                          b"[" * depth + b"]" * depth)
    _refused(r, 400)


async def test_json_nested_64_deep_is_not_refused_for_its_depth(gateway):
    doc = {"name": "x", "value": {"a": 1}}
    node = doc["value"]
    for _ in range(61):  # the top object, "value", then 62 more levels: 64 in all
        node["a"] = {"a": 1}
        node = node["a"]
    r = await _raw_json(gateway, "POST", "/api/v1/secrets", doc)
    assert r.status == 201, r.body


def test_init_refuses_bad_text_without_a_traceback(dsn, tmp_path):
    # argv cannot carry a NUL; what it can carry is bytes that are not UTF-8 (surrogate-escaped by
    # Python) and control characters: each is the error JSON on stderr and exit 2, never a traceback
    for args in (["--org", "acme", "--email", "a\udcff@acme.test"], ["--org", "acme", "--email", "a\x01b@acme.test"],
                 ["--org", "acme\n", "--email", "a@acme.test"], ["--org", "ac\udce9me", "--email", "a@acme.test"]):
        proc = treg(tmp_path / "home", dsn, "init", *args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
        err = json.loads(proc.stderr.strip().splitlines()[-1])
        assert err["blame"] == "caller" and err["error"] in ("invalid_email", "invalid_slug")
        assert proc.stdout == ""


async def test_a_json_binding_call_with_a_body_nested_100000_deep_is_a_400(gateway, up):
    sid = await gateway.secret("s3cr3t")
    await gateway.tool("js", up.url + "/v1", [{"location": "json", "name": "key", "secret_id": sid}])
    depth = 100_000
    r = await gateway.raw("POST", "/call/js/x", [("Content-Type", "application/json")],
                          b'{"a": ' + b"[" * depth + b"]" * depth + b"}")
    assert _refused(r, 400)["error"] == "invalid_json_body"
    assert up.exchanges == []
