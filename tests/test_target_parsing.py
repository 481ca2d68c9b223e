"""Passthrough targets are parsed once, by the connection's rules (api.md "Passthrough targets"), and
credentials in URLs are never stored (issue 9, items 1 and 9).

The set-up is an attack: the org's tool ``victim`` on ``toolhost.test`` injects a key; a caller tries to
make treg choose that tool while the connection goes to ``attacker.test`` — a second raw-socket upstream
on 127.0.0.1 behind its own name (fake DNS). Whatever the spelling, the attacker must see no connection
at all, and a refusal is treg's 400 error body with a call id, audited.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from sqlalchemy import select

from treg import testing
from treg.call.target import parse_passthrough
from treg.redaction import mask_userinfo
from treg.errors import BadRequest
from treg.infra.schema import calls

KEY = "sk_victim_key_0123456789"


@pytest.fixture
async def attacker():
    async with testing.raw_upstream() as server:
        yield server


@pytest.fixture
async def scene(gateway, up, attacker, fake_dns):
    """(gateway, victim upstream, attacker upstream, T = toolhost.test:port, A = attacker.test:port)."""
    fake_dns.records["toolhost.test"] = [("127.0.0.1", 60)]
    fake_dns.records["attacker.test"] = [("127.0.0.1", 60)]
    sid = await gateway.secret(KEY)
    t = f"toolhost.test:{up.port}"
    await gateway.tool("victim", f"http://{t}/v1",
                       [{"location": "header", "name": "X-Key", "secret_id": sid}])
    return gateway, up, attacker, t, f"attacker.test:{attacker.port}"


async def stored_row(gateway: Any, call_id: str) -> dict[str, Any]:
    await gateway.calls()  # flushes the audit writer
    async with gateway.services.db.tx() as tx:
        row = await tx.fetch_one(select(calls).where(calls.c.id == call_id))
    assert row is not None, call_id
    return dict(row)


def wire(target: str) -> str:
    """``target`` as UTF-8 on the wire (the raw helper writes latin-1: one character per byte)."""
    return target.encode("utf-8").decode("latin-1")


def assert_nothing_reached(attacker: Any) -> None:
    assert attacker.connections == 0 and attacker.exchanges == []


#: every spelling a parser differential could turn into "tool of T, connection to A"; {T} and {A} are
#: host:port. Each is refused with 400 before any tool is chosen.
AMBIGUOUS = [
    "http://{A}#@{T}/v1/x",  # '#': a fragment to yarl, so A is dialled; after the '@' a naive split reads T
    "http://{A}/#@{T}/v1/x",
    "http://{T}/v1/x#@{A}",  # a fragment after the path is cut off by the connection: refused as well
    "HTTP://{A}#@{T}/v1/x",  # uppercase scheme
    "http:/{A}#@{T}/v1/x",  # collapsed slashes
    "http:///{A}#@{T}/v1/x",
    "http://{A}\\@{T}/v1/x",  # WHATWG reads '\' as '/'
    "http://{T}\\@{A}/v1/x",
    "http://{T}\\{A}/v1/x",
    "http://{A}@{T}/v1/x",  # user-info
    "http://{T}@{A}/v1/x",
    "http://user:pw@{T}/v1/x",
    "http://{A}%40{T}/v1/x",  # a decoding proxy reads %40 as '@'
    "http://{A}%23@{T}/v1/x",
    "http://{A}%2F@{T}/v1/x",
    "http://attacker%2Etest:{Aport}/v1/x",  # encoded dots
    "http://[::1]:{Aport}#@{T}/v1/x",  # IPv6 brackets
    "http://[::ffff:127.0.0.1]@{T}/v1/x",
    "http://attacker.test:{Tport}#@{T}/v1/x",  # ports: the tool's port on the attacker's name
    "http://attacker.test:#@{T}/v1/x",
    "http://toolhost.test.#@{T}/v1/x",  # trailing dot
    "http://%E2%93%A3oolhost.test:{Tport}/v1/x",  # IDNA: an enclosed letter, percent-encoded
    "http://toolhost.tes%EF%BD%94:{Tport}/v1/x",  # a full-width letter, percent-encoded
]


@pytest.mark.parametrize("spelling", AMBIGUOUS)
async def test_ambiguous_targets_are_refused_before_any_tool_is_chosen(scene, spelling):
    gateway, up, attacker, t, a = scene
    target = "/call/" + spelling.format(T=t, A=a, Tport=up.port, Aport=attacker.port)
    r = await gateway.raw("GET", wire(target))
    assert r.status == 400, (target, r.status, r.body)
    body = r.json()
    assert body["error"] == "ambiguous_target" and body["blame"] == "caller" and body["detail"], body
    assert r.header("X-Treg-Error") == "1"
    call_id = r.header("X-Treg-Call-Id")
    assert call_id
    assert_nothing_reached(attacker)
    assert up.exchanges == []  # refused: not even the tool's own host is asked
    row = await stored_row(gateway, call_id)
    assert row["outcome"] == "refused" and row["status"] == 400 and row["error_code"] == "ambiguous_target"
    assert row["tool_id"] is None  # no tool was chosen
    assert KEY not in json.dumps(row, default=str)


#: spellings whose host has one reading: they go where that reading says, never to the attacker
UNAMBIGUOUS = [
    ("http://{T}/v1/x@{A}/y", 200),  # an '@' in the path is path
    ("http://{T}/v1/x\\@{A}", 200),  # so is a '\'
    ("hTtP://TOOLHOST.test:{Tport}/v1/x", 200),  # scheme and host case
    ("http://toolhost.test:0{Tport}/v1/x", 200),  # a leading zero in the port: the same port
    ("http:/{T}/v1/x", 200),  # collapsed slashes
    ("http://{A}/v1/x", 404),  # the attacker's own host: no tool serves it, nothing is dialled
    ("http://toolhost.test.:{Tport}/v1/x", 404),  # a trailing dot is another name: no tool, fail closed
    ("http://toolhost.test:{Aport}/v1/x", 404),  # the tool's host on another port is another target
    ("https://{T}/v1/x", 404),  # another scheme
]


@pytest.mark.parametrize("spelling,status", UNAMBIGUOUS)
async def test_unambiguous_targets_go_where_their_host_says(scene, spelling, status):
    gateway, up, attacker, t, a = scene
    target = "/call/" + spelling.format(T=t, A=a, Tport=up.port, Aport=attacker.port)
    r = await gateway.raw("GET", target)
    assert r.status == status, (target, r.status, r.body)
    assert_nothing_reached(attacker)
    if status == 200:
        assert up.last.header("X-Key") == KEY and up.last.target.startswith("/v1/x")
        assert up.last.header("Host").lower() in (t, f"toolhost.test:0{up.port}")
    else:
        assert r.json()["error"] == "tool_not_found" and up.exchanges == []


@pytest.mark.parametrize("target", ["/call/http://toolhost.test\t#@x/", "/call/http://a\nb/",
                                    "/call/http://\u24e3oolhost.test/v1/x",
                                    "/call/http://toolhost.tes\uff54/v1/x"])
async def test_whitespace_or_unicode_in_a_target_never_reaches_a_tool(scene, target):
    """A tab or newline (yarl silently drops them) or a raw non-ASCII host (IDNA would map ⓣ to t) is
    refused, by aiohttp's request-line parser or by treg."""
    gateway, up, attacker, t, a = scene
    r = await gateway.raw("GET", wire(target.replace("x/", t + "/")))
    assert 400 <= r.status < 500
    assert_nothing_reached(attacker)
    assert up.exchanges == []


async def test_the_hash_attack_from_the_issue(scene):
    """The issue's exploit verbatim: ``/call/http://ATTACKER#@TOOLHOST/…`` chose TOOLHOST's tool and sent
    its key to ATTACKER, audited as ok."""
    gateway, up, attacker, t, a = scene
    r = await gateway.raw("GET", f"/call/http://{a}#@{t}/v1/charges")
    assert r.status == 400 and r.json()["error"] == "ambiguous_target"
    assert_nothing_reached(attacker)
    detail = await gateway.api("GET", f"/api/v1/calls/{r.header('X-Treg-Call-Id')}", expect=200)
    assert detail["outcome"] == "refused" and detail["tool_id"] is None


# -- item 9: credentials in URLs are never stored ------------------------------------------------------

async def test_passthrough_credentials_are_refused_and_not_stored(scene):
    gateway, up, attacker, t, a = scene
    r = await gateway.raw("GET", f"/call/http://user:pw-0451@{t}/v1/x?q=1")
    assert r.status == 400 and r.json()["error"] == "ambiguous_target"
    assert up.exchanges == []
    call_id = r.header("X-Treg-Call-Id")
    detail = await gateway.api("GET", f"/api/v1/calls/{call_id}", expect=200)
    row = await stored_row(gateway, call_id)
    for where in (json.dumps(detail), json.dumps(row, default=str)):
        assert "pw-0451" not in where and "user:" not in where, where
    assert row["target"] == f"http://[REDACTED]@{t}/v1/x"


async def test_a_base_url_with_user_info_is_not_copied_into_the_audit(scene):
    """A base URL may carry user-info (the tool's ``host`` is its netloc without it): a named call's
    upstream URL and failed-call evidence never keep it."""
    gateway, up, attacker, t, a = scene
    await gateway.tool("basic", f"http://svc:pw-7788@{t}/v1")
    up.responder = lambda ex: testing.http_response(500, b"boom")
    r = await gateway.raw("GET", "/call/basic/things?x=1")
    assert r.status == 500
    assert up.last.header("Authorization") == "Basic c3ZjOnB3LTc3ODg="  # still sent, as before
    call_id = r.header("X-Treg-Call-Id")
    detail = await gateway.api("GET", f"/api/v1/calls/{call_id}", expect=200)
    row = await stored_row(gateway, call_id)
    assert detail["error_request"]["url"] == f"http://[REDACTED]@{t}/v1/things?x=1"
    assert row["upstream_url"] == f"http://[REDACTED]@{t}/v1/things"
    for where in (json.dumps(detail), json.dumps(row, default=str)):
        assert "pw-7788" not in where and "svc:" not in where, where


def test_mask_userinfo_takes_the_widest_authority():
    m = "[REDACTED]"
    assert mask_userinfo("https://u:p@h/x", m) == "https://[REDACTED]@h/x"
    assert mask_userinfo("https:/u:p@h/x@y", m) == "https:/[REDACTED]@h/x@y"
    assert mask_userinfo("http://a#u:p@h/x", m) == "http://[REDACTED]@h/x"
    assert mask_userinfo("http://h/x@y", m) == "http://h/x@y"  # an '@' in the path is no user-info
    assert mask_userinfo("tool/a@b", m) == "tool/a@b"


def test_parse_passthrough_is_yarls_parse():
    url = parse_passthrough("http", "Example.COM:0080/a/../b")
    assert (url.raw_host, url.port, url.raw_path) == ("Example.COM", 80, "/a/../b")
    assert parse_passthrough("http", "[2001:db8::1]:8443/x").raw_host == "2001:db8::1"
    for bad in ("a#b", "a@b", "a\\b", "a%2eb", "a b", "\u00e4.example", "", "h:99999", "h;x"):
        with pytest.raises(BadRequest):
            parse_passthrough("http", bad + "/x")


def test_the_relay_refuses_a_url_that_dials_elsewhere():
    """The last guard before the send: the URL sent must dial the (scheme, host, port) the tool was
    chosen by (here as a parser drift would produce it)."""
    from yarl import URL

    from treg.call.target import ensure_dials
    from treg.infra.upstream import DialKey

    ensure_dials(URL("http://Toolhost.test:8080/x?k=1", encoded=True), DialKey("http", "toolhost.test", 8080))
    for sent in ("http://attacker.test/#@toolhost.test:8080/x", "http://toolhost.test:8081/x",
                 "https://toolhost.test:8080/x"):
        with pytest.raises(BadRequest) as err:
            ensure_dials(URL(sent, encoded=True), DialKey("http", "toolhost.test", 8080))
        assert err.value.code == "ambiguous_target"
