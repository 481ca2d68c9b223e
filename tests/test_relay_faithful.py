"""The faithful relay, request side: what reaches the upstream is what the caller sent, byte for byte,
except the three things the seed's contract lets relay() alter (hop-by-hop framing, treg's control
headers and cookies, the injected credentials). Every test goes caller → treg → a raw-socket upstream
on 127.0.0.1, and most send the call as exact bytes so no client library adds or normalizes anything.
"""

from __future__ import annotations

import gzip

import pytest

from treg.testing import http_response, raw_exchange


def names(ex) -> list[str]:
    return [k.lower() for k, _ in ex.headers]


# -- method, path, query ------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "PROPFIND", "MKCOL",
                                    "REPORT"])
async def test_method_is_relayed_verbatim(gateway, up, tool, method):
    r = await gateway.raw(method, "/call/up/res")
    assert r.status == 200, r.body
    assert up.last.request_line == f"{method} /v1/res HTTP/1.1"


async def test_raw_path_keeps_encoded_slash_and_every_escape(gateway, up, tool):
    # %2F must not become '/', %7E must not become '~', %41 must not be decoded, '+' stays '+',
    # a lower-case escape keeps its case
    target = "/v1/@scope%2Fname/a%20b/%7Euser/%41+x/caf%c3%a9"
    r = await gateway.raw("PUT", "/call/up" + target[3:], body=b"{}")
    assert r.status == 200, r.body
    assert up.last.target == target


async def test_url_passthrough_keeps_raw_path_and_query(gateway, up, tool):
    r = await gateway.raw("GET", f"/call/{up.url}/v1/a%2Fb/c?q=x%20y&q=z&flag")
    assert r.status == 200, r.body
    assert up.last.target == "/v1/a%2Fb/c?q=x%20y&q=z&flag"


async def test_query_duplicates_and_order_kept(gateway, up, tool):
    r = await gateway.raw("GET", "/call/up/items?tag=a&z=1&tag=b&a=%2B&tag=a")
    assert r.status == 200, r.body
    assert up.last.target == "/v1/items?tag=a&z=1&tag=b&a=%2B&tag=a"


async def test_query_flag_without_value_and_empty_value(gateway, up, tool):
    r = await gateway.raw("GET", "/call/up/items?flag&empty=&x=1")
    assert r.status == 200, r.body
    assert up.last.target == "/v1/items?flag&empty=&x=1"


async def test_base_url_query_comes_first_then_callers(gateway, up):
    await gateway.tool("q", up.url + "/rest/images?action=initializeUpload")
    r = await gateway.raw("POST", "/call/q?b=2&b=3", body=b"x")
    assert r.status == 200, r.body
    assert up.last.target == "/rest/images?action=initializeUpload&b=2&b=3"
    r = await gateway.raw("POST", "/call/q/sub?b=2", body=b"x")
    assert up.last.target == "/rest/images/sub?action=initializeUpload&b=2"
    r = await gateway.raw("GET", "/call/q")
    assert up.last.target == "/rest/images?action=initializeUpload"


async def test_no_path_relays_to_the_base_url_itself(gateway, up):
    await gateway.tool("charges", up.url + "/v1/charges")
    r = await gateway.raw("GET", "/call/charges")
    assert r.status == 200, r.body
    assert up.last.target == "/v1/charges"
    r = await gateway.raw("GET", "/call/charges?limit=3")
    assert up.last.target == "/v1/charges?limit=3"


async def test_trailing_slash_relays_to_base_plus_slash(gateway, up):
    await gateway.tool("charges", up.url + "/v1/charges")
    r = await gateway.raw("GET", "/call/charges/")
    assert r.status == 200, r.body
    assert up.last.target == "/v1/charges/"


async def test_base_url_without_path(gateway, up):
    await gateway.tool("root", up.url)
    await gateway.raw("GET", "/call/root")
    assert up.last.target == "/"  # HTTP needs a path: the empty base path is the root
    await gateway.raw("GET", "/call/root/x/y")
    assert up.last.target == "/x/y"


# -- headers ------------------------------------------------------------------------------------------

async def test_duplicate_headers_kept_in_order(gateway, up, tool):
    sent = [("X-A", "1"), ("X-Multi", "one"), ("X-B", "2"), ("X-Multi", "two"), ("x-multi", "three"),
            ("Accept", "text/plain"), ("Accept", "application/json")]
    r = await gateway.raw("GET", "/call/up/h", sent)
    assert r.status == 200, r.body
    got = [(k, v) for k, v in up.last.headers if k.lower() in ("x-a", "x-b", "x-multi", "accept")]
    assert got == sent


async def test_header_names_keep_their_case(gateway, up, tool):
    await gateway.raw("GET", "/call/up/h", [("x-lower", "a"), ("X-UPPER", "b"), ("X-MiXeD", "c")])
    ours = [k for k, _ in up.last.headers if k.lower().startswith("x-")]
    assert ours == ["x-lower", "X-UPPER", "X-MiXeD"]


async def test_cookie_scrubs_treg_cookies_keeps_others(gateway, up, tool):
    await gateway.raw("GET", "/call/up/c", [("Cookie", "a=1; treg_session=SESS; b=2; treg_oauth_state=ST; c=3")])
    assert up.last.header_all("Cookie") == ["a=1; b=2; c=3"]
    assert b"SESS" not in up.last.raw and b"ST;" not in up.last.raw


async def test_cookie_without_treg_cookies_is_byte_identical(gateway, up, tool):
    odd = "a=1;b=2;  c=\"q;x\" ; d"
    await gateway.raw("GET", "/call/up/c", [("Cookie", odd), ("Cookie", "e=5; ")])
    assert b"Cookie: " + odd.encode() + b"\r\n" in up.last.raw
    assert b"Cookie: e=5;\r\n" in up.last.raw  # a value's trailing whitespace is not part of it (RFC 9110 5.5)


async def test_cookie_of_only_treg_cookies_is_dropped(gateway, up, tool):
    await gateway.raw("GET", "/call/up/c", [("Cookie", "treg_session=SESS"), ("Cookie", "x=1"),
                                            ("Cookie", "treg_oauth_state=ST")])
    assert up.last.header_all("Cookie") == ["x=1"]
    assert b"SESS" not in up.last.raw


async def test_cookie_named_like_treg_cookie_prefix_kept(gateway, up, tool):
    await gateway.raw("GET", "/call/up/c", [("Cookie", "treg_session_x=keep; my_treg_session=keep2")])
    assert up.last.header_all("Cookie") == ["treg_session_x=keep; my_treg_session=keep2"]


async def test_invented_x_treg_header_never_reaches_upstream(gateway, up, tool):
    await gateway.raw("GET", "/call/up/h", [("X-Treg-Whatever", "secret-ish"), ("x-treg-future-control", "1"),
                                            ("X-TREG-TAG", "t"), ("X-Treg-Org", "acme"), ("X-Kept", "1")])
    assert not [k for k in names(up.last) if k.startswith("x-treg-")]
    assert b"secret-ish" not in up.last.raw
    assert up.last.header("X-Kept") == "1"


async def test_edge_forwarding_headers_dropped(gateway, up, tool):
    await gateway.raw("GET", "/call/up/h", [
        ("X-Forwarded-For", "1.2.3.4"), ("X-Forwarded-Proto", "https"), ("X-Forwarded-Host", "edge"),
        ("X-Forwarded-Whatever", "x"), ("Forwarded", "for=1.2.3.4"), ("Via", "1.1 edge"),
        ("X-Real-IP", "1.2.3.4"), ("ngrok-skip-browser-warning", "1"), ("X-Kept", "1")])
    got = names(up.last)
    for h in ("x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "x-forwarded-whatever", "forwarded",
              "via", "x-real-ip", "ngrok-skip-browser-warning"):
        assert h not in got
    assert b"1.2.3.4" not in up.last.raw
    assert up.last.header("X-Kept") == "1"


async def test_hop_by_hop_headers_dropped(gateway, up, tool):
    await gateway.raw("GET", "/call/up/h", [
        ("Connection", "keep-alive"), ("Keep-Alive", "timeout=5"), ("TE", "trailers"), ("Trailer", "X-T"),
        ("Upgrade", "h2c"), ("Proxy-Connection", "keep-alive"), ("Proxy-Authorization", "Basic eA=="),
        ("Proxy-Whatever", "1"), ("X-Kept", "1")])
    got = names(up.last)
    for h in ("keep-alive", "te", "trailer", "upgrade", "proxy-connection", "proxy-authorization", "proxy-whatever"):
        assert h not in got
    assert "timeout=5" not in up.last.raw.decode("latin-1")
    assert up.last.header("X-Kept") == "1"
    assert up.last.header("Host") == f"127.0.0.1:{up.port}"  # re-derived for the upstream hop


async def test_headers_named_in_connection_dropped(gateway, up, tool):
    await gateway.raw("GET", "/call/up/h", [("Connection", "X-Hop-One, x-hop-two"), ("Connection", "X-Hop-Three"),
                                            ("X-Hop-One", "a"), ("X-Hop-Two", "b"), ("X-Hop-Three", "c"),
                                            ("X-Kept", "1")])
    got = names(up.last)
    assert "x-hop-one" not in got and "x-hop-two" not in got and "x-hop-three" not in got
    assert up.last.header("X-Kept") == "1"


async def test_accept_encoding_relayed_as_sent_and_never_added(gateway, up, tool):
    # none sent, none relayed: neither treg nor aiohttp's client adds one (it used to be "identity")
    await gateway.raw("GET", "/call/up/h")
    assert up.last.header_all("Accept-Encoding") == [] and b"ccept-encoding" not in up.last.raw.lower()
    await gateway.raw("GET", "/call/up/h", [("Accept-Encoding", "gzip, br")])
    assert up.last.header_all("Accept-Encoding") == ["gzip, br"]
    await gateway.raw("GET", "/call/up/h", [("accept-encoding", "")])
    assert up.last.header_all("Accept-Encoding") == [""]


async def test_callers_gzip_answer_relayed_undecoded(gateway, up, tool):
    payload = gzip.compress(b'{"hello": "world"}' * 50)
    up.responder = lambda ex: http_response(200, payload, [("Content-Type", "application/json"),
                                                           ("Content-Encoding", "gzip")])
    r = await gateway.raw("GET", "/call/up/z", [("Accept-Encoding", "gzip")])
    assert up.last.header("Accept-Encoding") == "gzip"
    assert r.status == 200
    assert r.header("Content-Encoding") == "gzip"
    assert r.body == payload
    assert r.header("Content-Length") == str(len(payload))


async def test_nothing_added_that_the_caller_did_not_send(gateway, up, tool):
    await gateway.raw("GET", "/call/up/h")
    got = names(up.last)
    assert sorted(got) == ["host"], up.last.raw
    await gateway.raw("POST", "/call/up/h", body=b"\x00\x01raw")
    got = names(up.last)
    assert sorted(got) == ["content-length", "host"], up.last.raw
    assert up.last.body == b"\x00\x01raw"


async def test_callers_user_agent_accept_and_content_type_kept_verbatim(gateway, up, tool):
    await gateway.raw("POST", "/call/up/h", [("User-Agent", "agent/1.0"), ("Accept", "*/*; q=0.1"),
                                             ("Content-Type", "text/x-odd; charset=latin-1")], body=b"a")
    ex = up.last
    assert ex.header_all("User-Agent") == ["agent/1.0"]
    assert ex.header_all("Accept") == ["*/*; q=0.1"]
    assert ex.header_all("Content-Type") == ["text/x-odd; charset=latin-1"]


async def test_aiohttp_client_call_also_faithful(gateway, up, tool):
    """The same rules through an ordinary HTTP client (what most callers are)."""
    r = await gateway.call("GET", "/call/up/a%2Fb?x=1&x=2", headers={"X-Treg-Whatever": "1", "X-Kept": "k"})
    assert r.status == 200
    assert await r.read() == b"ok"
    assert up.last.target == "/v1/a%2Fb?x=1&x=2"
    assert up.last.header("X-Kept") == "k"
    assert up.last.header("X-Treg-Whatever") is None


# -- the answer ---------------------------------------------------------------------------------------

def respond(raw: bytes):
    return lambda ex: raw


async def test_every_upstream_header_copied_in_order_with_both_set_cookies(gateway, up, tool):
    up.responder = respond(http_response(200, b"{}", [
        ("Content-Type", "application/json"), ("Set-Cookie", "a=1; Path=/; HttpOnly"), ("X-Rate", "10"),
        ("Set-Cookie", "b=2; Path=/api"), ("X-Rate", "9"), ("Link", "<https://x/2>; rel=next"),
        ("x-lower-case", "kept")]))
    r = await gateway.raw("GET", "/call/up/h")
    assert r.status == 200
    # each cookie scoped to the tool that set it (treg/call/cookies.py), the rest of it as it came
    assert r.header_all("Set-Cookie") == ["a=1; HttpOnly; Path=/call/up", "b=2; Path=/call/up"]
    assert r.header_all("X-Rate") == ["10", "9"]
    # a Link's URL stays inside treg, as a Location's does (another host: a /redirect/ link); the
    # upstream's own value beside it
    assert r.header("Link").startswith("</redirect/") and r.header("Link").endswith(">; rel=next")
    assert r.header("X-Treg-Upstream-Link") == "<https://x/2>; rel=next"
    assert r.header("x-lower-case") == "kept"
    assert r.header("Content-Type") == "application/json"
    upstream_order = [k.lower() for k, _ in r.headers if k.lower() in ("set-cookie", "x-rate", "link")]
    assert upstream_order == ["set-cookie", "x-rate", "set-cookie", "x-rate", "link"]
    assert r.body == b"{}"


async def test_both_set_cookies_through_an_http_client(gateway, up, tool):
    up.responder = respond(http_response(200, b"ok", [("Set-Cookie", "a=1"), ("Set-Cookie", "b=2")]))
    r = await gateway.call("GET", "/call/up/h")
    assert r.headers.getall("Set-Cookie") == ["a=1; Path=/call/up", "b=2; Path=/call/up"]


async def test_status_and_reason_phrase_kept(gateway, up, tool):
    up.responder = respond(http_response(201, b"made", reason="Created It"))
    r = await gateway.raw("POST", "/call/up/h", body=b"x")
    assert (r.status, r.reason, r.body) == (201, "Created It", b"made")


async def test_no_content_type_or_server_added(gateway, up, tool):
    up.responder = respond(http_response(200, b"plain bytes"))
    r = await gateway.raw("GET", "/call/up/h")
    assert r.header("Content-Type") is None
    assert r.header("Server") is None
    up.responder = respond(http_response(200, b"x", [("Server", "upstream/1"), ("Date", "Tue, 01 Jan 2030 00:00:00 GMT")]))
    r = await gateway.raw("GET", "/call/up/h")
    assert r.header_all("Server") == ["upstream/1"]
    assert r.header_all("Date") == ["Tue, 01 Jan 2030 00:00:00 GMT"]


async def test_declared_length_answer_keeps_its_length(gateway, up, tool):
    body = bytes(range(256)) * 1000
    up.responder = respond(http_response(200, body))
    r = await gateway.raw("GET", "/call/up/h")
    assert r.header("Content-Length") == str(len(body))
    assert not r.chunked
    assert r.body == body


async def test_head_keeps_content_length_without_body(gateway, up, tool):
    up.responder = respond(b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\nContent-Type: text/html\r\n\r\n")
    r = await gateway.raw("HEAD", "/call/up/h")
    assert r.status == 200
    assert r.header("Content-Length") == "1234"
    assert r.body == b""
    assert up.last.method == "HEAD"
    # the upstream connection was not waiting for a phantom body: the next call reuses it
    up.responder = None
    r = await gateway.raw("GET", "/call/up/h")
    assert (r.status, r.body) == (200, b"ok")
    assert up.connections == 1


@pytest.mark.parametrize("status", [204, 304])
async def test_bodyless_status_keeps_upstreams_content_length(gateway, up, tool, status):
    up.responder = respond(f"HTTP/1.1 {status} X\r\nContent-Length: 42\r\nETag: \"v1\"\r\n\r\n".encode())
    r = await gateway.raw("GET", "/call/up/h")
    assert r.status == status
    assert r.header("Content-Length") == "42"
    assert r.header("ETag") == '"v1"'
    assert r.header("Transfer-Encoding") is None
    assert r.body == b""


@pytest.mark.parametrize("status", [204, 304])
async def test_bodyless_status_without_length_gets_none(gateway, up, tool, status):
    up.responder = respond(f"HTTP/1.1 {status} X\r\nETag: \"v1\"\r\n\r\n".encode())
    r = await gateway.raw("GET", "/call/up/h")
    assert r.status == status
    assert r.header("Content-Length") is None and r.header("Transfer-Encoding") is None


async def test_chunked_answer_relayed(gateway, up, tool):
    parts = [b"alpha-", b"x" * 100_000, b"-omega"]
    chunked = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts) + b"0\r\n\r\n"
    up.responder = respond(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/plain\r\n\r\n"
                           + chunked)
    r = await gateway.raw("GET", "/call/up/h")
    assert r.status == 200
    assert r.chunked and r.header("Content-Length") is None
    assert r.header_all("Transfer-Encoding") == ["chunked"]
    assert r.body == b"".join(parts)


async def test_close_delimited_answer_relayed(gateway, up, tool):
    body = b"until the server closes" * 100

    async def answer(ex):
        ex.writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n" + body)
        await ex.writer.drain()
        ex.writer.close()
        return None

    up.responder = answer
    r = await gateway.raw("GET", "/call/up/h")
    assert r.status == 200
    assert r.body == body


async def test_gzip_answer_relayed_undecoded_even_unasked(gateway, up, tool):
    payload = gzip.compress(b"compressed " * 500)
    up.responder = respond(http_response(200, payload, [("Content-Encoding", "gzip"), ("Vary", "Accept-Encoding")]))
    r = await gateway.raw("GET", "/call/up/z")
    assert r.header("Content-Encoding") == "gzip"
    assert r.body == payload


@pytest.mark.parametrize("status", [400, 401, 404, 422, 429, 500, 502, 503])
async def test_upstream_error_relayed_untouched_without_treg_error(gateway, up, tool, status):
    body = b'{"error": {"message": "upstream says no"}}'
    up.responder = respond(http_response(status, body, [("Content-Type", "application/json"),
                                                        ("Retry-After", "7")], reason="Upstream Reason"))
    r = await gateway.raw("POST", "/call/up/h", body=b"{}")
    assert (r.status, r.reason) == (status, "Upstream Reason")
    assert r.body == body
    assert r.header("X-Treg-Error") is None
    assert r.header("Retry-After") == "7"
    assert r.header("Content-Length") == str(len(body))
    assert r.header("X-Treg-Call-Id", ).startswith("call_")


async def test_large_upstream_error_relayed_whole(gateway, up, tool):
    # the first 8 KiB are peeked for evidence and replayed: the caller must get every byte, in order
    body = bytes(i % 251 for i in range(200_000))
    up.responder = respond(http_response(500, body))
    r = await gateway.raw("GET", "/call/up/h")
    assert r.status == 500
    assert r.body == body
    parts = [b"a" * 5000, b"b" * 5000, b"c" * 5000]
    chunked = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts) + b"0\r\n\r\n"
    up.responder = respond(b"HTTP/1.1 503 Busy\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked)
    r = await gateway.raw("GET", "/call/up/h")
    assert r.status == 503 and r.body == b"".join(parts)


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
async def test_redirect_not_followed(gateway, up, tool, status):
    up.responder = respond(http_response(status, b"moved", [("Location", up.url + "/elsewhere")]))
    r = await gateway.raw("POST", "/call/up/h", body=b"x")
    assert r.status == status
    # outside the tool's base URL: relayed as treg's /redirect link, the upstream's value kept beside it
    assert r.header("Location").startswith("/redirect/")
    assert r.header("X-Treg-Upstream-Location") == up.url + "/elsewhere"
    assert r.body == b"moved"
    assert len(up.exchanges) == 1


async def test_response_headers_listed_in_connection_dropped(gateway, up, tool):
    up.responder = respond(http_response(200, b"x", [("Connection", "X-Hop"), ("X-Hop", "secret-hop"),
                                                     ("Keep-Alive", "timeout=5"), ("X-Kept", "1")]))
    r = await gateway.raw("GET", "/call/up/h")
    assert r.header("X-Hop") is None and r.header("Keep-Alive") is None
    assert r.header("X-Kept") == "1"


async def test_call_id_on_every_answer(gateway, up, tool):
    seen = set()
    r = await gateway.raw("GET", "/call/up/h")
    seen.add(r.header("X-Treg-Call-Id"))
    up.responder = respond(http_response(500, b"x"))
    r = await gateway.raw("GET", "/call/up/h")
    seen.add(r.header("X-Treg-Call-Id"))
    r = await gateway.raw("GET", "/call/nope/h")
    assert r.status == 404 and r.header("X-Treg-Error") == "1"
    seen.add(r.header("X-Treg-Call-Id"))
    r = await gateway.raw("GET", "/call/up/h", auth=False)
    assert r.status == 401 and r.header("X-Treg-Error") == "1"
    seen.add(r.header("X-Treg-Call-Id"))
    r = await gateway.raw("GET", "/call/up/h", [("X-Treg-Token", "wrong")], auth=False)
    assert r.status == 401
    seen.add(r.header("X-Treg-Call-Id"))
    assert None not in seen and len(seen) == 5
    assert all(c.startswith("call_") for c in seen)


async def test_upstream_cannot_spoof_call_id(gateway, up, tool):
    up.responder = respond(http_response(200, b"x", [("X-Treg-Call-Id", "call_forged")]))
    r = await gateway.raw("GET", "/call/up/h")
    ids = r.header_all("X-Treg-Call-Id")
    assert len(ids) == 1 and ids[0] != "call_forged"


# -- non-ASCII header bytes ---------------------------------------------------------------------------

async def test_utf8_header_value_relayed_byte_for_byte(gateway, up, tool):
    value = "attachment; filename=\"résumé-日本.pdf\"".encode()
    up.responder = respond(b"HTTP/1.1 200 OK\r\nContent-Disposition: " + value + b"\r\nContent-Length: 2\r\n\r\nok")
    token = gateway.org["token"].encode()
    data = (b"GET /call/up/u HTTP/1.1\r\nHost: h\r\nX-Treg-Token: " + token + b"\r\nX-Name: " + value
            + b"\r\n\r\n")
    r = await raw_exchange(gateway.client.port, data)
    assert r.status == 200
    assert b"\r\nX-Name: " + value + b"\r\n" in up.last.raw  # request side: the same bytes
    assert b"\r\nContent-Disposition: " + value + b"\r\n" in r.head  # answer side: the same bytes


async def test_non_utf8_header_bytes_do_not_break_the_call(gateway, up, tool):
    # obs-text that is not UTF-8: a caller's is refused (tests/test_edge_obs_text.py); an upstream's is
    # read as latin-1 text for treg's records and sent on as its own bytes, never dropped, never a 500
    up.responder = respond(b"HTTP/1.1 500 Err\r\nX-Up: caf\xe9\r\nContent-Length: 1\r\n\r\nx")
    token = gateway.org["token"].encode()
    data = (b"GET /call/up/u HTTP/1.1\r\nHost: h\r\nX-Treg-Token: " + token + b"\r\n\r\n")
    r = await raw_exchange(gateway.client.port, data)
    assert r.status == 500 and r.body == b"x"
    assert b"\r\nX-Up: caf\xe9\r\n" in r.head
    # and the failed call (with its evidence) was audited
    import asyncio

    for _ in range(250):
        calls = await gateway.calls()
        if calls:
            break
        await asyncio.sleep(0.02)
    assert [c["status"] for c in calls] == [500]


@pytest.mark.parametrize("length", [True, False])  # sent with its body, and streamed (chunked)
async def test_an_upstreams_latin1_header_bytes_reach_the_caller_unchanged(gateway, up, tool, length):
    """``X-Foo: caf\\xe9`` went out as ``caf\\xc3\\xa9`` (aiohttp's writer encodes text as UTF-8). Now its
    bytes, beside a UTF-8 header (kept UTF-8) and treg's own headers; a name with a latin-1 byte too."""
    body = b"hello"
    framing = b"Content-Length: 5\r\n\r\n" + body if length else \
        b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    up.responder = respond(b"HTTP/1.1 200 OK\r\nX-Foo: caf\xe9\r\nX-Utf8: caf\xc3\xa9\r\n"
                           b"Content-Disposition: attachment; filename=\"\xe9t\xe9.txt\"\r\n" + framing)
    token = gateway.org["token"].encode()
    r = await raw_exchange(gateway.client.port, b"GET /call/up/u HTTP/1.1\r\nHost: h\r\nX-Treg-Token: " + token
                           + b"\r\n\r\n")
    assert r.status == 200 and r.body == body
    assert b"\r\nX-Foo: caf\xe9\r\n" in r.head
    assert b"\r\nX-Utf8: caf\xc3\xa9\r\n" in r.head
    assert b'\r\nContent-Disposition: attachment; filename="\xe9t\xe9.txt"\r\n' in r.head
    assert b"\r\nX-Treg-Call-Id: call_" in r.head and b"\xc3" not in r.head.replace(b"caf\xc3\xa9", b"")


async def test_sub_delims_and_unusual_characters_kept(gateway, up, tool):
    target = "/v1/a:b@c!$&'()*+,;=/~x/%7e/_-./?q=[1]&r={a}|b&s=a:b/c?d&t=%E2%82%AC&u=%e2%82%ac&v=a+b%20c"
    r = await gateway.raw("GET", "/call/up" + target[3:])
    assert r.status == 200, r.body
    assert up.last.target == target


async def test_empty_query_and_lone_question_mark(gateway, up, tool):
    await gateway.raw("GET", "/call/up/x?")
    assert up.last.target in ("/v1/x?", "/v1/x")  # an empty query: nothing to carry
    await gateway.raw("GET", "/call/up/x?&&a=1&&")
    assert up.last.target == "/v1/x?&&a=1&&"


async def test_a_bound_host_header_replaces_the_urls_once(gateway, up):
    """A binding may pin Host (a provider behind a shared front): it goes upstream once, in place of
    the URL's, and the caller's own headers keep their order around it."""
    sid = await gateway.secret("api.pinned.example")
    await gateway.tool("pinned", up.url, [{"location": "header", "name": "Host", "secret_id": sid}])
    r = await gateway.raw("GET", "/call/pinned/x", [("X-A", "1"), ("Host", "caller.example"), ("X-B", "2")])
    assert r.status == 200, r.body
    ex = up.last
    assert ex.header_all("Host") == ["api.pinned.example"]
    names = [k for k, _ in ex.headers]
    assert names.index("X-A") < names.index("X-B")
