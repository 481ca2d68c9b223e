"""Credential injection and the relay's security rules: each binding overwrites only its own target,
literal formats pin constants, JSON bindings reserialize strictly, platform settings are read from
treg's own settings, and what an upstream may not say (treg's cookies, X-Treg-* headers, sniffable or
scriptable content) never reaches the caller as if it were treg's."""

from __future__ import annotations

import json

import pytest

from treg import membership, testing
from treg.keys import SERVICES
from treg.settings import SecretStr
from treg.testing import http_response, raw_upstream


def hb(name: str, sid: str, fmt: str = "{secret}", **kw) -> dict:
    return {"location": "header", "name": name, "format": fmt, "secret_id": sid, **kw}


def qb(name: str, sid: str, fmt: str = "{secret}", **kw) -> dict:
    return {"location": "query", "name": name, "format": fmt, "secret_id": sid, **kw}


def jb(name: str, sid: str, fmt: str = "{secret}", **kw) -> dict:
    return {"location": "json", "name": name, "format": fmt, "secret_id": sid, **kw}


def refused(r, status: int, code: str, blame: str | None = None) -> dict:
    assert r.status == status, (r.status, r.body)
    assert r.header("X-Treg-Error") == "1"
    assert r.header("X-Treg-Call-Id").startswith("call_")
    body = r.json()
    assert body["error"] == code, body
    assert isinstance(body["detail"], str) and body["detail"]
    if blame:
        assert body["blame"] == blame, body
    return body


# -- injection ----------------------------------------------------------------------------------------

async def test_several_bindings_header_query_json(gateway, up):
    s_hdr = await gateway.secret("sk_header_111111", name="h")
    s_q = await gateway.secret("q&v=l ue/2222", name="q")
    s_json = await gateway.secret({"client_id": "cid", "token": "tok_json_3333"}, name="j")
    await gateway.tool("multi", up.url + "/v1", [hb("Authorization", s_hdr, "Bearer {secret}"),
                                                 qb("api_key", s_q),
                                                 jb("auth_token", s_json, secret_field="token")])
    body = json.dumps({"name": "Zoë 日本", "n": 1, "nested": {"a": [1, 2]}}).encode()
    r = await gateway.raw("POST", "/call/multi/items?x=1&api_key=callers&y=2&api_key=again",
                          [("Content-Type", "application/json"), ("Authorization", "Bearer caller")], body)
    assert r.status == 200, r.body
    ex = up.last
    assert ex.header_all("Authorization") == ["Bearer sk_header_111111"]
    assert ex.target == "/v1/items?x=1&y=2&api_key=q%26v%3Dl%20ue%2F2222"
    sent = json.loads(ex.body)
    assert sent == {"name": "Zoë 日本", "n": 1, "nested": {"a": [1, 2]}, "auth_token": "tok_json_3333"}
    assert "Zoë 日本".encode() in ex.body  # UTF-8, not \u escapes
    assert b"\\u" not in ex.body
    assert ex.header("Content-Length") == str(len(ex.body))
    assert ex.header("Content-Type") == "application/json"
    # the caller never sees a credential
    for secret in (b"sk_header_111111", b"tok_json_3333", b"2222"):
        assert secret not in r.head + r.body


async def test_header_binding_overwrites_every_caller_value(gateway, up):
    sid = await gateway.secret("real-key-123")
    await gateway.tool("t", up.url, [hb("X-Api-Key", sid)])
    await gateway.raw("GET", "/call/t/x", [("x-api-key", "forged-1"), ("X-API-KEY", "forged-2"), ("X-Other", "o")])
    assert up.last.header_all("X-Api-Key") == ["real-key-123"]
    assert b"forged" not in up.last.raw
    assert up.last.header("X-Other") == "o"


async def test_literal_format_pins_a_constant_over_the_callers_value(gateway, up):
    sid = await gateway.secret("the-key-abcdef")
    await gateway.tool("pinned", up.url, [hb("x-api-version", sid, "2025-11-01"), hb("Authorization", sid,
                                                                                      "Token {secret}")])
    await gateway.raw("GET", "/call/pinned/x", [("X-Api-Version", "1999-01-01")])
    assert up.last.header_all("x-api-version") == ["2025-11-01"]
    assert up.last.header("Authorization") == "Token the-key-abcdef"
    await gateway.raw("GET", "/call/pinned/x")
    assert up.last.header_all("x-api-version") == ["2025-11-01"]


async def test_literal_format_with_escaped_braces(gateway, up):
    sid = await gateway.secret("k-123456")
    await gateway.tool("br", up.url, [hb("X-Json", sid, '{{"v": 1}}'), hb("X-Key", sid, "{{{secret}}}")])
    await gateway.raw("GET", "/call/br/x")
    assert up.last.header("X-Json") == '{"v": 1}'
    assert up.last.header("X-Key") == "{k-123456}"


async def test_query_binding_replaces_callers_same_name_params_only(gateway, up):
    sid = await gateway.secret("qs-secret-9")
    await gateway.tool("q", up.url + "/v1?fixed=1", [qb("key", sid)])
    await gateway.raw("GET", "/call/q/s?key=mine&keys=other&k%65y=encoded&key&tag=a&tag=b")
    assert up.last.target == "/v1/s?fixed=1&keys=other&tag=a&tag=b&key=qs-secret-9"


async def test_query_binding_on_base_url_param(gateway, up):
    sid = await gateway.secret("qs-secret-9")
    await gateway.tool("q", up.url + "/v1?key=placeholder&x=1", [qb("key", sid)])
    await gateway.raw("GET", "/call/q")
    assert up.last.target == "/v1?x=1&key=qs-secret-9"


async def test_json_binding_into_empty_body(gateway, up):
    sid = await gateway.secret("js-secret-1")
    await gateway.tool("j", up.url, [jb("api_key", sid)])
    r = await gateway.raw("POST", "/call/j/x")
    assert r.status == 200, r.body
    assert json.loads(up.last.body) == {"api_key": "js-secret-1"}
    assert up.last.header("Content-Length") == str(len(up.last.body))


async def test_json_binding_overwrites_callers_field(gateway, up):
    sid = await gateway.secret("js-secret-1")
    await gateway.tool("j", up.url, [jb("api_key", sid)])
    await gateway.raw("POST", "/call/j/x", [("Content-Type", "application/json; charset=utf-8")],
                      b'{"api_key": "forged", "q": "\\u00e9"}')
    assert json.loads(up.last.body) == {"api_key": "js-secret-1", "q": "é"}
    assert up.last.header("Content-Type") == "application/json; charset=utf-8"
    assert b"forged" not in up.last.raw


async def test_json_binding_over_a_large_streamed_body(gateway, up):
    sid = await gateway.secret("js-secret-1")
    await gateway.tool("j", up.url, [jb("api_key", sid)])
    doc = {"rows": ["x" * 100] * 2000}
    body = json.dumps(doc).encode()
    assert len(body) > 64 * 1024
    r = await gateway.raw("POST", "/call/j/x", [("Transfer-Encoding", "chunked")],
                          chunks=[body[:70_000], body[70_000:]])
    assert r.status == 200, r.body
    assert json.loads(up.last.body) == {**doc, "api_key": "js-secret-1"}
    assert up.last.header("Content-Length") == str(len(up.last.body))
    assert up.last.header("Transfer-Encoding") is None


async def test_json_binding_duplicate_keys_refused(gateway, up):
    sid = await gateway.secret("js-secret-1")
    await gateway.tool("j", up.url, [jb("api_key", sid)])
    r = await gateway.raw("POST", "/call/j/x", body=b'{"model": "cheap", "model": "expensive"}')
    refused(r, 400, "duplicate_json_key", "caller")
    r = await gateway.raw("POST", "/call/j/x", body=b'{"a": {"k": 1, "k": 2}}')
    refused(r, 400, "duplicate_json_key", "caller")
    assert up.exchanges == []


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'"str"', b"\xff\xfe{}", b'{"a": 1'])
async def test_json_binding_non_object_body_refused(gateway, up, body):
    sid = await gateway.secret("js-secret-1")
    await gateway.tool("j", up.url, [jb("api_key", sid)])
    r = await gateway.raw("POST", "/call/j/x", [("Content-Type", "application/json")], body)
    refused(r, 400, "invalid_json_body", "caller")
    assert up.exchanges == []


async def test_json_binding_with_encoded_body(gateway, up):
    import gzip

    sid = await gateway.secret("js-secret-1")
    await gateway.tool("j", up.url, [jb("api_key", sid)])
    r = await gateway.raw("POST", "/call/j/x", [("X-Treg-Body-Encoding", "gzip")], gzip.compress(b'{"q": 1}'))
    assert r.status == 200, r.body
    assert json.loads(up.last.body) == {"q": 1, "api_key": "js-secret-1"}


async def test_secret_field_of_a_json_secret(gateway, up):
    sid = await gateway.secret({"user": "u1", "password": "pw-777777"})
    await gateway.tool("f", up.url, [hb("X-User", sid, secret_field="user"),
                                     hb("X-Pass", sid, "pw={secret}", secret_field="password")])
    await gateway.raw("GET", "/call/f/x")
    assert up.last.header("X-User") == "u1"
    assert up.last.header("X-Pass") == "pw=pw-777777"


async def test_secret_field_not_a_string_is_502(gateway, up):
    sid = await gateway.secret({"n": 5, "ok": "x"})
    await gateway.tool("f", up.url, [hb("X-N", sid, secret_field="n")])
    r = await gateway.raw("GET", "/call/f/x")
    refused(r, 502, "secret_field_invalid")
    assert up.exchanges == []


@pytest.fixture
async def platform_gateway(aiohttp_client, make_app):
    client = await aiohttp_client(make_app(ssrf_allow=("127.0.0.0/8",),
                                           platform={"TREG_PLATFORM_ADS_TOKEN": SecretStr("dev-token-42")},
                                           tool_platform_settings=("TREG_PLATFORM_ADS_TOKEN", "TREG_PLATFORM_NOT_SET")))
    org = await membership.create_org(client.app[SERVICES], slug="acme", email="owner@acme.test")
    return testing.Gateway(client, org)


async def test_platform_setting_binding_reads_settings(platform_gateway, up):
    gw = platform_gateway
    sid = await gw.secret("org-own-oauth-1")
    await gw.tool("ads", up.url, [hb("Authorization", sid, "Bearer {secret}"),
                                  {"location": "header", "name": "developer-token",
                                   "platform_setting": "TREG_PLATFORM_ADS_TOKEN"}])
    r = await gw.raw("GET", "/call/ads/x", [("developer-token", "forged")])
    assert r.status == 200, r.body
    assert up.last.header_all("developer-token") == ["dev-token-42"]
    assert up.last.header("Authorization") == "Bearer org-own-oauth-1"
    assert b"dev-token-42" not in r.head + r.body


async def test_missing_platform_setting_is_502_naming_it(platform_gateway, up):
    gw = platform_gateway
    await gw.tool("ads", up.url, [{"location": "query", "name": "dt", "platform_setting": "TREG_PLATFORM_NOT_SET"}])
    r = await gw.raw("GET", "/call/ads/x")
    body = refused(r, 502, "platform_setting_missing", "treg")
    assert "TREG_PLATFORM_NOT_SET" in body["detail"]
    assert up.exchanges == []


# -- what an upstream may not say ---------------------------------------------------------------------

@pytest.fixture
async def plain(gateway, up):
    await gateway.tool("up", up.url)


async def test_treg_cookies_cannot_be_set_by_upstream(gateway, up, plain):
    up.responder = lambda ex: http_response(200, b"x", [
        ("Set-Cookie", "treg_session=evil; Path=/"), ("Set-Cookie", "keep=1"),
        ("set-cookie", " treg_oauth_state=evil"), ("Set-Cookie", "treg_session_other=fine")])
    r = await gateway.raw("GET", "/call/up/x")
    assert r.header_all("Set-Cookie") == ["keep=1; Path=/call/up", "treg_session_other=fine; Path=/call/up"]
    assert b"evil" not in r.head


async def test_upstream_x_treg_headers_dropped(gateway, up, plain):
    up.responder = lambda ex: http_response(200, b"x", [("X-Treg-Error", "1"), ("X-Treg-Cost-Micro", "999"),
                                                        ("x-treg-anything", "y"), ("X-Other", "o")])
    r = await gateway.raw("GET", "/call/up/x")
    assert r.header("X-Treg-Error") is None
    assert r.header("X-Treg-Cost-Micro") is None
    assert r.header("x-treg-anything") is None
    assert r.header("X-Other") == "o"


async def test_upstream_policy_for_treg_s_origin_dropped(gateway, up, plain):
    """Headers a browser applies to the origin that answered, treg's: an upstream's HSTS (``max-age=0``
    would clear the operator's own), ``Clear-Site-Data`` (an answer a browser reads logging the user out of the
    whole registrable domain), ``Alt-Svc`` and ``Refresh`` (a browser showing the answer navigated anywhere:
    an open redirect on treg's origin) never reach the caller, in any spelling; the rest does."""
    up.responder = lambda ex: http_response(200, b"x", [
        ("Strict-Transport-Security", "max-age=0"), ("strict-transport-security", "max-age=1; includeSubDomains"),
        ("Clear-Site-Data", '"cookies", "storage"'), ("ALT-SVC", 'h2="elsewhere.example:443"; ma=86400'),
        ("Refresh", "0; url=https://phish.example/login"), ("REFRESH", "5;URL='//phish.example/'"),
        ("Set-Cookie", "vendor=1"), ("X-Other", "o")])
    r = await gateway.raw("GET", "/call/up/x")
    assert r.status == 200
    for name in ("Strict-Transport-Security", "Clear-Site-Data", "Alt-Svc", "Refresh"):
        assert r.header_all(name) == [], name
    assert b"elsewhere.example" not in r.head and b"max-age" not in r.head and b"phish" not in r.head
    assert r.header("X-Other") == "o" and r.header_all("Set-Cookie") == ["vendor=1; Path=/call/up"]  # an own tool's


@pytest.mark.parametrize("upstream, caller", [
    ([], "private"),
    ([("Cache-Control", "public, max-age=600")], "private, max-age=600"),
    ([("cache-control", "s-maxage=600, max-age=60, PUBLIC"), ("Cache-Control", "proxy-revalidate, immutable")],
     "private, max-age=60, immutable"),
    ([("Cache-Control", 'private="Set-Cookie, X-Id", no-cache="X-Id, Y", public')], 'private, no-cache="X-Id, Y"'),
    ([("Cache-Control", 'no-store'), ("Expires", "Thu, 01 Dec 2099 16:00:00 GMT")], "private, no-store"),
    ([("Cache-Control", 'max-age=5, s-maxage = 9, "odd, quoted", ,')], 'private, max-age=5, "odd, quoted"'),
])
async def test_a_relayed_answer_is_never_for_a_shared_cache(gateway, up, plain, upstream, caller):
    """A cache in front of treg (a CDN, nginx's proxy_cache) keys on the URL and does not know X-Treg-Token
    is a credential: an upstream's ``public`` made it hand one org's answer to anyone asking the same URL.
    Every relayed answer says ``private`` first, in one line, without what only a shared cache reads
    (``public``, ``s-maxage``, ``proxy-revalidate``) and with everything else the upstream said, in order;
    the fields that target a CDN in place of Cache-Control never reach the caller."""
    targeted = [("CDN-Cache-Control", "max-age=600"), ("Cloudflare-CDN-Cache-Control", "max-age=600"),
                ("Akamai-Cache-Control", "max-age=600"), ("Surrogate-Control", "max-age=600"),
                ("Edge-Control", "cache-maxage=600s"), ("X-Other", "o")]
    up.responder = lambda ex: http_response(200, b"x", upstream + targeted)
    r = await gateway.raw("GET", "/call/up/x")
    assert r.status == 200
    assert r.header_all("Cache-Control") == [caller]
    for name, _ in targeted[:-1]:
        assert r.header_all(name) == [], name
    assert r.header("X-Other") == "o"
    assert [v for k, v in r.headers if k.lower() == "expires"] == [v for k, v in upstream if k == "Expires"]


async def test_a_cache_control_the_upstream_marked_hop_by_hop_is_not_relayed(gateway, up, plain):
    up.responder = lambda ex: http_response(200, b"x", [("Connection", "cache-control"),
                                                        ("Cache-Control", "public, max-age=600")])
    r = await gateway.raw("GET", "/call/up/x")
    assert r.header_all("Cache-Control") == ["private"]


async def test_treg_s_own_answers_are_not_stored(gateway, up, plain):
    """treg's own answers (the API's JSON, an error body) are the caller's too: ``no-store`` unless the
    handler chose (the dashboard's pages)."""
    api = await gateway.raw("GET", "/api/v1/tools")
    refusal = await gateway.raw("GET", "/call/up/x", auth=False)
    unknown = await gateway.raw("GET", "/call/nope/x")
    assert api.status == 200 and refusal.status == 401 and unknown.status == 404
    for r in (api, refusal, unknown):
        assert r.header_all("Cache-Control") == ["no-store"], r.status


async def test_upstream_error_with_forged_treg_error_still_not_treg(gateway, up, plain):
    up.responder = lambda ex: http_response(502, b'{"error": "x"}', [("X-Treg-Error", "1")])
    r = await gateway.raw("GET", "/call/up/x")
    assert r.status == 502 and r.header("X-Treg-Error") is None


async def test_nosniff_replaces_upstreams_value(gateway, up, plain):
    up.responder = lambda ex: http_response(200, b"<html>", [("X-Content-Type-Options", "sniff-please"),
                                                             ("Content-Type", "text/html")])
    r = await gateway.raw("GET", "/call/up/x")
    assert r.header_all("X-Content-Type-Options") == ["nosniff"]
    up.responder = None
    r = await gateway.raw("GET", "/call/up/x")
    assert r.header_all("X-Content-Type-Options") == ["nosniff"]


async def test_csp_sandbox_added_beside_upstreams_policy(gateway, up, plain):
    up.responder = lambda ex: http_response(200, b"<html>", [("Content-Security-Policy", "default-src 'self'"),
                                                             ("Content-Type", "text/html")])
    r = await gateway.raw("GET", "/call/up/x")
    assert sorted(r.header_all("Content-Security-Policy")) == ["default-src 'self'", "sandbox"]
    up.responder = None
    r = await gateway.raw("GET", "/call/up/x")
    assert r.header_all("Content-Security-Policy") == ["sandbox"]


@pytest.mark.parametrize("status", [200, 404, 500, 204, 304])
async def test_security_headers_on_every_relayed_answer(gateway, up, plain, status):
    up.responder = lambda ex: http_response(status, b"" if status in (204, 304) else b"x")
    r = await gateway.raw("GET", "/call/up/x")
    assert r.status == status
    assert r.header("X-Content-Type-Options") == "nosniff"
    assert "sandbox" in r.header_all("Content-Security-Policy")


async def test_redirect_to_a_blocked_host_not_followed(gateway, up, plain):
    async with raw_upstream() as other:
        up.responder = lambda ex: http_response(302, b"", [("Location", other.url + "/steal")])
        r = await gateway.raw("GET", "/call/up/x")
        assert r.status == 302
        assert other.exchanges == []


async def test_platform_setting_needs_the_operators_opt_in(platform_gateway, up):
    gw = platform_gateway
    body = await gw.api("POST", "/api/v1/tools", expect=422, json={
        "name": "steal", "base_url": up.url,
        "bindings": [{"location": "header", "name": "X-K", "platform_setting": "TREG_PLATFORM_KEY_OPENAI"}]})
    assert body["error"] == "platform_setting_not_allowed"
    # an opt-in withdrawn after registration fails closed at call time: nothing is sent
    await gw.tool("ads2", up.url, [{"location": "header", "name": "X-K", "platform_setting": "TREG_PLATFORM_ADS_TOKEN"}])
    svc = gw.services
    svc.settings = svc.settings.replace(tool_platform_settings=())
    r = await gw.call("GET", "/call/ads2/x")
    assert r.status == 502 and (await r.json())["error"] == "platform_setting_not_allowed"
    assert up.exchanges == []


async def test_credentials_in_the_passthrough_url_never_replace_the_injected_key(gateway, up):
    """``/call/http://user:pw@host/...``: aiohttp would turn the userinfo into Basic auth; a target with
    user-info is refused (400, before any tool is chosen: api.md "Passthrough targets"), never sent in
    place of the team's key."""
    sid = await gateway.secret("sk_team_key_123456")
    await gateway.tool("keyed", up.url, [{"location": "header", "name": "Authorization", "format": "Bearer {secret}",
                                          "secret_id": sid}])
    host = up.url.split("://", 1)[1]
    r = await gateway.raw("GET", f"/call/http://user:pw@{host}/x")
    assert r.status == 400 and r.header("X-Treg-Error") == "1", (r.status, r.body)
    assert r.json()["error"] == "ambiguous_target" and r.json()["blame"] == "caller"
    assert up.exchanges == []  # nothing sent
