"""A caller who sends garbage gets a clear 4xx (or a treg-side 502), never a 500, and nothing garbled
reaches an upstream: bad URLs after /call/, unknown tools, header-injection attempts, malformed framing,
oversized or broken encoded bodies, bad tokens."""

from __future__ import annotations

import asyncio
import base64

import pytest

from treg.testing import raw_exchange


def treg_refusal(r, status: int, code: str | None = None) -> dict:
    """The contract's error body with X-Treg-Error and X-Treg-Call-Id."""
    assert r.status == status, (r.status, r.body)
    assert r.header("X-Treg-Error") == "1", r.headers
    assert r.header("X-Treg-Call-Id", ).startswith("call_")
    body = r.json()
    assert set(body) >= {"error", "detail", "blame"}, body
    assert isinstance(body["detail"], str) and len(body["detail"]) > 10
    if code is not None:
        assert body["error"] == code, body
    return body


# -- bad targets --------------------------------------------------------------------------------------

@pytest.mark.parametrize("target,status,code", [
    ("/call/", 400, "invalid_target"),
    ("/call/https:/", 400, "invalid_target"),
    ("/call/https://", 400, "invalid_target"),
    ("/call/https:///path", 404, "tool_not_found"),  # slashes collapse: the host is "path"
    ("/call/http://", 400, "invalid_target"),
    ("/call/HTTPS://", 400, "invalid_target"),
    ("/call/ftp://x/", 404, "tool_not_found"),
    ("/call/%00", 404, "tool_not_found"),
    ("/call/%00/x", 404, "tool_not_found"),
    ("/call/%0d%0aSet-Cookie:%20x=1/x", 404, "tool_not_found"),
    ("/call/%zz/x", 404, "tool_not_found"),
    ("/call/nope", 404, "tool_not_found"),
    ("/call/nope/a/b?c=d", 404, "tool_not_found"),
    ("/call/https://unknown.example/x", 404, "tool_not_found"),
    ("/call/https://user:pw@unknown.example:99999/x", 400, "ambiguous_target"),  # user-info: refused first
    ("/call/https://[::1/x", 400, "invalid_target"),
])
async def test_bad_targets_are_clear_4xx(gateway, up, tool, target, status, code):
    r = await gateway.raw("GET", target)
    body = treg_refusal(r, status, code)
    assert body["blame"] == "caller"
    assert up.exchanges == []


async def test_huge_path_is_4xx(gateway, up, tool):
    # within the request-line limit: an unknown tool, or relayed verbatim to a known one
    long_seg = "a" * 6000
    r = await gateway.raw("GET", f"/call/{long_seg}")
    treg_refusal(r, 404, "tool_not_found")
    r = await gateway.raw("GET", f"/call/up/{long_seg}")
    assert r.status == 200
    assert up.last.target == f"/v1/{long_seg}"
    # beyond it: aiohttp's own parser refuses it (a 4xx, never a 500), and nothing is relayed
    n = len(up.exchanges)
    r = await gateway.raw("GET", f"/call/up/{'b' * 100_000}")
    assert 400 <= r.status < 500, r.status
    assert len(up.exchanges) == n


async def test_huge_header_is_4xx(gateway, up, tool):
    r = await gateway.raw("GET", "/call/up/x", [("X-Big", "v" * 100_000)])
    assert 400 <= r.status < 500
    assert up.exchanges == []


async def test_unknown_tool_names_the_tool(gateway, up, tool):
    body = treg_refusal(await gateway.raw("POST", "/call/no-such-tool/v1/x", body=b"{}"), 404, "tool_not_found")
    assert "no-such-tool" in body["detail"]


async def test_dot_segments_after_a_named_tool_are_relayed_verbatim(gateway, up, tool):
    r = await gateway.raw("GET", "/call/up/a/../b/./c")
    assert r.status == 200
    assert up.last.target == "/v1/a/../b/./c"


async def test_dot_segments_cannot_dodge_a_deny_rule(gateway, up, tool):
    """A deny rule on /admin must also stop /v1/../admin, which every ordinary server resolves to
    /admin (and %2e%2e, its encoded form)."""
    host = up.url.split("://", 1)[1]
    await gateway.api("POST", "/api/v1/deny-rules", json={"host": host, "path": "/admin"}, expect=201)
    for target in ("/call/up/../admin", "/call/up/%2e%2e/admin", "/call/up/x/../../admin/users",
                   f"/call/{up.url}/v1/../admin"):
        r = await gateway.raw("GET", target)
        treg_refusal(r, 403, "denied_by_rule")
    assert up.exchanges == []


# -- header injection ---------------------------------------------------------------------------------

@pytest.mark.parametrize("raw_header", [
    b"X-Evil: a\rInjected: b",       # bare CR
    b"X-Evil: a\nInjected: b",       # bare LF inside the head (parsers split or refuse)
    b"X-Evil: a\x00b",               # NUL
    b"X-Evil : spaced-name",         # whitespace before the colon (request smuggling vector)
    b"X Evil: bad name",
    b" X-Folded: continuation",      # obs-fold at the start
])
async def test_malformed_header_lines_refused_or_not_relayed_as_split(gateway, up, tool, raw_header):
    token = gateway.org["token"].encode()
    data = (b"GET /call/up/x HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Treg-Token: " + token + b"\r\n" + raw_header
            + b"\r\n\r\n")
    r = await raw_exchange(gateway.client.port, data)
    assert r.status < 500, (r.status, r.body)
    for ex in up.exchanges:  # if anything was relayed, no header was smuggled into a new line
        assert ex.header("Injected") is None
        assert b"\x00" not in ex.raw


async def test_secret_with_newline_in_header_binding_is_502_not_split(gateway, up):
    sid = await gateway.secret("line1\r\nX-Injected: yes")
    await gateway.tool("bad", up.url, [{"location": "header", "name": "Authorization", "secret_id": sid}])
    r = await gateway.raw("GET", "/call/bad/x")
    body = treg_refusal(r, 502, "injection_failed")
    assert body["blame"] == "org_connection"
    assert "line1" not in r.body.decode() and "X-Injected" not in r.body.decode()
    assert up.exchanges == []


async def test_secret_with_newline_in_query_binding_is_encoded(gateway, up):
    sid = await gateway.secret("a\r\nb&c")
    await gateway.tool("q", up.url, [{"location": "query", "name": "k", "secret_id": sid}])
    r = await gateway.raw("GET", "/call/q/x")
    assert r.status == 200
    assert up.last.target == "/x?k=a%0D%0Ab%26c"


async def test_crlf_in_query_is_refused_by_the_parser_or_kept_encoded(gateway, up, tool):
    r = await gateway.raw("GET", "/call/up/x?a=%0d%0aInjected:%20yes")
    assert r.status == 200
    assert up.last.target == "/v1/x?a=%0d%0aInjected:%20yes"
    assert up.last.header("Injected") is None


# -- framing garbage ----------------------------------------------------------------------------------

@pytest.mark.parametrize("headers", [
    [("Content-Length", "abc")],
    [("Content-Length", "-1")],
    [("Content-Length", "5"), ("Content-Length", "6")],
    [("Content-Length", "5"), ("Transfer-Encoding", "chunked")],
    [("Transfer-Encoding", "gzip")],
])
async def test_bad_framing_is_4xx(gateway, up, tool, headers):
    r = await gateway.raw("POST", "/call/up/x", headers, b"hello")
    assert 400 <= r.status < 500, (r.status, r.body)
    assert up.exchanges == []


async def test_truncated_body_is_not_relayed_as_complete(gateway, up, tool):
    token = gateway.org["token"]
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.client.port)
    writer.write(f"POST /call/up/x HTTP/1.1\r\nHost: h\r\nX-Treg-Token: {token}\r\nContent-Length: 100\r\n\r\n"
                 "only-part".encode())
    await writer.drain()
    writer.write_eof()
    await asyncio.wait_for(reader.read(), 10)  # whatever treg answers (or a closed socket)
    writer.close()
    for ex in up.exchanges:
        assert len(ex.body) == 100 or ex.body != b"only-part"


# -- encoded bodies -----------------------------------------------------------------------------------

@pytest.mark.parametrize("encoding,body", [
    ("base64", b"%%%"),
    ("base64", b"YWJ"),            # missing padding
    ("base64", b"YW\x00Jj"),
    ("gzip", b"\x1f\x8b\x08\x00garbage"),
    ("gzip", b""),                  # empty is not a gzip stream
    ("deflate", b"x"),
    ("base64, gzip", b"x"),
    ("", b"x"),
])
async def test_bad_body_encoding_is_400(gateway, up, tool, encoding, body):
    r = await gateway.raw("POST", "/call/up/x", [("X-Treg-Body-Encoding", encoding)], body)
    treg_refusal(r, 400)
    assert up.exchanges == []


async def test_encoded_body_over_the_limit_is_400_not_500(aiohttp_client, make_app, up):
    from treg import membership, testing
    from treg.keys import SERVICES

    client = await aiohttp_client(make_app(ssrf_allow=("127.0.0.0/8",), body_decode_max_bytes=64))
    org = await membership.create_org(client.app[SERVICES], slug="acme", email="owner@acme.test")
    gw = testing.Gateway(client, org)
    await gw.tool("up", up.url)
    r = await gw.raw("POST", "/call/up/x", [("X-Treg-Body-Encoding", "base64")], base64.b64encode(b"x" * 1000))
    treg_refusal(r, 400, "body_too_large")
    # declared larger than the limit: refused before reading the body
    r = await gw.raw("POST", "/call/up/x", [("X-Treg-Body-Encoding", "base64"), ("Content-Length", "10000000")],
                     b"")
    treg_refusal(r, 400, "body_too_large")
    assert up.exchanges == []


# -- identity -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("token", ["", "wrong", "treg_" + "x" * 5000, "a b c", "\u00e9\u00e8"])
async def test_bad_tokens_are_401(gateway, up, tool, token):
    r = await gateway.raw("GET", "/call/up/x", [("X-Treg-Token", token)], auth=False)
    body = treg_refusal(r, 401)
    assert body["blame"] == "caller"
    assert up.exchanges == []


async def test_no_token_is_401(gateway, up, tool):
    treg_refusal(await gateway.raw("GET", "/call/up/x", auth=False), 401)
    treg_refusal(await gateway.raw("GET", "/call/nope/x", auth=False), 401)
    assert up.exchanges == []


async def test_unknown_org_hint_is_4xx(gateway, up, tool):
    r = await gateway.raw("GET", "/call/up/x", [("X-Treg-Org", "not-my-org")])
    assert r.status in (403, 404), r.status
    treg_refusal(r, r.status)
    assert up.exchanges == []


async def test_garbage_never_500(gateway, up, tool):
    """A sweep of odd requests: none may produce a 500 (the catch-all's 'internal_error')."""
    token = gateway.org["token"]
    cases = [
        ("GET", "/call/up/%"), ("GET", "/call/up/%%%"), ("GET", "/call/%ff%fe/x"), ("GET", "/call/up?%"),
        ("GET", "/call/up?=&=&&"), ("GET", "/call/https://%00/x"), ("GET", "/call/https://a%0d%0ab/x"),
        ("GET", "/call/https://a b/x"), ("GET", "/call/http://127.0.0.1:0/x"), ("GET", "/call/https://:80/x"),
        ("GET", "/call//x"), ("GET", "/call///"), ("OPTIONS", "*"), ("GET", "/call/up/x#frag"),
        ("GET", "/call/https://127.0.0.1:99999999/x"), ("GET", "/call/https://[zz]/x"),
    ]
    for method, target in cases:
        try:
            r = await gateway.raw(method, target)
        except (asyncio.IncompleteReadError, ConnectionError):
            continue  # the parser hung up on it: not a 500 either
        assert r.status < 500 or (r.status == 502 and r.header("X-Treg-Error") == "1"), (target, r.status, r.body)
        if r.header("Content-Type", ) and "json" in r.header("Content-Type"):
            assert r.json().get("error") != "internal_error", (target, r.body)
    del token


async def test_absolute_form_request_target(gateway, up, tool):
    r = await gateway.raw("GET", "http://127.0.0.1/call/up/a%2Fb?y=1&y=2")
    assert r.status == 200, r.body
    assert up.last.target == "/v1/a%2Fb?y=1&y=2"
    assert up.last.header("Host") == f"127.0.0.1:{up.port}"


@pytest.mark.parametrize("method,target", [("get", "/call/up/x"), ("FOO", "/call/up/x"), ("GET", "call/up/x"),
                                           ("GET", "*"), ("CONNECT", "127.0.0.1:443")])
async def test_unparseable_request_lines_are_4xx(gateway, up, tool, method, target):
    # aiohttp's parser answers these itself (plain text, before any treg code runs): still a 4xx
    r = await gateway.raw(method, target)
    assert 400 <= r.status < 500, (r.status, r.body)
    assert up.exchanges == []


# -- an upstream that answers garbage -----------------------------------------------------------------

@pytest.mark.parametrize("answer", [
    b"garbage\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nBad Header\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nX-Null: a\x00b\r\nContent-Length: 2\r\n\r\nok",
])
async def test_malformed_upstream_answer_is_a_named_502(gateway, up, tool, answer):
    up.responder = lambda ex: answer
    r = await gateway.raw("GET", "/call/up/x")
    body = treg_refusal(r, 502, "upstream_bad_response")
    assert body["blame"] == "upstream"


async def test_odd_upstream_status_relayed(gateway, up, tool):
    up.responder = lambda ex: b"HTTP/1.1 599 Weird\r\nContent-Length: 2\r\n\r\nok"
    r = await gateway.raw("GET", "/call/up/x")
    assert (r.status, r.reason, r.body) == (599, "Weird", b"ok")
    assert r.header("X-Treg-Error") is None


async def test_interim_early_hints_skipped(gateway, up, tool):
    up.responder = lambda ex: (b"HTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\n\r\n"
                               b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    r = await gateway.raw("GET", "/call/up/x")
    assert (r.status, r.body) == (200, b"ok")


async def test_passthrough_port_out_of_range_is_a_clean_400(gateway, up, tool):
    """The passthrough target is parsed (by the connection's rules) before any tool is chosen: a port
    yarl refuses is the caller's 400 error body, never a 500, and nothing is sent."""
    r = await gateway.raw("GET", "/call/http://127.0.0.1:99999/v1/x")
    treg_refusal(r, 400, "invalid_target")
    assert up.exchanges == []


def test_upstream_url_yarl_refuses_is_a_gateway_failure():
    from treg.errors import GatewayFailed
    from treg.infra.upstream import parse_url

    with pytest.raises(GatewayFailed) as err:
        parse_url("https://[::1/x")
    assert err.value.status == 502 and err.value.code == "invalid_upstream_url" and err.value.blame == "caller"
    assert parse_url("https://h/a%2Fb?x=%7E").raw_path == "/a%2Fb"  # nothing re-quoted


async def test_no_route_and_wrong_method_are_error_bodies(gateway):
    """What no route serves is the contract's error body too: 404, or 405 with Allow when the path
    exists for other methods."""
    r = await gateway.raw("GET", "/nothing/here")
    assert r.status == 404 and r.json() == {"error": "not_found", "detail": "no route for GET /nothing/here",
                                            "blame": "caller"}
    assert r.header("X-Treg-Error") == "1"
    r = await gateway.raw("PUT", "/api/v1/me")
    assert r.status == 405 and r.json()["error"] == "method_not_allowed" and r.header("X-Treg-Error") == "1"
    assert "GET" in r.header("Allow").split(", ")
    r = await gateway.raw("GET", "/healthz")
    assert r.status == 200


async def test_unexpected_errors_are_logged_500_error_bodies(gateway, monkeypatch, caplog):
    """A bug is still the contract's body (500, blame treg), logged with its traceback; on the call
    surface it carries the call id like any refusal."""
    from treg.call import service
    from treg.web import api

    async def broken(*a, **kw):
        raise RuntimeError("boom")

    monkeypatch.setattr(api, "identify", broken)
    monkeypatch.setattr(service, "execute", broken)
    r = await gateway.raw("GET", "/api/v1/me")
    assert r.status == 500 and r.json() == {"error": "internal_error", "blame": "treg",
                                            "detail": "treg failed unexpectedly; the error was logged"}
    r = await gateway.raw("GET", "/call/up/x")
    assert r.status == 500 and r.json()["error"] == "internal_error" and r.header("X-Treg-Call-Id")
    logged = [rec for rec in caplog.records if rec.name == "treg.web" and rec.exc_info]
    assert len(logged) == 2 and all("boom" in str(rec.exc_info[1]) for rec in logged)
