"""Tool resolution: named and URL passthrough, ACL-filtered candidates, 403 vs 404, 409 ties."""

from treg.testing import raw_upstream


async def test_named_miss_is_404_with_error_body(gateway):
    r = await gateway.call("GET", "/call/nope/x")
    assert r.status == 404
    body = await r.json()
    assert body["error"] == "tool_not_found" and body["blame"] == "caller"
    assert r.headers["X-Treg-Error"] == "1" and r.headers["X-Treg-Call-Id"].startswith("call_")


async def test_dotted_miss_hints_at_same_prefix_tool(gateway):
    async with raw_upstream() as up:
        await gateway.tool("google-analytics", up.url)
        r = await gateway.call("GET", "/call/google-analytics.report")
        body = await r.json()
        assert r.status == 404 and "/call/google-analytics/" in body["hint"] and body["did_you_mean"]


async def test_passthrough_longest_prefix_on_segment_boundary(gateway):
    async with raw_upstream() as up:
        s1 = await gateway.secret("secret-one-value", name="one")
        s2 = await gateway.secret("secret-two-value", name="two")
        await gateway.tool("v1", up.url + "/v1", [{"location": "header", "name": "X-Key", "secret_id": s1}])
        await gateway.tool("v1-admin", up.url + "/v1/admin", [{"location": "header", "name": "X-Key", "secret_id": s2}])
        r = await gateway.call("GET", f"/call/{up.url}/v1/admin/users")
        assert r.status == 200
        assert up.last.header("X-Key") == "secret-two-value"
        r = await gateway.call("GET", f"/call/{up.url}/v1/administrators")
        assert r.status == 200
        assert up.last.header("X-Key") == "secret-one-value"  # /v1/admin must not match /v1/administrators
        assert up.last.target == "/v1/administrators"
        r = await gateway.call("GET", f"/call/{up.url}/v10/x")
        assert r.status == 404  # /v1 never matches /v10


async def test_passthrough_single_slash_scheme_is_restored(gateway):
    async with raw_upstream() as up:
        await gateway.tool("t", up.url + "/api")
        r = await gateway.call("GET", "/call/" + up.url.replace("http://", "http:/") + "/api/me?q=1")
        assert r.status == 200 and up.last.target == "/api/me?q=1"


async def test_passthrough_tie_is_409_naming_tools(gateway):
    async with raw_upstream() as up:
        await gateway.tool("a", up.url + "/v1")
        await gateway.tool("b", up.url + "/v1/")  # a trailing-slash duplicate is a real tie
        r = await gateway.call("GET", f"/call/{up.url}/v1/x")
        body = await r.json()
        assert r.status == 409 and body["error"] == "ambiguous_tool"
        assert sorted(c["name"] for c in body["candidates"]) == ["a", "b"]
        assert "/call/a/" in body["hint"]


async def test_passthrough_tie_prefers_provider_backed_tool(gateway):
    async with raw_upstream() as up:
        plain = await gateway.secret("stale-hand-key", name="plain")
        backed = await gateway.secret("registry-key-1", name="backed", provider="acme")
        await gateway.tool("hand", up.url + "/v1", [{"location": "header", "name": "X-Key", "secret_id": plain}])
        await gateway.tool("registry", up.url + "/v1", [{"location": "header", "name": "X-Key", "secret_id": backed}])
        r = await gateway.call("GET", f"/call/{up.url}/v1/x")
        assert r.status == 200 and up.last.header("X-Key") == "registry-key-1"


async def test_acl_filters_candidates_and_acl_only_miss_is_403(gateway):
    async with raw_upstream() as up:
        project = await gateway.api("POST", "/api/v1/projects", json={"name": "p1"}, expect=201)
        other = await gateway.api("POST", "/api/v1/projects", json={"name": "p2"}, expect=201)
        member = await gateway.member("m@acme.test", project_ids=[project["id"]])
        await gateway.tool("hidden", up.url + "/v1", project_id=other["id"])
        r = await gateway.call("GET", f"/call/{up.url}/v1/x", as_=member["headers"])
        body = await r.json()
        assert r.status == 403 and body["error"] == "tool_forbidden"
        assert "hidden" not in body["detail"]  # names only the host, never an inaccessible tool
        # a same-host tool the member cannot use must not cause a 409 for them
        await gateway.tool("visible", up.url + "/v1", project_id=project["id"])
        r = await gateway.call("GET", f"/call/{up.url}/v1/x", as_=member["headers"])
        assert r.status == 200
        # the owner sees both: a genuine tie
        r = await gateway.call("GET", f"/call/{up.url}/v1/x")
        assert r.status == 409
        # named shape: resolves, then the ACL refuses
        r = await gateway.call("GET", "/call/hidden/x", as_=member["headers"])
        assert r.status == 403 and (await r.json())["error"] == "tool_forbidden"


async def test_allowed_member_ids(gateway):
    async with raw_upstream() as up:
        m1 = await gateway.member("m1@acme.test")
        m2 = await gateway.member("m2@acme.test")
        await gateway.tool("t", up.url, allowed_member_ids=[m1["member_id"]])
        assert (await gateway.call("GET", "/call/t/x", as_=m1["headers"])).status == 200
        assert (await gateway.call("GET", "/call/t/x", as_=m2["headers"])).status == 403


async def test_orgs_resolve_independently(gateway):
    from treg import membership

    async with raw_upstream() as up:
        await gateway.tool("t", up.url + "/mine")
        other = await membership.create_org(gateway.services, slug="other", email="o@other.test")
        r = await gateway.call("GET", "/call/t/x", as_={"X-Treg-Token": other["token"]})
        assert r.status == 404
        r = await gateway.call("GET", f"/call/{up.url}/mine/x", as_={"X-Treg-Token": other["token"]})
        assert r.status == 404
        assert len(up.exchanges) == 0


async def test_named_call_picks_its_tool_among_many(gateway):
    """Tools are looked up by name through an index built once per load (OrgTools.by_name), not a scan:
    with many tools in the org each name still reaches its own upstream path and credential."""
    async with raw_upstream() as up:
        for i in range(12):
            sid = await gateway.secret(f"secret-value-{i:02d}", name=f"s{i}")
            await gateway.tool(f"tool-{i}", f"{up.url}/t{i}", [{"location": "header", "name": "X-Key",
                                                                  "secret_id": sid}])
        for i in (0, 7, 11):
            r = await gateway.call("GET", f"/call/tool-{i}/ping")
            assert r.status == 200
            assert up.last.target == f"/t{i}/ping" and up.last.header("X-Key") == f"secret-value-{i:02d}"
