"""Registration validation (seed "Resolution and relay guards", issue 2 item 6), over HTTP.

Each rule: a tool whose bindings could not work at call time is refused when it is registered, with
the contract's error body (400 malformed, 422 well-formed but refused, 409 name taken).
"""

from __future__ import annotations

from typing import Any

import pytest

from treg import membership
from treg.keys import SERVICES

PUBLIC = "https://api.example.com/v1"


async def assert_error(resp: Any, status: int, code: str | None = None) -> dict[str, Any]:
    """The contract's error body: JSON {error, detail, blame}, status, and X-Treg-Error: 1."""
    assert resp.status == status, (resp.status, await resp.text())
    assert resp.headers.get("X-Treg-Error") == "1"
    body = await resp.json()
    assert {"error", "detail", "blame"} <= set(body) and body["blame"] == "caller"
    if code is not None:
        assert body["error"] == code, body
    return body


async def ok(resp: Any, status: int = 200) -> Any:
    assert resp.status == status, (resp.status, await resp.text())
    return await resp.json() if status != 204 else None


@pytest.fixture
async def org(client, owner) -> dict[str, Any]:
    h = owner["headers"]
    plain = await ok(await client.post("/api/v1/secrets", json={"name": "key", "value": "sk_1"}, headers=h), 201)
    js = await ok(await client.post("/api/v1/secrets", json={"name": "oauth", "value": {"access_token": "at_1",
                                                                                       "n": 3}},
                                    headers=h), 201)
    return {"headers": h, "secret": plain["id"], "json_secret": js["id"]}


async def register(client: Any, org: dict[str, Any], bindings: list[dict[str, Any]], name: str = "t") -> Any:
    return await client.post("/api/v1/tools", json={"name": name, "base_url": PUBLIC, "bindings": bindings},
                             headers=org["headers"])


def header(org: dict[str, Any], **over: Any) -> dict[str, Any]:
    return {"location": "header", "name": "Authorization", "secret_id": org["secret"], **over}


# -- injector location ---------------------------------------------------------------------------------

@pytest.mark.parametrize("location", ["cookie", "carrier-pigeon", "HEADER", "body"])
async def test_unknown_injector_location_is_422(client, org, location):
    body = await assert_error(await register(client, org, [header(org, location=location)]), 422, "unknown_injector")
    assert location in body["detail"] and "header" in body["detail"]  # names the known locations


@pytest.mark.parametrize("location", [None, ""])
async def test_missing_location_is_400(client, org, location):
    await assert_error(await register(client, org, [header(org, location=location)]), 400)


async def test_known_locations_accepted(client, org):
    tool = await ok(await register(client, org, [
        header(org), {"location": "query", "name": "api_key", "secret_id": org["secret"]},
        {"location": "json", "name": "token", "secret_id": org["secret"]}]), 201)
    assert [b["location"] for b in tool["bindings"]] == ["header", "query", "json"]


# -- the secret -----------------------------------------------------------------------------------------

async def test_dangling_secret_id_is_422(client, org):
    await assert_error(await register(client, org, [header(org, secret_id="sec_does_not_exist")]), 422,
                       "unknown_secret")


async def test_deleted_secret_id_is_422(client, org):
    h = org["headers"]
    made = await ok(await client.post("/api/v1/secrets", json={"name": "gone", "value": "v"}, headers=h), 201)
    await ok(await client.delete(f"/api/v1/secrets/{made['id']}", headers=h), 204)
    await assert_error(await register(client, org, [header(org, secret_id=made["id"])]), 422, "unknown_secret")


async def test_other_org_secret_id_is_422(client, org):
    other = await membership.create_org(client.app[SERVICES], slug="globex", email="owner@globex.test")
    theirs = await ok(await client.post("/api/v1/secrets", json={"name": "theirs", "value": "v"},
                                        headers={"X-Treg-Token": other["token"]}), 201)
    await assert_error(await register(client, org, [header(org, secret_id=theirs["id"])]), 422, "unknown_secret")
    # and on PATCH too
    tool = await ok(await register(client, org, [header(org)]), 201)
    await assert_error(await client.patch(f"/api/v1/tools/{tool['id']}", json={
        "bindings": [header(org, secret_id=theirs["id"])]}, headers=org["headers"]), 422, "unknown_secret")


@pytest.mark.parametrize("over", [
    {"secret_id": None},  # neither
    {"secret_id": ""},  # neither (empty)
    {"platform_setting": "TREG_PLATFORM_ADS_TOKEN"},  # both
])
async def test_exactly_one_of_secret_id_and_platform_setting(client, org, over):
    await assert_error(await register(client, org, [header(org, **over)]), 400, "invalid_binding")


async def test_platform_setting_binding_accepted(client, org):
    svc = client.app[SERVICES]
    svc.settings = svc.settings.replace(tool_platform_settings=("TREG_PLATFORM_ADS_TOKEN",))
    tool = await ok(await register(client, org, [{"location": "header", "name": "developer-token",
                                                  "platform_setting": "TREG_PLATFORM_ADS_TOKEN"}]), 201)
    assert tool["bindings"][0]["platform_setting"] == "TREG_PLATFORM_ADS_TOKEN"
    assert "secret_id" not in tool["bindings"][0]
    await assert_error(await register(client, org, [{"location": "header", "name": "x",
                                                     "platform_setting": "not a name"}], name="t2"), 400)


async def test_secret_field_needs_a_json_secret(client, org):
    await assert_error(await register(client, org, [header(org, secret_field="access_token")]), 422)
    tool = await ok(await register(client, org, [header(org, secret_id=org["json_secret"],
                                                        secret_field="access_token")]), 201)
    assert tool["bindings"][0]["secret_field"] == "access_token"


@pytest.mark.parametrize("field", ["", "   ", None])
async def test_empty_secret_field_is_400(client, org, field):
    await assert_error(await register(client, org, [header(org, secret_id=org["json_secret"],
                                                           secret_field=field)]), 400)


# -- the format -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["{token}", "{0}", "{secret.x}", "{}", "{", "}", "Bearer {secret", "{secret}}",
                                 "{secret!r}", "{secret:>40}", "{secret[0]}", "{Secret}", "{secret}{key}",
                                 "{ secret }", ""])
async def test_format_with_another_placeholder_is_400(client, org, fmt):
    await assert_error(await register(client, org, [header(org, format=fmt)]), 400, "invalid_format")


@pytest.mark.parametrize("fmt", ["{secret}", "Bearer {secret}", "token={secret}&v=2", "{secret}{secret}",
                                 "2025-11-01", "{{literal}} {secret}"])
async def test_formats_accepted(client, org, fmt):
    tool = await ok(await register(client, org, [header(org, format=fmt)]), 201)
    assert tool["bindings"][0]["format"] == fmt  # stored as given; a format without {secret} is a constant


async def test_format_defaults_to_secret(client, org):
    tool = await ok(await register(client, org, [header(org)]), 201)
    assert tool["bindings"][0]["format"] == "{secret}"


# -- names and targets ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["", "   ", None])
@pytest.mark.parametrize("location", ["header", "query", "json"])
async def test_empty_binding_name_is_400(client, org, name, location):
    await assert_error(await register(client, org, [header(org, location=location, name=name)]), 400)


@pytest.mark.parametrize("name", ["Bad Header", "X-Key\r\nX-Evil: 1", "Key:", "", "X-Treg-Org", "x-treg-anything"])
async def test_unusable_header_name_is_400(client, org, name):
    await assert_error(await register(client, org, [header(org, name=name)]), 400)


async def test_header_format_with_newline_is_400(client, org):
    await assert_error(await register(client, org, [header(org, format="Bearer {secret}\r\nX-Evil: 1")]), 400)


@pytest.mark.parametrize("first,second", [
    (("header", "Authorization"), ("header", "Authorization")),
    (("header", "Authorization"), ("header", "authorization")),
    (("header", "X-API-KEY"), ("header", "x-api-key")),
    (("query", "key"), ("query", "key")),
    (("json", "token"), ("json", "token")),
])
async def test_two_bindings_on_one_target_are_400(client, org, first, second):
    bindings = [{"location": loc, "name": name, "secret_id": org["secret"]} for loc, name in (first, second)]
    await assert_error(await register(client, org, bindings), 400, "duplicate_binding")


async def test_distinct_targets_are_fine(client, org):
    bindings = [{"location": loc, "name": name, "secret_id": org["secret"]} for loc, name in [
        ("header", "X-Key"), ("query", "X-Key"), ("json", "X-Key"),  # same name, different locations
        ("query", "key"), ("query", "Key"),  # query names are case-sensitive
        ("json", "token"), ("json", "Token"),
    ]]
    tool = await ok(await register(client, org, bindings), 201)
    assert len(tool["bindings"]) == 7


async def test_binding_with_unknown_key_is_400(client, org):
    await assert_error(await register(client, org, [header(org, secret="sk_inline")]), 400, "invalid_binding")


# -- the tool name --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["", "   ", "a/b", "/a", "a/", "has space", "tab\tname", "x" * 201, None, 5])
async def test_bad_tool_name_is_400(client, org, name):
    resp = await client.post("/api/v1/tools", json={"name": name, "base_url": PUBLIC, "bindings": []},
                             headers=org["headers"])
    await assert_error(resp, 400)


async def test_duplicate_tool_name_is_409_per_org(client, org):
    await ok(await register(client, org, [], name="stripe"), 201)
    await assert_error(await register(client, org, [], name="stripe"), 409, "tool_exists")
    other = await membership.create_org(client.app[SERVICES], slug="globex", email="owner@globex.test")
    resp = await client.post("/api/v1/tools", json={"name": "stripe", "base_url": PUBLIC, "bindings": []},
                             headers={"X-Treg-Token": other["token"]})
    await ok(resp, 201)


async def test_nothing_is_stored_when_refused(client, org):
    await assert_error(await register(client, org, [header(org), header(org, name="authorization")]), 400)
    await assert_error(await register(client, org, [header(org, location="cookie")]), 422)
    listed = await ok(await client.get("/api/v1/tools", headers=org["headers"]))
    assert listed["tools"] == []
