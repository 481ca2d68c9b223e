"""A ``Location`` treg cannot read exactly as every client would is never relayed as it was (issue 20,
item 0; treg/uri_grammar.py, treg/call/redirects.py).

An upstream (the tool's, over http and over https) answers each malformed value with 301, 302, 303,
307 and 308; every real client that follows redirects — httpx, the OpenAI and Anthropic SDKs in their
default configuration, requests, urllib, the Stripe SDK as docs/clients.md sets it up, ``curl -L`` —
follows the answer with its treg token and a prompt in the body. Each value names an "evil" listener on
127.0.0.1 (to the client: every value here is one some client reads as a URL on that host; before the
fix treg relayed it unchanged, or sealed into a ``/redirect/`` a URL treg read differently): that
listener must see **no connection at all**, neither from a client nor from treg.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import urllib.error
import urllib.request

import aiohttp.connector
import anthropic
import httpx
import openai
import pytest
import requests
import stripe

from treg.testing import Exchange, http_response, raw_upstream, self_signed

SECRET = "sk_live_VENDORKEY_loc"
PROMPT = b'{"model": "m", "messages": [{"role": "user", "content": "the secret prompt"}]}'
STATUSES = (301, 302, 303, 307, 308)

#: {E}: the evil listener as ``127.0.0.1:<port>``; {P}: its port alone
MALFORMED = (
    "http://x[@{E}/p",  # httpx, curl: host {E}; urllib: a broken IPv6 literal
    "http://a]b@{E}/p",
    "http:////{E}/p",  # requests, urllib: host {E} (relayed as it was when the scheme differs from the tool's)
    "https:////{E}/p",
    "http:///{E}/p",  # curl -L: host {E}
    "https:///{E}/p",
    "http:/{E}/p",
    "https:/{E}/p",
    "http:{E}/p",
    "\\\\{E}/p",  # a browser reads \ as /
    "/\\{E}/p",
    "http:\\\\{E}/p",
    "http://{E}\\@x/p",
    "/\t/{E}/p",  # urllib drops the tab: //{E}/p
    "http://{E}\t/p",
    "http://{E}/a b",
    "http://u:p@{E}/p",  # user-info
    "http://[::1]@{E}/p",
    "http://%31%32%37.0.0.1:{P}/p",  # percent-encoded host
    "http://\uff11\uff12\uff17.0.0.1:{P}/p",  # full-width digits: 127.0.0.1 after IDNA mapping
    "http://127.1:{P}/p",  # 127.0.0.1 to curl and browsers, a DNS name to Python
    "http://0x7f.0.0.1:{P}/p",
    "http://2130706433:{P}/p",
    "http://127.0.0.1:0{P}/p",  # a port with a leading zero
    "ftp://{E}/p",  # curl -L and urllib follow ftp
    "javascript:fetch('//{E}/p')",
)


def _value(template: str, port: int) -> str:
    return template.replace("{E}", f"127.0.0.1:{port}").replace("{P}", str(port))


@pytest.fixture
async def world(gateway, monkeypatch):
    """(gateway, evil, cases): tools ``plain`` (http) and ``tls`` (https) whose upstream answers
    ``/m/<case>/<status>/…`` with that status and the case's malformed Location."""
    cert = self_signed()
    # treg's upstream session verifies certificates with aiohttp's default context: trust this one
    monkeypatch.setattr(aiohttp.connector, "_SSL_CONTEXT_VERIFIED", cert.client_context())
    async with raw_upstream(lambda ex: http_response(200, b"evil")) as evil:
        values = [_value(t, evil.port) for t in MALFORMED]

        def answer(ex: Exchange) -> bytes:
            parts = ex.target.split("/")
            if len(parts) > 3 and parts[1] == "m":
                return http_response(int(parts[3]), b"", [("Location", values[int(parts[2])])], reason="Moved")
            return http_response(404, b"{}")

        async with raw_upstream(answer) as plain, raw_upstream(answer, ssl=cert.server_context()) as tls:
            sid = await gateway.secret(SECRET)
            bearer = [{"location": "header", "name": "Authorization", "format": "Bearer {secret}", "secret_id": sid}]
            await gateway.tool("plain", plain.url, bearer)
            await gateway.tool("tls", tls.url, bearer)
            yield gateway, evil, values, (plain, tls)


def _cases(values: list[str]) -> list[tuple[str, int, int]]:
    """(tool, case, status) for every value, status and tool."""
    return [(tool, i, s) for tool in ("plain", "tls") for i in range(len(values)) for s in STATUSES]


def _treg(gateway) -> str:
    return f"http://127.0.0.1:{gateway.client.port}"


async def _follow_all(world, client) -> None:
    """``client(token)`` makes one client (in a thread) and returns its ``follow(url)``, called (blocking,
    in a thread) for every case; the evil listener must see nothing."""
    gateway, evil, values, ups = world
    follow = await asyncio.to_thread(client, gateway.org["token"])
    reached = []
    for tool, i, status in _cases(values):
        before = evil.connections
        try:
            await asyncio.to_thread(follow, f"{_treg(gateway)}/call/{tool}/m/{i}/{status}")
        except Exception:  # noqa: BLE001 (a client refusing the answer is fine; only a connection to evil is not)
            pass
        if evil.connections != before:
            reached.append((tool, status, values[i]))
    assert reached == [] and evil.connections == 0 and evil.exchanges == [], reached
    assert all(ex.header("authorization") == f"Bearer {SECRET}" for up in ups for ex in up.exchanges)
    assert sum(len(up.exchanges) for up in ups) >= len(_cases(values))  # every case reached its upstream


async def test_treg_relays_no_malformed_location(world):
    """The answer itself: no Location (dropped), or one into treg; the upstream's value in
    X-Treg-Upstream-Location. Never a 500."""
    gateway, evil, values, _ = world
    for tool, i, status in _cases(values):
        r = await gateway.call("POST", f"/call/{tool}/m/{i}/{status}", data=PROMPT, allow_redirects=False)
        assert r.status == status, (values[i], await r.text())
        assert r.headers.getall("Location", []) == [], (tool, values[i], r.headers.getall("Location"))
        assert r.headers.getall("X-Treg-Upstream-Location") == [values[i]]
    assert evil.connections == 0


async def test_httpx_follows_none(world):
    def client(token: str):
        c = httpx.Client(headers={"X-Treg-Token": token}, follow_redirects=True, timeout=5)
        return lambda url: c.post(url, content=PROMPT)
    await _follow_all(world, client)


async def test_openai_sdk_follows_none(world):
    def client(token: str):
        sdk = openai.OpenAI(api_key="set-by-treg", base_url="http://unused.invalid/v1", max_retries=0, timeout=5,
                            default_headers={"X-Treg-Token": token})
        return lambda url: sdk.with_options(base_url=url + "/v1").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "the secret prompt"}])
    await _follow_all(world, client)


async def test_anthropic_sdk_follows_none(world):
    def client(token: str):
        sdk = anthropic.Anthropic(api_key="set-by-treg", base_url="http://unused.invalid", max_retries=0, timeout=5,
                                  default_headers={"X-Treg-Token": token})
        return lambda url: sdk.with_options(base_url=url).messages.create(
            model="m", max_tokens=5, messages=[{"role": "user", "content": "the secret prompt"}])
    await _follow_all(world, client)


async def test_requests_follows_none(world):
    def client(token: str):
        return lambda url: requests.post(url, data=PROMPT, headers={"X-Treg-Token": token}, timeout=5)
    await _follow_all(world, client)


async def test_urllib_follows_none(world):
    def follow(url: str, token: str) -> None:
        req = urllib.request.Request(url, data=PROMPT, headers={"X-Treg-Token": token}, method="POST")
        try:
            urllib.request.urlopen(req, timeout=5).read()
        except urllib.error.HTTPError as exc:
            exc.close()
    await _follow_all(world, lambda token: lambda url: follow(url, token))


async def test_stripe_sdk_follows_none(world):
    def client(token: str):
        session = requests.Session()  # as docs/clients.md sets it up
        session.headers["X-Treg-Token"] = token
        http = stripe.RequestsClient(session=session)
        return lambda url: stripe.StripeClient("sk_set_by_treg", base_addresses={"api": url}, http_client=http,
                                               max_network_retries=0).v1.customers.create(
            params={"email": "a@example.com"})
    await _follow_all(world, client)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_curl_location_follows_none(world):
    def follow(url: str, token: str) -> None:
        subprocess.run(["curl", "-s", "-L", "--max-redirs", "5", "-m", "5", "-o", "/dev/null",
                        "-H", f"X-Treg-Token: {token}", "-H", "Content-Type: application/json",
                        "--data-binary", PROMPT.decode(), url], check=False, timeout=20)
    await _follow_all(world, lambda token: lambda url: follow(url, token))


WELL_FORMED = ("//{E}/p?a=1", "HTTP://{E}/p", "http://{E}#@x/p", "/../p/./q", "http://[::1]:1/p")


async def test_well_formed_edge_cases_are_rewritten_not_dropped(world):
    """The strict grammar keeps what every client reads alike: a scheme-relative value, an upper-case
    scheme, a fragment holding ``@``, dot segments, an IPv6 literal. Each becomes a treg URL, and the hop
    that follows it reaches the named host with neither the treg token nor the key."""
    gateway, evil, _, (plain, _) = world
    values = [_value(t, evil.port) for t in WELL_FORMED]

    def answer(ex: Exchange) -> bytes:
        parts = ex.target.split("/")
        if len(parts) > 2 and parts[1] == "w":
            return http_response(302, b"", [("Location", values[int(parts[2])])], reason="Found")
        return http_response(200, json.dumps({"target": ex.target}).encode())

    plain.responder = answer
    r = await gateway.call("GET", "/call/plain/w/0", allow_redirects=False)
    assert r.headers["Location"].startswith("/redirect/")
    assert (await gateway.call("GET", "/call/plain/w/1", allow_redirects=False)).headers["Location"].startswith(
        "/redirect/")
    r = await gateway.call("GET", "/call/plain/w/2", allow_redirects=False)
    assert r.headers["Location"].startswith("/redirect/") and r.headers["Location"].endswith("#@x/p")
    r = await gateway.call("GET", "/call/plain/w/3", allow_redirects=False)
    assert r.headers["Location"] == "/call/plain/p/q"  # resolved against /w/3, dot segments removed
    r = await gateway.call("GET", "/call/plain/w/4", allow_redirects=False)
    assert r.headers["Location"].startswith("/redirect/")
    token = gateway.org["token"]
    for i in (0, 1):
        r = await asyncio.to_thread(requests.get, f"{_treg(gateway)}/call/plain/w/{i}",
                                    headers={"X-Treg-Token": token}, timeout=10)
        assert r.status_code == 200 and r.content == b"evil"
    assert evil.exchanges and all(token.encode() not in ex.raw and SECRET.encode() not in ex.raw
                                  and ex.header("authorization") is None for ex in evil.exchanges)
