"""``TREG_TRUSTED_PROXIES`` (operability.md, "Behind a reverse proxy"): ``X-Forwarded-For`` and
``X-Forwarded-Proto`` are believed only from a peer inside it, read from the right; from anyone else they
are ignored; either way they never reach an upstream."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiohttp import web

from treg import logs, membership
from treg.app import make_runner
from treg.errors import ConfigError
from treg.forwarded import client_address, demo_client, forwarded_proto, trusted_networks
from treg.keys import SERVICES
from treg.settings import load
from treg.testing import raw_exchange, raw_request_bytes

PROXIES = trusted_networks(("127.0.0.1", "10.0.0.0/8", "fd00::/8"))


def xff(*values: str) -> list[tuple[str, str]]:
    return [("X-Forwarded-For", v) for v in values]


@pytest.mark.parametrize("peer, headers, expected", [
    # an untrusted peer: its own address, whatever it writes
    ("203.0.113.9", xff("198.51.100.1"), "203.0.113.9"),
    ("127.0.0.2", xff("198.51.100.1"), "127.0.0.2"),
    # a trusted proxy: the address it got the request from (the last entry)
    ("127.0.0.1", xff("198.51.100.1"), "198.51.100.1"),
    ("127.0.0.1", [], "127.0.0.1"),
    ("127.0.0.1", xff(""), "127.0.0.1"),
    # read from the right: what the client wrote left of the proxies' entries is not believed
    ("127.0.0.1", xff("6.6.6.6, 198.51.100.1"), "198.51.100.1"),
    ("127.0.0.1", xff("6.6.6.6, 198.51.100.1, 10.1.2.3"), "198.51.100.1"),  # through two trusted hops
    ("127.0.0.1", xff("6.6.6.6", "198.51.100.1, 10.1.2.3"), "198.51.100.1"),  # two headers are one list
    ("127.0.0.1", xff("10.9.9.9, 10.1.2.3"), "10.9.9.9"),  # only proxies: the farthest one
    # garbage from a trusted hop: the last address it vouched for
    ("127.0.0.1", xff("198.51.100.1, not-an-ip"), "127.0.0.1"),
    ("127.0.0.1", xff("not-an-ip, 10.1.2.3"), "10.1.2.3"),
    ("127.0.0.1", xff("unknown"), "127.0.0.1"),
    # spellings proxies use: a port, brackets, IPv6, an IPv4-mapped peer
    ("127.0.0.1", xff("198.51.100.1:4711"), "198.51.100.1"),
    ("127.0.0.1", xff("[2001:db8::1]:4711"), "2001:db8::1"),
    ("fd00::5", xff("2001:db8::1"), "2001:db8::1"),
    ("::ffff:127.0.0.1", xff("198.51.100.1"), "198.51.100.1"),
    # the header's name in any case
    ("127.0.0.1", [("x-forwarded-for", "198.51.100.1")], "198.51.100.1"),
    (None, xff("198.51.100.1"), None),
])
def test_client_address(peer, headers, expected):
    assert client_address(peer, headers, PROXIES) == expected


def test_nothing_is_believed_when_no_proxy_is_trusted():
    assert client_address("127.0.0.1", xff("198.51.100.1"), ()) == "127.0.0.1"
    assert forwarded_proto("127.0.0.1", [("X-Forwarded-Proto", "https")], ()) is None


def test_forwarded_proto():
    https = [("X-Forwarded-Proto", "https")]
    assert forwarded_proto("127.0.0.1", https, PROXIES) == "https"
    assert forwarded_proto("203.0.113.9", https, PROXIES) is None
    assert forwarded_proto("127.0.0.1", [("X-Forwarded-Proto", "HTTPS")], PROXIES) == "https"
    assert forwarded_proto("127.0.0.1", [("X-Forwarded-Proto", "https, http")], PROXIES) == "http"  # the nearest hop
    assert forwarded_proto("127.0.0.1", [("X-Forwarded-Proto", "gopher")], PROXIES) is None
    assert forwarded_proto("127.0.0.1", [], PROXIES) is None


def test_the_setting_takes_addresses_and_cidrs_and_refuses_garbage():
    assert load(environ={"TREG_TRUSTED_PROXIES": "127.0.0.1, 10.0.0.0/8,::1"}).trusted_proxies == (
        "127.0.0.1", "10.0.0.0/8", "::1")
    assert load(environ={}).trusted_proxies == ()
    with pytest.raises(ConfigError):
        load(environ={"TREG_TRUSTED_PROXIES": "127.0.0.1,proxy.internal"})


class _Access(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.fields: list[dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "aiohttp.access":
            self.fields.append(getattr(record, logs.EXTRA_FIELDS))


@pytest.fixture
async def served(make_app):
    """treg under its own runner (as ``treg serve``, access lines to logging), trusting 127.0.0.1 only."""
    app = make_app(trusted_proxies=("127.0.0.1/32",), ssrf_allow=("127.0.0.0/8",))
    runner = make_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    handler = _Access()
    access = logging.getLogger("aiohttp.access")
    saved = access.level
    access.setLevel(logging.INFO)
    access.addHandler(handler)
    try:
        yield app, site._server.sockets[0].getsockname()[1], handler  # type: ignore[union-attr]
    finally:
        access.removeHandler(handler)
        access.setLevel(saved)
        await runner.cleanup()


async def test_the_access_log_names_the_client_a_trusted_proxy_forwarded_and_only_that(served, up):
    app, port, access = served
    org = await membership.create_org(app[SERVICES], slug="acme", email="owner@acme.test")
    forged = [("X-Forwarded-For", "6.6.6.6, 198.51.100.7"), ("X-Forwarded-Proto", "https")]
    for source in ("127.0.0.1", "127.0.0.2"):
        reply = await raw_exchange(port, raw_request_bytes("GET", "/healthz", forged), source=source)
        assert reply.status == 200
    await asyncio.sleep(0.05)
    assert [f["client"] for f in access.fields if f["path"] == "/healthz"] == ["198.51.100.7", "127.0.0.2"]

    # and none of them reaches an upstream, from a trusted proxy or not
    headers = [("X-Treg-Token", org["token"]), *forged, ("X-Forwarded-Host", "evil.test"), ("X-Forwarded-Port", "1"),
               ("Forwarded", "for=6.6.6.6;proto=https"), ("X-Real-IP", "6.6.6.6")]
    reply = await raw_exchange(port, raw_request_bytes("POST", "/api/v1/tools", [
        ("X-Treg-Token", org["token"]), ("Content-Type", "application/json")],
        b'{"name": "up", "base_url": "' + up.url.encode() + b'/v1", "bindings": []}'))
    assert reply.status == 201, reply.body
    for source in ("127.0.0.1", "127.0.0.2"):
        reply = await raw_exchange(port, raw_request_bytes("GET", "/call/up/x", headers), source=source)
        assert reply.status == 200, reply.body
        raw = up.last.raw.lower()
        for name in (b"x-forwarded-", b"forwarded:", b"x-real-ip", b"6.6.6.6", b"198.51.100.7", b"evil.test"):
            assert name not in raw, (name, up.last.raw)


async def test_a_request_aiohttp_refused_still_gets_its_access_line(served):
    """Refused by the parser before routing, it has no app to read the trusted proxies from: its line
    names the peer (and is written at all)."""
    _, port, access = served
    reply = await raw_exchange(port, b"GET /x HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 6.6.6.6\r\nBad Header\x7f: 1\r\n\r\n")
    assert reply.status == 400
    for _ in range(100):
        if any(f["status"] == 400 for f in access.fields):
            break
        await asyncio.sleep(0.02)
    assert [f["client"] for f in access.fields if f["status"] == 400] == ["127.0.0.1"]


@pytest.mark.parametrize("peer, headers, expected", [
    # an untrusted peer: its own address, whatever it writes (the public demo's client, sharing.md)
    ("203.0.113.9", xff("198.51.100.1"), "203.0.113.9"),
    ("203.0.113.9", [], "203.0.113.9"),
    # a trusted proxy: the access log's reading (client_address), the first untrusted entry from the right
    ("127.0.0.1", xff("198.51.100.1, 10.1.1.1"), "198.51.100.1"),
    ("127.0.0.1", xff("198.51.100.1", "10.1.1.1"), "198.51.100.1"),
    ("10.2.3.4", xff("[2001:db8::7]:443, 10.1.1.1"), "2001:db8::/64"),
    ("127.0.0.1", xff("198.51.100.1:5555"), "198.51.100.1"),
    # behind a proxy that appends: what the visitor wrote first never picks its bucket
    ("127.0.0.1", xff("203.0.113.77, 198.51.100.1"), "198.51.100.1"),
    ("127.0.0.1", xff("10.9.9.9, 198.51.100.1"), "198.51.100.1"),
    ("127.0.0.1", xff("garbage, 198.51.100.1"), "198.51.100.1"),
    # nothing usable where the trusted hop wrote: the proxy's own bucket (garbage never opens a fresh one)
    ("127.0.0.1", xff("198.51.100.1, garbage"), "127.0.0.1"),
    ("127.0.0.1", xff(""), "127.0.0.1"),
    ("127.0.0.1", [], "127.0.0.1"),
    # IPv6 by its /64; an IPv4-mapped peer as IPv4
    ("2001:db8:1:2:3:4:5:6", [], "2001:db8:1:2::/64"),
    ("::ffff:203.0.113.9", [], "203.0.113.9"),
    (None, [], "unknown"),
    ("not-an-address", [], "unknown"),
])
def test_the_demo_client_is_the_client_address_bucketed(peer, headers, expected):
    assert demo_client(peer, headers, PROXIES) == expected
    # with no trusted proxy, the headers never matter
    assert demo_client(peer, headers, ()) == demo_client(peer, [], ())
