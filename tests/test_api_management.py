"""The management API of the contract (/work/shared/spec/api.md), over real HTTP on the test database.

Every route of the management table: status codes, answer shapes, the error body with
``X-Treg-Error: 1`` on bad input, identity (401/403), roles, a member's project scope, and tokens.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from treg import membership
from treg.keys import SERVICES
from treg.testing import add_member

PUBLIC = "https://api.example.com/v1"


async def assert_error(resp: Any, status: int, code: str | None = None) -> dict[str, Any]:
    """The contract's error body: JSON {error, detail, blame}, status, and X-Treg-Error: 1."""
    assert resp.status == status, (resp.status, await resp.text())
    assert resp.headers.get("X-Treg-Error") == "1"
    assert resp.content_type == "application/json"
    body = await resp.json()
    assert isinstance(body.get("error"), str) and body["error"]
    assert isinstance(body.get("detail"), str) and body["detail"]
    assert body.get("blame") in ("caller", "treg", "upstream", "org_connection")
    if code is not None:
        assert body["error"] == code, body
    return body


async def ok(resp: Any, status: int = 200) -> Any:
    assert resp.status == status, (resp.status, await resp.text())
    assert "X-Treg-Error" not in resp.headers
    return await resp.json() if status != 204 else None


async def new_secret(client: Any, headers: dict[str, str], name: str = "key", value: Any = "sk_test_1") -> str:
    out = await ok(await client.post("/api/v1/secrets", json={"name": name, "value": value}, headers=headers), 201)
    return out["id"]


async def new_tool(client: Any, headers: dict[str, str], name: str, **extra: Any) -> dict[str, Any]:
    body = {"name": name, "base_url": PUBLIC, "bindings": [], **extra}
    return await ok(await client.post("/api/v1/tools", json=body, headers=headers), 201)


# -- identity -----------------------------------------------------------------------------------------

async def test_me_shape(client, owner):
    body = await ok(await client.get("/api/v1/me", headers=owner["headers"]))
    assert {"org_id", "org_slug", "member_id", "role"} <= set(body)
    assert (body["org_id"], body["org_slug"], body["member_id"], body["role"]) == (
        owner["org_id"], "acme", owner["member_id"], "owner")


async def test_missing_token_is_401(client, owner):
    await assert_error(await client.get("/api/v1/me"), 401)
    await assert_error(await client.get("/api/v1/me", headers={"X-Treg-Token": ""}), 401)


async def test_unknown_token_is_401(client, owner):
    await assert_error(await client.get("/api/v1/me", headers={"X-Treg-Token": "treg_nope"}), 401)
    # a near miss of a real token is still unknown
    await assert_error(await client.get("/api/v1/me", headers={"X-Treg-Token": owner["token"][:-1] + "x"}), 401)


async def test_revoked_token_is_401(client, owner):
    created = await ok(await client.post("/api/v1/tokens", headers=owner["headers"]), 201)
    second = {"X-Treg-Token": created["token"]}
    await ok(await client.get("/api/v1/me", headers=second))
    listed = await ok(await client.get("/api/v1/tokens", headers=owner["headers"]))
    token_id = next(t["id"] for t in listed["tokens"] if created["token"].startswith(t["prefix"])
                    and t["revoked_at"] is None and t["id"] != _token_id_of(listed, owner["token"]))
    await ok(await client.delete(f"/api/v1/tokens/{token_id}", headers=owner["headers"]), 204)
    await assert_error(await client.get("/api/v1/me", headers=second), 401)
    # the owner's first token is untouched
    await ok(await client.get("/api/v1/me", headers=owner["headers"]))


def _token_id_of(listed: dict[str, Any], token: str) -> str | None:
    # prefixes are 12 characters of a random token: unique enough to tell our two tokens apart
    ids = [t["id"] for t in listed["tokens"] if token.startswith(t["prefix"])]
    return ids[0] if len(ids) == 1 else None


async def test_x_treg_org_names_the_token_org(client, owner):
    svc = client.app[SERVICES]
    other = await membership.create_org(svc, slug="globex", email="owner@globex.test")
    for hint in ("acme", owner["org_id"]):
        body = await ok(await client.get("/api/v1/me", headers={**owner["headers"], "X-Treg-Org": hint}))
        assert body["org_id"] == owner["org_id"]
    for hint in ("globex", other["org_id"]):
        await assert_error(await client.get("/api/v1/me", headers={**owner["headers"], "X-Treg-Org": hint}), 403)
        await assert_error(await client.get("/api/v1/tools", headers={**owner["headers"], "X-Treg-Org": hint}), 403)
    # an org that does not exist at all is not this token's org either
    await assert_error(await client.get("/api/v1/me", headers={**owner["headers"], "X-Treg-Org": "nope"}), 403)


async def test_same_user_in_two_orgs_selects_with_token(client, owner):
    svc = client.app[SERVICES]
    other = await membership.create_org(svc, slug="globex", email="owner@globex.test")
    # the acme owner joins globex as an admin: one user, two memberships, one token each
    joined = await add_member(client, {"X-Treg-Token": other["token"]}, "owner@acme.test", role="admin")
    me = await ok(await client.get("/api/v1/me", headers={**joined["headers"], "X-Treg-Org": "globex"}))
    assert me["org_slug"] == "globex" and me["role"] == "admin"
    await assert_error(await client.get("/api/v1/me", headers={**joined["headers"], "X-Treg-Org": "acme"}), 403)


# -- tokens ---------------------------------------------------------------------------------------------

async def test_tokens_shown_once_and_stored_hashed(client, owner):
    svc = client.app[SERVICES]
    created = await ok(await client.post("/api/v1/tokens", json={}, headers=owner["headers"]), 201)
    token = created["token"]
    assert token.startswith("treg_") and len(token) > 40
    assert created["member_id"] == owner["member_id"]
    listed = await ok(await client.get("/api/v1/tokens", headers=owner["headers"]))
    assert len(listed["tokens"]) == 2
    text = str(listed)
    for plain in (token, owner["token"]):
        assert plain not in text and hashlib.sha256(plain.encode()).hexdigest() not in text
    async with svc.db.tx() as tx:
        rows = await tx.fetch_all("SELECT * FROM tokens")
    assert len(rows) == 2
    hashes = {r["token_hash"] for r in rows}
    assert hashes == {hashlib.sha256(t.encode()).hexdigest() for t in (token, owner["token"])}
    for row in rows:
        for value in row.values():
            assert token not in str(value) and owner["token"] not in str(value)


async def test_last_used_at_recorded(client, owner):
    created = await ok(await client.post("/api/v1/tokens", headers=owner["headers"]), 201)
    listed = await ok(await client.get("/api/v1/tokens", headers=owner["headers"]))
    fresh = [t for t in listed["tokens"] if created["token"].startswith(t["prefix"])]
    assert len(fresh) == 1 and fresh[0]["last_used_at"] is None
    await ok(await client.get("/api/v1/me", headers={"X-Treg-Token": created["token"]}))
    # last use is written in the audit writer's batches: flush, do not wait
    await client.app[SERVICES].audit.flush()
    listed = await ok(await client.get("/api/v1/tokens", headers=owner["headers"]))
    used = next(t for t in listed["tokens"] if t["id"] == fresh[0]["id"])
    assert used["last_used_at"] is not None


async def test_member_tokens(client, owner):
    member = await add_member(client, owner["headers"], "m@acme.test")
    # a member may mint and list their own tokens, not another member's
    mine = await ok(await client.post("/api/v1/tokens", headers=member["headers"]), 201)
    assert mine["member_id"] == member["member_id"]
    listed = await ok(await client.get("/api/v1/tokens", headers=member["headers"]))
    assert {t["member_id"] for t in listed["tokens"]} == {member["member_id"]}
    await assert_error(await client.post("/api/v1/tokens", json={"member_id": owner["member_id"]},
                                         headers=member["headers"]), 403)
    owner_tokens = await ok(await client.get("/api/v1/tokens", headers=owner["headers"]))
    owner_token_id = next(t["id"] for t in owner_tokens["tokens"] if t["member_id"] == owner["member_id"])
    await assert_error(await client.delete(f"/api/v1/tokens/{owner_token_id}", headers=member["headers"]), 403)
    # an owner may mint one for the member
    minted = await ok(await client.post("/api/v1/tokens", json={"member_id": member["member_id"]},
                                        headers=owner["headers"]), 201)
    me = await ok(await client.get("/api/v1/me", headers={"X-Treg-Token": minted["token"]}))
    assert me["member_id"] == member["member_id"]
    await assert_error(await client.delete("/api/v1/tokens/tok_nope", headers=owner["headers"]), 404)
    await assert_error(await client.post("/api/v1/tokens", json={"member_id": "mem_nope"},
                                         headers=owner["headers"]), 404)


# -- members and projects -------------------------------------------------------------------------------

async def test_members_and_projects(client, owner):
    project = await ok(await client.post("/api/v1/projects", json={"name": "web"}, headers=owner["headers"]), 201)
    assert {"id", "name"} <= set(project) and project["name"] == "web"
    await assert_error(await client.post("/api/v1/projects", json={"name": "web"}, headers=owner["headers"]), 409)
    member = await add_member(client, owner["headers"], "M@Acme.test", project_ids=[project["id"]])
    assert {"member_id", "token"} <= set(member)
    assert member["project_ids"] == [project["id"]] and member["role"] == "member"
    everyone = await add_member(client, owner["headers"], "all@acme.test", project_ids=None)
    assert everyone["project_ids"] is None
    default = await add_member(client, owner["headers"], "default@acme.test", role="admin")
    assert default["project_ids"] is None and default["role"] == "admin"
    me = await ok(await client.get("/api/v1/me", headers=member["headers"]))
    assert me["role"] == "member" and me["member_id"] == member["member_id"]
    await assert_error(await client.post("/api/v1/members", json={"email": "m@acme.test"},
                                         headers=owner["headers"]), 409)
    await assert_error(await client.post("/api/v1/members", json={"email": "x@acme.test", "project_ids": ["prj_x"]},
                                         headers=owner["headers"]), 422)
    await assert_error(await client.post("/api/v1/members", json={"email": "x@acme.test", "role": "king"},
                                         headers=owner["headers"]), 400)
    await assert_error(await client.post("/api/v1/members", json={"email": "not-an-email"},
                                         headers=owner["headers"]), 400)
    listed = await ok(await client.get("/api/v1/members", headers=owner["headers"]))
    assert len(listed["members"]) == 4


async def test_admin_cannot_add_owner(client, owner):
    admin = await add_member(client, owner["headers"], "a@acme.test", role="admin")
    await assert_error(await client.post("/api/v1/members", json={"email": "o2@acme.test", "role": "owner"},
                                         headers=admin["headers"]), 403)
    await ok(await client.post("/api/v1/members", json={"email": "m2@acme.test"}, headers=admin["headers"]), 201)


async def test_member_role_cannot_manage(client, owner):
    member = await add_member(client, owner["headers"], "m@acme.test")
    tool = await new_tool(client, owner["headers"], "stripe")
    secret_id = await new_secret(client, owner["headers"])
    rule = await ok(await client.post("/api/v1/deny-rules", json={"host": "api.example.com"},
                                      headers=owner["headers"]), 201)
    h = member["headers"]
    refused = [
        client.post("/api/v1/members", json={"email": "x@acme.test"}, headers=h),
        client.get("/api/v1/members", headers=h),
        client.post("/api/v1/projects", json={"name": "p"}, headers=h),
        client.post("/api/v1/secrets", json={"name": "s", "value": "v"}, headers=h),
        client.get("/api/v1/secrets", headers=h),
        client.delete(f"/api/v1/secrets/{secret_id}", headers=h),
        client.post("/api/v1/tools", json={"name": "t", "base_url": PUBLIC, "bindings": []}, headers=h),
        client.patch(f"/api/v1/tools/{tool['id']}", json={"name": "t2"}, headers=h),
        client.delete(f"/api/v1/tools/{tool['id']}", headers=h),
        client.post("/api/v1/deny-rules", json={"host": "a.example.com"}, headers=h),
        client.get("/api/v1/deny-rules", headers=h),
        client.delete(f"/api/v1/deny-rules/{rule['id']}", headers=h),
    ]
    for request in refused:
        await assert_error(await request, 403)
    # nothing changed
    assert len((await ok(await client.get("/api/v1/secrets", headers=owner["headers"])))["secrets"]) == 1
    assert len((await ok(await client.get("/api/v1/deny-rules", headers=owner["headers"])))["deny_rules"]) == 1
    assert (await ok(await client.get(f"/api/v1/tools/{tool['id']}", headers=owner["headers"])))["name"] == "stripe"
    # but the member may read the tools they may use
    assert [t["name"] for t in (await ok(await client.get("/api/v1/tools", headers=h)))["tools"]] == ["stripe"]


# -- who may use a tool -----------------------------------------------------------------------------------

async def test_tools_listed_are_those_the_caller_may_use(client, owner):
    h = owner["headers"]
    p1 = (await ok(await client.post("/api/v1/projects", json={"name": "p1"}, headers=h), 201))["id"]
    p2 = (await ok(await client.post("/api/v1/projects", json={"name": "p2"}, headers=h), 201))["id"]
    scoped = await add_member(client, h, "scoped@acme.test", project_ids=[p1])
    unscoped = await add_member(client, h, "free@acme.test", project_ids=None)
    nothing = await add_member(client, h, "none@acme.test", project_ids=[])
    admin = await add_member(client, h, "admin@acme.test", role="admin", project_ids=[p1])
    tools = {
        "open": await new_tool(client, h, "open"),
        "in-p1": await new_tool(client, h, "in-p1", project_id=p1),
        "in-p2": await new_tool(client, h, "in-p2", project_id=p2),
        "p1-only-free": await new_tool(client, h, "p1-only-free", project_id=p1,
                                       allowed_member_ids=[unscoped["member_id"]]),
        "only-scoped": await new_tool(client, h, "only-scoped", allowed_member_ids=[scoped["member_id"]]),
        "p2-scoped": await new_tool(client, h, "p2-scoped", project_id=p2, allowed_member_ids=[scoped["member_id"]]),
        "nobody": await new_tool(client, h, "nobody", allowed_member_ids=[]),
    }
    expected = {
        "owner": (h, set(tools)),
        "admin": (admin["headers"], set(tools)),
        "scoped": (scoped["headers"], {"open", "in-p1", "only-scoped"}),
        "unscoped": (unscoped["headers"], {"open", "in-p1", "in-p2", "p1-only-free"}),
        "nothing": (nothing["headers"], {"open"}),
    }
    for who, (headers, names) in expected.items():
        listed = await ok(await client.get("/api/v1/tools", headers=headers))
        assert {t["name"] for t in listed["tools"]} == names, who
        for name, tool in tools.items():
            resp = await client.get(f"/api/v1/tools/{tool['id']}", headers=headers)
            if name in names:
                assert (await ok(resp))["id"] == tool["id"]
            else:
                await assert_error(resp, 404, "tool_not_found")


# -- tools --------------------------------------------------------------------------------------------

TOOL_KEYS = {"id", "name", "base_url", "host", "bindings", "project_id", "allowed_member_ids", "created_at"}


async def test_tool_crud(client, owner):
    h = owner["headers"]
    secret_id = await new_secret(client, h)
    body = {"name": "stripe", "base_url": "https://User:pw@API.Stripe.com:8443/v1?api-version=2",
            "bindings": [{"location": "header", "name": "Authorization", "format": "Bearer {secret}",
                          "secret_id": secret_id}]}
    tool = await ok(await client.post("/api/v1/tools", json=body, headers=h), 201)
    assert TOOL_KEYS <= set(tool)
    assert tool["host"] == "api.stripe.com:8443"  # netloc without user-info, port kept
    # user-info is a credential: written, never read back (the relay still sends it)
    assert tool["base_url"] == "https://[REDACTED]@API.Stripe.com:8443/v1?api-version=2"
    assert tool["bindings"] == [{"location": "header", "name": "Authorization", "format": "Bearer {secret}",
                                 "secret_id": secret_id}]
    assert tool["project_id"] is None and tool["allowed_member_ids"] is None
    # default format
    plain = await ok(await client.post("/api/v1/tools", json={
        "name": "plain", "base_url": "http://api.example.com",
        "bindings": [{"location": "query", "name": "key", "secret_id": secret_id}]}, headers=h), 201)
    assert plain["bindings"][0]["format"] == "{secret}" and plain["host"] == "api.example.com"

    got = await ok(await client.get(f"/api/v1/tools/{tool['id']}", headers=h))
    assert got == tool | {"updated_at": got["updated_at"]}
    listed = await ok(await client.get("/api/v1/tools", headers=h))
    assert [t["name"] for t in listed["tools"]] == ["plain", "stripe"]

    project = await ok(await client.post("/api/v1/projects", json={"name": "web"}, headers=h), 201)
    patched = await ok(await client.patch(f"/api/v1/tools/{tool['id']}", json={
        "name": "stripe2", "base_url": "https://api.stripe.com", "project_id": project["id"],
        "allowed_member_ids": [owner["member_id"]], "bindings": []}, headers=h))
    assert (patched["name"], patched["host"], patched["project_id"], patched["allowed_member_ids"],
            patched["bindings"]) == ("stripe2", "api.stripe.com", project["id"], [owner["member_id"]], [])
    assert (await ok(await client.get(f"/api/v1/tools/{tool['id']}", headers=h)))["name"] == "stripe2"
    # clearing the scope again
    cleared = await ok(await client.patch(f"/api/v1/tools/{tool['id']}", json={
        "project_id": None, "allowed_member_ids": None}, headers=h))
    assert cleared["project_id"] is None and cleared["allowed_member_ids"] is None and cleared["name"] == "stripe2"
    # PATCH validates like POST
    await assert_error(await client.patch(f"/api/v1/tools/{tool['id']}", json={"name": "plain"}, headers=h),
                       409, "tool_exists")
    await assert_error(await client.patch(f"/api/v1/tools/{tool['id']}", json={"base_url": "http://10.0.0.1"},
                                          headers=h), 422, "ssrf_refused")
    await assert_error(await client.patch(f"/api/v1/tools/{tool['id']}", json={"colour": "red"}, headers=h), 400)
    await assert_error(await client.patch(f"/api/v1/tools/{tool['id']}", json={
        "bindings": [{"location": "carrier-pigeon", "name": "x", "secret_id": secret_id}]}, headers=h), 422)
    await assert_error(await client.patch("/api/v1/tools/tool_nope", json={"name": "x"}, headers=h), 404)

    # a secret a tool still binds cannot be deleted
    await assert_error(await client.delete(f"/api/v1/secrets/{secret_id}", headers=h), 409, "secret_in_use")
    await ok(await client.delete(f"/api/v1/tools/{plain['id']}", headers=h), 204)
    await assert_error(await client.get(f"/api/v1/tools/{plain['id']}", headers=h), 404, "tool_not_found")
    await assert_error(await client.delete(f"/api/v1/tools/{plain['id']}", headers=h), 404, "tool_not_found")
    await ok(await client.delete(f"/api/v1/secrets/{secret_id}", headers=h), 204)


async def test_tools_are_per_org(client, owner):
    svc = client.app[SERVICES]
    other = await membership.create_org(svc, slug="globex", email="owner@globex.test")
    oh = {"X-Treg-Token": other["token"]}
    mine = await new_tool(client, owner["headers"], "stripe")
    theirs = await new_tool(client, oh, "stripe")  # the same name in another org is fine
    assert mine["id"] != theirs["id"]
    for method in ("get", "delete"):
        await assert_error(await getattr(client, method)(f"/api/v1/tools/{theirs['id']}",
                                                         headers=owner["headers"]), 404)
    await assert_error(await client.patch(f"/api/v1/tools/{theirs['id']}", json={"name": "x"},
                                          headers=owner["headers"]), 404)
    assert [t["id"] for t in (await ok(await client.get("/api/v1/tools", headers=oh)))["tools"]] == [theirs["id"]]
    # scope ids of another org are refused
    other_project = await ok(await client.post("/api/v1/projects", json={"name": "p"}, headers=oh), 201)
    await assert_error(await client.post("/api/v1/tools", json={
        "name": "x", "base_url": PUBLIC, "bindings": [], "project_id": other_project["id"]},
        headers=owner["headers"]), 422)
    await assert_error(await client.post("/api/v1/tools", json={
        "name": "x", "base_url": PUBLIC, "bindings": [], "allowed_member_ids": [other["member_id"]]},
        headers=owner["headers"]), 422)


# -- secrets ------------------------------------------------------------------------------------------

async def test_secrets_list_without_values_and_delete(client, owner):
    h = owner["headers"]
    made = await ok(await client.post("/api/v1/secrets", json={"name": "stripe", "value": "sk_live_visible?",
                                                               "provider": "stripe"}, headers=h), 201)
    assert set(made) >= {"id", "name", "provider", "created_at"}
    assert "value" not in made and "blob" not in made
    assert (made["name"], made["provider"]) == ("stripe", "stripe")
    js = await ok(await client.post("/api/v1/secrets", json={"name": "oauth", "value": {"access_token": "at_1"}},
                                    headers=h), 201)
    assert js["provider"] is None
    listed = await ok(await client.get("/api/v1/secrets", headers=h))
    assert [s["name"] for s in listed["secrets"]] == ["stripe", "oauth"]
    for s in listed["secrets"]:
        assert not ({"value", "blob", "key_id"} & set(s))
    assert "sk_live_visible" not in str(listed) and "at_1" not in str(listed)
    await ok(await client.delete(f"/api/v1/secrets/{made['id']}", headers=h), 204)
    await assert_error(await client.delete(f"/api/v1/secrets/{made['id']}", headers=h), 404, "secret_not_found")
    listed = await ok(await client.get("/api/v1/secrets", headers=h))
    assert [s["id"] for s in listed["secrets"]] == [js["id"]]
    # another org cannot see or delete it
    other = await membership.create_org(client.app[SERVICES], slug="globex", email="owner@globex.test")
    oh = {"X-Treg-Token": other["token"]}
    assert (await ok(await client.get("/api/v1/secrets", headers=oh)))["secrets"] == []
    await assert_error(await client.delete(f"/api/v1/secrets/{js['id']}", headers=oh), 404)


@pytest.mark.parametrize("body", [
    {"name": "", "value": "v"}, {"name": "   ", "value": "v"}, {"value": "v"}, {"name": "n"},
    {"name": "n", "value": ""}, {"name": "n", "value": {}}, {"name": "n", "value": 5}, {"name": "n", "value": ["a"]},
    {"name": "n", "value": None}, {"name": 5, "value": "v"}, {"name": "n", "value": "v", "provider": "Bad Provider"},
    {"name": "n", "value": "v", "provider": 7}, {"name": "x" * 201, "value": "v"},
])
async def test_secret_bad_input_is_400(client, owner, body):
    await assert_error(await client.post("/api/v1/secrets", json=body, headers=owner["headers"]), 400)


# -- deny rules -----------------------------------------------------------------------------------------

async def test_deny_rules_crud(client, owner):
    h = owner["headers"]
    project = await ok(await client.post("/api/v1/projects", json={"name": "web"}, headers=h), 201)
    member = await add_member(client, h, "m@acme.test")
    rule = await ok(await client.post("/api/v1/deny-rules", json={
        "host": "API.Stripe.com:443", "path": "/v1/charges", "method": "post", "member_id": member["member_id"],
        "project_id": project["id"], "reason": "no charges from agents"}, headers=h), 201)
    assert rule["id"]
    assert (rule["host"], rule["path"], rule["method"], rule["member_id"], rule["project_id"], rule["reason"]) == (
        "api.stripe.com:443", "/v1/charges", "POST", member["member_id"], project["id"], "no charges from agents")
    bare = await ok(await client.post("/api/v1/deny-rules", json={"host": "api.example.com"}, headers=h), 201)
    assert bare["path"] is None and bare["method"] is None and bare["member_id"] is None
    listed = await ok(await client.get("/api/v1/deny-rules", headers=h))
    assert [r["id"] for r in listed["deny_rules"]] == [rule["id"], bare["id"]]
    await ok(await client.delete(f"/api/v1/deny-rules/{rule['id']}", headers=h), 204)
    await assert_error(await client.delete(f"/api/v1/deny-rules/{rule['id']}", headers=h), 404)
    listed = await ok(await client.get("/api/v1/deny-rules", headers=h))
    assert [r["id"] for r in listed["deny_rules"]] == [bare["id"]]
    await assert_error(await client.post("/api/v1/deny-rules", json={"host": "a.example.com", "member_id": "mem_x"},
                                         headers=h), 422)
    await assert_error(await client.post("/api/v1/deny-rules", json={"host": "a.example.com", "project_id": "prj_x"},
                                         headers=h), 422)
    other = await membership.create_org(client.app[SERVICES], slug="globex", email="owner@globex.test")
    oh = {"X-Treg-Token": other["token"]}
    assert (await ok(await client.get("/api/v1/deny-rules", headers=oh)))["deny_rules"] == []
    await assert_error(await client.delete(f"/api/v1/deny-rules/{bare['id']}", headers=oh), 404)


# -- malformed input is 400, never 500 -----------------------------------------------------------------------

BAD_BODIES = [b"{", b"[1, 2]", b'"a string"', b"42", b"null", b"", b"\xff\xfe{}", b'{"a": NaN', b"true"]


@pytest.mark.parametrize("raw", BAD_BODIES)
@pytest.mark.parametrize("path", ["/api/v1/members", "/api/v1/projects", "/api/v1/secrets", "/api/v1/tools",
                                  "/api/v1/deny-rules", "/api/v1/tokens"])
async def test_malformed_json_is_400(client, owner, path, raw):
    if path == "/api/v1/tokens" and raw == b"":
        pytest.skip("an empty body is a valid POST /api/v1/tokens (mint a token for yourself)")
    resp = await client.post(path, data=raw, headers={**owner["headers"], "Content-Type": "application/json"})
    await assert_error(resp, 400)


@pytest.mark.parametrize("raw", BAD_BODIES)
async def test_malformed_json_patch_is_400(client, owner, raw):
    tool = await new_tool(client, owner["headers"], "t")
    resp = await client.patch(f"/api/v1/tools/{tool['id']}", data=raw,
                              headers={**owner["headers"], "Content-Type": "application/json"})
    await assert_error(resp, 400)


WRONG_TYPES = [
    ("/api/v1/members", {"email": 5}),
    ("/api/v1/members", {"email": ["a@b.c"]}),
    ("/api/v1/members", {"email": "a@b.c", "role": 5}),
    ("/api/v1/members", {"email": "a@b.c", "role": ["admin"]}),
    ("/api/v1/members", {"email": "a@b.c", "project_ids": "prj_1"}),
    ("/api/v1/members", {"email": "a@b.c", "project_ids": [1, 2]}),
    ("/api/v1/members", {"email": "a@b.c", "project_ids": {"a": 1}}),
    ("/api/v1/projects", {"name": 5}),
    ("/api/v1/projects", {"name": None}),
    ("/api/v1/projects", {"name": {"x": 1}}),
    ("/api/v1/projects", {}),
    ("/api/v1/tokens", {"member_id": 5}),
    ("/api/v1/tokens", {"member_id": ["m"]}),
    ("/api/v1/tools", {"name": 5, "base_url": PUBLIC, "bindings": []}),
    ("/api/v1/tools", {"name": "t", "base_url": 5, "bindings": []}),
    ("/api/v1/tools", {"name": "t", "base_url": [PUBLIC], "bindings": []}),
    ("/api/v1/tools", {"name": "t", "base_url": PUBLIC, "bindings": "header"}),
    ("/api/v1/tools", {"name": "t", "base_url": PUBLIC, "bindings": {"location": "header"}}),
    ("/api/v1/tools", {"name": "t", "base_url": PUBLIC, "bindings": [5]}),
    ("/api/v1/tools", {"name": "t", "base_url": PUBLIC, "bindings": [{"location": 5, "name": "a", "secret_id": "s"}]}),
    ("/api/v1/tools", {"name": "t", "base_url": PUBLIC, "bindings": [{"location": "header", "name": 5,
                                                                       "secret_id": "s"}]}),
    ("/api/v1/tools", {"name": "t", "base_url": PUBLIC, "bindings": [{"location": "header", "name": "a",
                                                                       "secret_id": 5}]}),
    ("/api/v1/tools", {"name": "t", "base_url": PUBLIC, "bindings": [{"location": "header", "name": "a",
                                                                       "secret_id": "s", "format": 5}]}),
    ("/api/v1/tools", {"name": "t", "base_url": PUBLIC, "bindings": [{"location": "header", "name": "a",
                                                                       "secret_id": "s", "extra": 1}]}),
    ("/api/v1/tools", {"name": "t", "base_url": PUBLIC, "bindings": [], "project_id": 5}),
    ("/api/v1/tools", {"name": "t", "base_url": PUBLIC, "bindings": [], "project_id": ["p"]}),
    ("/api/v1/tools", {"name": "t", "base_url": PUBLIC, "bindings": [], "allowed_member_ids": "m"}),
    ("/api/v1/tools", {"name": "t", "base_url": PUBLIC, "bindings": [], "allowed_member_ids": [5]}),
    ("/api/v1/tools", {"name": "t", "base_url": "http://[::1", "bindings": []}),
    ("/api/v1/tools", {"name": "t", "base_url": "http://api.example.com:99999", "bindings": []}),
    ("/api/v1/tools", {"name": "t", "base_url": "https://", "bindings": []}),
    ("/api/v1/tools", {"name": "t", "base_url": "https://api.example.com/a b", "bindings": []}),
    ("/api/v1/tools", {"name": "t", "base_url": "https://" + "a" * 400 + ".example.com", "bindings": []}),
    ("/api/v1/deny-rules", {"host": 5}),
    ("/api/v1/deny-rules", {"host": ""}),
    ("/api/v1/deny-rules", {"host": "a b"}),
    ("/api/v1/deny-rules", {"host": "a.example.com", "path": 5}),
    ("/api/v1/deny-rules", {"host": "a.example.com", "path": "no-slash"}),
    ("/api/v1/deny-rules", {"host": "a.example.com", "method": 5}),
    ("/api/v1/deny-rules", {"host": "a.example.com", "method": "GET /"}),
    ("/api/v1/deny-rules", {"host": "a.example.com", "member_id": 5}),
    ("/api/v1/deny-rules", {"host": "a.example.com", "member_id": ["m"]}),
    ("/api/v1/deny-rules", {"host": "a.example.com", "project_id": 5}),
    ("/api/v1/deny-rules", {"host": "a.example.com", "project_id": {"a": 1}}),
    ("/api/v1/deny-rules", {"host": "a.example.com", "reason": 5}),
    ("/api/v1/deny-rules", {"host": "a" * 400 + ".example.com"}),
    # a typo is refused, not ignored: ignoring it would grant more than the caller meant
    ("/api/v1/tools", {"name": "t", "base_url": PUBLIC, "bindings": [], "allowed_member": ["m"]}),
    ("/api/v1/members", {"email": "a@b.c", "project_id": "prj_1"}),
    ("/api/v1/deny-rules", {"host": "a.example.com", "methods": ["POST"]}),
    ("/api/v1/secrets", {"name": "n", "value": "v", "provder": "x"}),
    ("/api/v1/projects", {"name": "n", "colour": "red"}),
    ("/api/v1/tokens", {"member": "m"}),
]


@pytest.mark.parametrize("path,body", WRONG_TYPES, ids=[f"{p.rsplit('/', 1)[1]}-{i}" for i, (p, _) in
                                                        enumerate(WRONG_TYPES)])
async def test_wrong_types_are_400(client, owner, path, body):
    await assert_error(await client.post(path, json=body, headers=owner["headers"]), 400)


@pytest.mark.parametrize("body", [
    {"name": 5}, {"name": None}, {"base_url": None}, {"base_url": 5}, {"bindings": None}, {"bindings": "x"},
    {"project_id": 5}, {"allowed_member_ids": "m"}, {"allowed_member_ids": [1]},
])
async def test_wrong_types_patch_are_400(client, owner, body):
    tool = await new_tool(client, owner["headers"], "t")
    await assert_error(await client.patch(f"/api/v1/tools/{tool['id']}", json=body, headers=owner["headers"]), 400)


async def test_unknown_route_and_method_use_error_body(client, owner):
    await assert_error(await client.get("/api/v1/nope", headers=owner["headers"]), 404)
    await assert_error(await client.put("/api/v1/tools", json={}, headers=owner["headers"]), 405)


async def test_lone_surrogate_in_json_is_400_not_500(client, owner):
    raw = b'{"name": "k", "value": "\\udcff"}'
    resp = await client.post("/api/v1/secrets", data=raw, headers={**owner["headers"], "Content-Type": "application/json"})
    body = await resp.json()
    assert resp.status == 400 and body["error"] == "invalid_json" and resp.headers["X-Treg-Error"] == "1"
