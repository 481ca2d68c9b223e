"""Deny rules on the resolved upstream: both call shapes, every role, segment-anchored paths, and the
host/path/method × member × project axes (each NULL-means-any, ANDed)."""

import pytest

from treg.domain.deny import DenyRule, first_match, host_matches, path_matches
from treg.testing import raw_upstream


def test_path_match_is_segment_anchored():
    assert path_matches("/v1/charges", "/v1/charges")
    assert path_matches("/v1/charges", "/v1/charges/ch_1")
    assert path_matches("/v1/charges/", "/v1/charges/ch_1")
    assert not path_matches("/v1/charges", "/v1/chargesX")
    assert path_matches(None, "/anything") and path_matches("/", "/x")


def test_host_match_port_and_case():
    assert host_matches("API.example.com", "api.example.com:8443", "https")
    assert host_matches("api.example.com:443", "api.example.com", "https")
    assert not host_matches("api.example.com:8443", "api.example.com", "https")
    assert not host_matches("example.com", "api.example.com", "https")


def test_axes_are_anded():
    rules = [DenyRule(id="r", host="h", path="/p", method="POST", member_id="m1", project_id="p1")]
    kw = dict(scheme="https", host="h", path="/p", method="POST", member_id="m1", project_id="p1")
    assert first_match(rules, **kw)
    for change in ({"method": "GET"}, {"member_id": "m2"}, {"project_id": None}, {"path": "/q"}, {"host": "x"}):
        assert first_match(rules, **{**kw, **change}) is None


@pytest.fixture
async def setup(gateway):
    async with raw_upstream() as up:
        await gateway.tool("t", up.url + "/v1")
        yield gateway, up


async def _deny(gateway, **rule):
    return await gateway.api("POST", "/api/v1/deny-rules", json=rule, expect=201)


async def test_deny_blocks_both_shapes_and_owner(setup):
    gateway, up = setup
    rule = await _deny(gateway, host="127.0.0.1", path="/v1/charges", reason="no refunds")
    for path in ("/call/t/charges", f"/call/{up.url}/v1/charges/ch_1", "/call/t/%63harges"):
        r = await gateway.call("POST", path)
        body = await r.json()
        assert r.status == 403, path
        assert body["error"] == "denied_by_rule" and body["rule"]["id"] == rule["id"]
        assert rule["id"] in body["detail"] and "no refunds" in body["detail"]
    assert (await gateway.call("POST", "/call/t/chargesX")).status == 200
    assert len(up.exchanges) == 1  # nothing denied reached the upstream


async def test_deny_member_and_method_axes(setup):
    gateway, up = setup
    m = await gateway.member("m@acme.test")
    await _deny(gateway, host="127.0.0.1", method="DELETE", member_id=m["member_id"])
    assert (await gateway.call("DELETE", "/call/t/x", as_=m["headers"])).status == 403
    assert (await gateway.call("GET", "/call/t/x", as_=m["headers"])).status == 200
    assert (await gateway.call("DELETE", "/call/t/x")).status == 200  # the owner is not that member


async def test_project_rule_fires_only_through_that_projects_tools(setup):
    gateway, up = setup
    p = await gateway.api("POST", "/api/v1/projects", json={"name": "p"}, expect=201)
    await gateway.tool("in-project", up.url + "/v1", project_id=p["id"])
    await _deny(gateway, host="127.0.0.1", project_id=p["id"])
    assert (await gateway.call("GET", "/call/in-project/x")).status == 403
    assert (await gateway.call("GET", "/call/t/x")).status == 200  # an org-wide tool is never caught


async def test_deny_is_audited_with_refused_by(setup):
    gateway, up = setup
    await _deny(gateway, host="127.0.0.1")
    r = await gateway.call("GET", "/call/t/x")
    call_id = r.headers["X-Treg-Call-Id"]
    detail = await gateway.api("GET", f"/api/v1/calls/{call_id}", expect=200)
    assert detail["outcome"] == "refused" and detail["refused_by"] == "deny" and detail["status"] == 403


async def test_new_rule_applies_at_once_despite_caches(setup):
    gateway, up = setup
    assert (await gateway.call("GET", "/call/t/x")).status == 200
    rule = await _deny(gateway, host="127.0.0.1")
    await _wait_until(lambda: gateway.call("GET", "/call/t/x"), 403)
    await gateway.api("DELETE", f"/api/v1/deny-rules/{rule['id']}", expect=204)
    await _wait_until(lambda: gateway.call("GET", "/call/t/x"), 200)


async def _wait_until(make_call, status, tries=50):
    import asyncio

    for _ in range(tries):  # NOTIFY arrives asynchronously, within milliseconds
        r = await make_call()
        if r.status == status:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"never saw {status}")
