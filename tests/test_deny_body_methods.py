"""A ``_method`` field in the body counts as the method for deny rules (api.md "Deny rules match what the
upstream will understand"; issue 20 item 11: ``_method=DELETE`` in a form body passed a ``DELETE`` rule).

Rails, Laravel and Symfony read it from form, multipart and (Laravel) JSON bodies; a body is read only
when a method rule holds on every other axis, a body of any other kind keeps streaming, and a body too
large to read under such a rule is refused rather than let through."""

from __future__ import annotations

import json

import pytest

from treg.domain import body_methods
from treg.domain.deny import effective_methods

FORM = ("Content-Type", "application/x-www-form-urlencoded")


# -- the readers (pure) ----------------------------------------------------------------------------

@pytest.mark.parametrize("body", [b"_method=DELETE", b"a=1&_method=delete", b"%5Fmethod=DELETE", b"_METHOD=DELETE",
                                  b"_method=DE%4CETE", b"a=1;_method=DELETE", b"+_method=DELETE", b".method=DELETE",
                                  b"[method=DELETE", b"_method=PUT&_method=DELETE", b"_method=+DELETE+"])
def test_form_fields_naming_the_method(body):
    found = body_methods.body_methods([FORM], body)
    assert "DELETE" in effective_methods("POST", extra=found), found


@pytest.mark.parametrize("body", [b"method=DELETE", b"x_method=DELETE", b"_method", b"_methods=DELETE", b""])
def test_form_fields_that_are_not_the_method(body):
    assert "DELETE" not in effective_methods("POST", extra=body_methods.body_methods([FORM], body))


def test_which_bodies_are_read():
    assert body_methods.kinds([]) == [("form", None)]  # Rack reads a POST without a Content-Type as a form
    assert body_methods.kinds([("content-type", "Application/X-WWW-Form-Urlencoded; charset=utf-8")])[0][0] == "form"
    assert body_methods.kinds([("Content-Type", "multipart/form-data; boundary=b")])[0][0] == "multipart"
    assert body_methods.kinds([("Content-Type", "application/vnd.api+json")])[0][0] == "json"
    for other in ("text/plain", "application/octet-stream", "image/png", "application/xml"):
        assert body_methods.kinds([("Content-Type", other)]) == []
    # two Content-Type headers: read both ways
    assert [k for k, _ in body_methods.kinds([("Content-Type", "text/plain"), FORM])] == ["form"]


def _multipart(name: str, value: bytes, boundary: str = "XyZ") -> tuple[tuple[str, str], bytes]:
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n"
            f"--{boundary}\r\nContent-Disposition: form-data; {name}\r\n\r\n").encode() + value + \
        f"\r\n--{boundary}--\r\n".encode()
    return ("Content-Type", f"multipart/form-data; boundary={boundary}"), body


def test_multipart_fields():
    ct, body = _multipart('name="_method"', b"DELETE")
    assert body_methods.body_methods([ct], body) == ["DELETE"]
    ct, body = _multipart("name*=utf-8''%5Fmethod", b"delete")
    assert body_methods.body_methods([ct], body) == ["delete"]
    ct, body = _multipart('name="file"; filename="f.txt"', b"hello")
    assert body_methods.body_methods([ct], body) == []
    # named where no parser of treg's finds a field: cannot tell
    assert body_methods.body_methods([("Content-Type", "multipart/form-data; boundary=q")],
                                     b"garbage _method DELETE") is None


def test_json_fields():
    js = ("Content-Type", "application/json")
    assert body_methods.body_methods([js], b'{"_method": "DELETE", "x": {"_method": "GET"}}') == ["DELETE"]
    assert body_methods.body_methods([js], b'{"_method": "PUT", "_method": "DELETE"}') == ["PUT", "DELETE"]
    assert body_methods.body_methods([js], b'[{"_method": "DELETE"}]') == []
    assert body_methods.body_methods([js], b"not json") == []


# -- over real HTTP: treg → the raw recorder --------------------------------------------------------

@pytest.fixture
async def rule(gateway, up):
    await gateway.tool("t", up.url)
    return await gateway.api("POST", "/api/v1/deny-rules", expect=201,
                             json={"host": "127.0.0.1", "path": "/items", "method": "DELETE", "reason": "no deletes"})


async def _assert_denied(gateway, r, rule, code="denied_by_rule"):
    assert r.status == 403, (r.status, r.body)
    body = r.json()
    assert body["error"] == code and body["rule"]["id"] == rule["id"] and r.header("X-Treg-Error") == "1"
    row = await gateway.api("GET", f"/api/v1/calls/{r.header('X-Treg-Call-Id')}", expect=200)
    assert row["outcome"] == "refused" and row["refused_by"] == "deny" and row["error_code"] == code


def _targets(up):
    return ["/call/t/items/1", f"/call/{up.url}/items/1"]


@pytest.mark.parametrize("headers, body", [
    ([FORM], b"_method=DELETE"),
    ([("Content-Type", "application/x-www-form-urlencoded; charset=UTF-8")], b"name=x&_method=delete"),
    ([FORM], b"%5Fmethod=DELETE"),
    ([], b"_method=DELETE"),  # no Content-Type: Rack reads it as a form
    ([("Content-Type", "application/json")], json.dumps({"_method": "DELETE"}).encode()),
    [[_multipart('name="_method"', b"DELETE")[0]], _multipart('name="_method"', b"DELETE")[1]],
])
async def test_a_body_method_field_is_denied(gateway, up, rule, headers, body):
    for target in _targets(up):
        await _assert_denied(gateway, await gateway.raw("POST", target, headers, body), rule)
    assert up.exchanges == []


async def test_a_chunked_form_body_is_read_too(gateway, up, rule):
    r = await gateway.raw("POST", "/call/t/items/1", [FORM, ("Transfer-Encoding", "chunked")],
                          chunks=[b"a=1&_me", b"thod=DEL", b"ETE"])
    await _assert_denied(gateway, r, rule)
    assert up.exchanges == []


async def test_a_large_form_body_is_read_up_to_the_limit(gateway, up, rule):
    # over the edge's buffering size (64 KiB), under TREG_DENY_BODY_MAX_BYTES: read, and denied
    body = b"pad=" + b"x" * 200_000 + b"&_method=DELETE"
    await _assert_denied(gateway, await gateway.raw("POST", "/call/t/items/1", [FORM], body), rule)
    assert up.exchanges == []


async def test_a_body_treg_cannot_read_under_a_method_rule_is_refused(make_app, aiohttp_client, up):
    from treg import membership
    from treg.keys import SERVICES
    from treg.testing import Gateway

    client = await aiohttp_client(make_app(ssrf_allow=("127.0.0.0/8",), deny_body_max_bytes=1000))
    gateway = Gateway(client, await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test"))
    await gateway.tool("t", up.url)
    rule = await gateway.api("POST", "/api/v1/deny-rules", expect=201,
                             json={"host": "127.0.0.1", "path": "/items", "method": "DELETE"})
    # over the edge's buffering size (so a stream) and over the limit: declared so, or chunked past it
    big = b"pad=" + b"x" * 100_000 + b"&_method=DELETE"
    await _assert_denied(gateway, await gateway.raw("POST", "/call/t/items", [FORM], big), rule,
                         "deny_body_uninspectable")
    await _assert_denied(gateway, await gateway.raw("POST", "/call/t/items", [FORM, ("Transfer-Encoding", "chunked")],
                                                    chunks=[big[:600], big[600:3000]]), rule, "deny_body_uninspectable")
    # a body the edge buffered anyway (up to 64 KiB) is read whatever the limit; other kinds and other
    # paths stream untouched
    await _assert_denied(gateway, await gateway.raw("POST", "/call/t/items", [FORM], big[-5000:]), rule)
    octets = b"\x00" * 100_000 + b"_method=DELETE"
    r = await gateway.raw("POST", "/call/t/items", [("Content-Type", "application/octet-stream")], octets)
    assert r.status == 200
    r = await gateway.raw("POST", "/call/t/other", [FORM], big)
    assert r.status == 200
    assert [ex.body for ex in up.exchanges] == [octets, big]
    await client.close()


async def test_what_passes_reaches_the_upstream_byte_for_byte(gateway, up, rule):
    # a form naming another method, a text body naming DELETE (no framework reads it), and a chunked form
    # body read for the check: each relayed as sent
    r1 = await gateway.raw("POST", "/call/t/items/1", [FORM], b"a=1&_method=PATCH")
    r2 = await gateway.raw("POST", "/call/t/items/1", [("Content-Type", "text/plain")], b"_method=DELETE")
    r3 = await gateway.raw("POST", "/call/t/items/1", [FORM, ("Transfer-Encoding", "chunked")],
                           chunks=[b"a=1&", b"b=2"])
    big = b"pad=" + b"y" * 100_000
    r4 = await gateway.raw("POST", "/call/t/items/1", [FORM], big)
    assert [r.status for r in (r1, r2, r3, r4)] == [200, 200, 200, 200]
    assert [ex.body for ex in up.exchanges] == [b"a=1&_method=PATCH", b"_method=DELETE", b"a=1&b=2", big]
    assert up.exchanges[2].header("content-length") == "7"  # read whole for the check: sent with its length


async def test_a_post_to_a_host_without_a_method_rule_is_never_read(gateway, up):
    """No method rule in reach: the body is never buffered (a chunked body arrives chunked)."""
    await gateway.tool("t", up.url)
    await gateway.api("POST", "/api/v1/deny-rules", expect=201,
                      json={"host": "127.0.0.1", "path": "/elsewhere", "method": "DELETE"})
    r = await gateway.raw("POST", "/call/t/items/1", [FORM, ("Transfer-Encoding", "chunked")],
                          chunks=[b"_method=", b"DELETE"])
    assert r.status == 200
    assert up.last.body == b"_method=DELETE" and up.last.header("transfer-encoding") == "chunked"
