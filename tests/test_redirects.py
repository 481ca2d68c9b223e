"""Redirects stay inside treg (api.md "Details that are fixed": Redirects), with the real clients that
follow them: requests, httpx, the OpenAI and Anthropic SDKs (both follow redirects by default).

A fake vendor (the tool's upstream, 127.0.0.1) answers with redirects; a fake third party on another
host name (``localhost``: a client resolves it too, so on the old code it was reached directly) records
every byte it receives: it must never see the treg token nor the tool's credential."""

from __future__ import annotations

import asyncio
import base64
import json
import time

import anthropic
import httpx
import openai
import pytest
import requests

from treg import membership
from treg.call import redirects
from treg.infra.crypto import SecretBox, new_key_text, decode_key
from treg.testing import Exchange, http_response, raw_upstream

SECRET = "sk_live_VENDORKEY_123"

CHAT = {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi there"}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}}
MESSAGE = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "stop_reason": "end_turn",
           "stop_sequence": None, "content": [{"type": "text", "text": "hello from far away"}],
           "usage": {"input_tokens": 1, "output_tokens": 2}}


def _json(status: int, data: object, headers: list[tuple[str, str]] | None = None) -> bytes:
    return http_response(status, json.dumps(data).encode(), [("Content-Type", "application/json"), *(headers or [])])


def _redirect(status: int, location: str, extra: list[tuple[str, str]] | None = None) -> bytes:
    return http_response(status, b"", [("Location", location), *(extra or [])], reason="Moved")


@pytest.fixture
async def world(gateway, fake_dns):
    """(gateway, vendor, third, tool_name): the tool ``llm`` on the vendor's root with a bearer key."""
    fake_dns.records["intranet.test"] = [("10.20.30.40", 60)]

    async def third_answer(ex: Exchange) -> bytes:
        if ex.target.startswith("/hop"):
            return _redirect(302, "/landing?after=hop")  # relative: resolved against the third party
        if ex.target.startswith("/v1/chat/completions"):
            return _json(200, CHAT)
        if ex.target.startswith("/v1/messages"):
            return _json(200, MESSAGE)
        return _json(200, {"at": "third", "target": ex.target})

    async with raw_upstream(third_answer) as third:
        far = f"http://localhost:{third.port}"

        async def vendor_answer(ex: Exchange) -> bytes:
            t = ex.target
            if t.startswith("/away"):
                return _redirect(302, f"{far}/landing?sig=presigned-TOKEN-9",
                                 [("X-Treg-Upstream-Location", "http://evil.example/")])
            if t.startswith("/inside"):
                return _redirect(302, "/target?page=2")  # relative, into the tool's own base URL
            if t.startswith("/chain"):
                return _redirect(302, f"{far}/hop")
            if t.startswith("/echo"):
                # an upstream that puts the injected key into its Location
                return _redirect(302, f"{far}/landing?k={ex.header('authorization').split()[-1]}")
            if t.startswith("/metadata"):
                return _redirect(302, "http://169.254.169.254/latest/meta-data/")
            if t.startswith("/intranet"):
                return _redirect(302, f"http://intranet.test:{third.port}/admin")
            if t.startswith("/v1/chat/completions"):
                return _redirect(307, f"{far}/v1/chat/completions")
            if t.startswith("/v1/messages"):
                return _redirect(307, f"{far}/v1/messages")
            if t.startswith("/odd"):
                return http_response(302, b"", [("Location", "http://[::1/broken"), ("Location", "myapp://done"),
                                                ("Content-Location", "")])
            if t.startswith("/paged"):  # pagination: a relative link into the tool, one to a third party
                return _json(200, {"page": t}, [("Link", f'</paged?p=2>; rel="next", <{far}/elsewhere?x=1,2>; '
                                                         'rel="last"; title="the, last one"')])
            if t.startswith("/smuggle"):  # a link hidden in a quoted parameter, as requests splits it
                return _json(200, {}, [("Link", f'</paged?p=2>; title="x, <{far}/stolen>; rel=next"')])
            if t.startswith("/badlink"):
                return _json(200, {}, [("Link", "https://x.example/2; rel=next")])
            if t.startswith("/created"):
                return http_response(201, b"{}", [("Location", "/target/42"),
                                                  ("Content-Location", f"{far}/landing")])
            return _json(200, {"at": "vendor", "target": t, "auth": ex.header("authorization")})

        async with raw_upstream(vendor_answer) as vendor:
            sid = await gateway.secret(SECRET)
            await gateway.tool("llm", vendor.url, [{"location": "header", "name": "Authorization",
                                                     "format": "Bearer {secret}", "secret_id": sid}])
            yield gateway, vendor, third


def _base(gateway) -> str:
    return f"http://127.0.0.1:{gateway.client.port}"


def _assert_clean(third, gateway) -> None:
    """The third party saw neither the treg token nor the vendor's key, in any header or byte."""
    assert third.exchanges, "the third party was never reached"
    for ex in third.exchanges:
        assert not [k for k, _ in ex.headers if k.lower().startswith("x-treg")], ex.headers
        assert ex.header("authorization") is None, ex.headers
        assert gateway.org["token"].encode() not in ex.raw
        assert SECRET.encode() not in ex.raw


async def test_requests_follows_to_third_party_without_token_or_key(world):
    gateway, vendor, third = world
    tok = gateway.org["token"]
    r = await asyncio.to_thread(requests.get, f"{_base(gateway)}/call/llm/away",
                                headers={"X-Treg-Token": tok, "Authorization": "Bearer caller-own"}, timeout=10)
    assert r.status_code == 200 and r.json() == {"at": "third", "target": "/landing?sig=presigned-TOKEN-9"}
    hop = r.history[0]
    assert hop.status_code == 302 and hop.headers["Location"].startswith("/redirect/")
    # only treg's own X-Treg-Upstream-Location (the upstream's was dropped), with the upstream's value
    assert hop.raw.headers.getlist("X-Treg-Upstream-Location") == [
        f"http://localhost:{third.port}/landing?sig=presigned-TOKEN-9"]
    opaque = hop.headers["Location"][len("/redirect/"):]
    raw = base64.urlsafe_b64decode(opaque + "=" * (-len(opaque) % 4))
    for readable in (b"localhost", b"presigned", b"landing", tok.encode()):
        assert readable not in raw and readable.decode() not in opaque
    _assert_clean(third, gateway)
    assert vendor.last.header("authorization") == f"Bearer {SECRET}"


async def test_redirect_hop_is_audited_with_surface_and_parent(world):
    gateway, _, third = world
    r = await asyncio.to_thread(requests.get, f"{_base(gateway)}/call/llm/away",
                                headers={"X-Treg-Token": gateway.org["token"]}, timeout=10)
    parent, child = r.history[0].headers["X-Treg-Call-Id"], r.headers["X-Treg-Call-Id"]
    detail = await gateway.api("GET", f"/api/v1/calls/{child}", expect=200)
    assert detail["surface"] == "redirect" and detail["parent_call_id"] == parent
    assert detail["tool_id"] is None and detail["outcome"] == "ok" and detail["status"] == 200
    assert detail["upstream_url"] == f"http://localhost:{third.port}/landing"
    assert detail["member_id"] == gateway.org["member_id"]
    first = await gateway.api("GET", f"/api/v1/calls/{parent}", expect=200)
    assert first["surface"] == "call" and first["parent_call_id"] is None and first["status"] == 302


async def test_redirect_into_the_same_tool_stays_a_call_with_the_credential(world):
    gateway, vendor, _ = world
    tok = gateway.org["token"]
    base = _base(gateway)
    r = await asyncio.to_thread(requests.get, f"{base}/call/llm/inside", headers={"X-Treg-Token": tok}, timeout=10)
    assert r.history[0].headers["Location"] == "/call/llm/target?page=2"
    assert r.history[0].headers["X-Treg-Upstream-Location"] == "/target?page=2"
    assert r.status_code == 200 and r.json()["target"] == "/target?page=2"
    assert vendor.last.header("authorization") == f"Bearer {SECRET}"
    # the passthrough form comes back in the passthrough form
    r = await asyncio.to_thread(requests.get, f"{base}/call/{vendor.url}/inside", headers={"X-Treg-Token": tok},
                                timeout=10)
    assert r.history[0].headers["Location"] == f"/call/{vendor.url}/target?page=2"
    assert r.status_code == 200 and r.json()["auth"] == f"Bearer {SECRET}"
    # a 201's Location is a treg URL too, and Content-Location elsewhere a /redirect link
    r = await gateway.call("POST", "/call/llm/created", data=b"{}")
    assert r.status == 201 and r.headers["Location"] == "/call/llm/target/42"
    assert r.headers["Content-Location"].startswith("/redirect/")
    assert r.headers["X-Treg-Upstream-Content-Location"].endswith("/landing")


async def test_httpx_follows_a_chain_that_stays_inside_treg(world):
    gateway, _, third = world

    def follow() -> httpx.Response:
        with httpx.Client(base_url=_base(gateway), headers={"X-Treg-Token": gateway.org["token"]},
                          follow_redirects=True, timeout=10) as c:
            return c.get("/call/llm/chain")

    r = await asyncio.to_thread(follow)
    assert r.status_code == 200 and r.json()["target"] == "/landing?after=hop"
    assert [h.headers["Location"][:10] for h in r.history] == ["/redirect/", "/redirect/"]
    assert [ex.target for ex in third.exchanges] == ["/hop", "/landing?after=hop"]
    _assert_clean(third, gateway)
    ids = [h.headers["X-Treg-Call-Id"] for h in r.history] + [r.headers["X-Treg-Call-Id"]]
    last = await gateway.api("GET", f"/api/v1/calls/{ids[2]}", expect=200)
    assert last["surface"] == "redirect" and last["parent_call_id"] == ids[1]


async def test_openai_sdk_follows_a_307_through_treg(world):
    gateway, _, third = world
    client = openai.OpenAI(api_key="unused-by-treg", base_url=f"{_base(gateway)}/call/llm/v1",
                           default_headers={"X-Treg-Token": gateway.org["token"]}, max_retries=0, timeout=10)
    out = await asyncio.to_thread(client.chat.completions.create, model="m",
                                  messages=[{"role": "user", "content": "hello"}])
    assert out.choices[0].message.content == "hi there"
    ex = third.last
    assert ex.method == "POST" and json.loads(ex.body)["messages"][0]["content"] == "hello"
    _assert_clean(third, gateway)


async def test_anthropic_sdk_follows_a_307_through_treg(world):
    gateway, _, third = world
    client = anthropic.Anthropic(api_key="unused-by-treg", base_url=f"{_base(gateway)}/call/llm",
                                 default_headers={"X-Treg-Token": gateway.org["token"]}, max_retries=0, timeout=10)
    out = await asyncio.to_thread(client.messages.create, model="m", max_tokens=10,
                                  messages=[{"role": "user", "content": "hello"}])
    assert out.content[0].text == "hello from far away"
    assert third.last.method == "POST" and b'"hello"' in third.last.body
    _assert_clean(third, gateway)


async def _location(gateway, path: str) -> str:
    r = await gateway.call("GET", path, allow_redirects=False)
    assert r.status == 302, await r.text()
    return r.headers["Location"]


async def _refused(gateway, url: str, as_: dict[str, str]) -> dict:
    r = await gateway.call("GET", url, as_=as_, allow_redirects=False)
    assert r.status == 404 and r.headers["X-Treg-Error"] == "1" and "X-Treg-Call-Id" in r.headers
    body = await r.json()
    assert body["error"] == "redirect_not_found" and body["blame"] == "caller"
    return body


async def test_another_member_or_org_is_refused(world):
    gateway, _, third = world
    link = await _location(gateway, "/call/llm/away")
    member = await gateway.member("m@acme.test")
    other = await membership.create_org(gateway.services, slug="other", email="o@other.test")
    bodies = [await _refused(gateway, link, member["headers"]),
              await _refused(gateway, link, {"X-Treg-Token": other["token"]})]
    assert bodies[0] == bodies[1]
    assert third.exchanges == []
    # the member the link was issued to still uses it
    r = await gateway.call("GET", link, allow_redirects=False)
    assert r.status == 200
    rows = await gateway.calls(as_=member["headers"])
    assert rows and rows[0]["outcome"] == "refused" and rows[0]["refused_by"] == "redirect"


async def test_expired_tampered_and_forged_links_are_refused(world):
    gateway, _, third = world
    svc = gateway.services
    link = await _location(gateway, "/call/llm/away")
    grant = redirects.open_grant(svc, link[len("/redirect/"):])
    assert grant is not None and abs(grant.expires_at - (time.time() + 300)) < 5  # TREG_REDIRECT_TTL_S
    expired = redirects.seal(svc, redirects.RedirectGrant(grant.org_id, grant.member_id, grant.url,
                                                          grant.parent_call_id, int(time.time()) - 1))
    opaque = link[len("/redirect/"):]
    mid = len(opaque) // 2
    tampered = opaque[:mid] + ("A" if opaque[mid] != "A" else "B") + opaque[mid + 1:]
    stranger = SecretBox(decode_key(new_key_text()))
    forged = redirects.seal(type("S", (), {"box": stranger})(), grant)  # same grant, another treg's key
    bodies = [await _refused(gateway, "/redirect/" + x, gateway.owner)
              for x in (expired, tampered, forged, "", "not-base64!!", opaque[:20])]
    assert all(b == bodies[0] for b in bodies)
    assert third.exchanges == []


@pytest.mark.parametrize("path", ["/call/llm/metadata", "/call/llm/intranet"])
async def test_ssrf_guard_applies_to_the_redirect_hop(world, path):
    gateway, _, third = world
    link = await _location(gateway, path)
    r = await gateway.call("GET", link, allow_redirects=False)
    assert r.status == 502 and (await r.json())["error"] == "ssrf_refused" and r.headers["X-Treg-Error"] == "1"
    assert third.exchanges == []
    detail = await gateway.api("GET", f"/api/v1/calls/{r.headers['X-Treg-Call-Id']}", expect=200)
    assert detail["surface"] == "redirect" and detail["outcome"] == "refused" and detail["parent_call_id"]


async def test_deny_rule_on_the_redirect_host_applies(world):
    gateway, _, third = world
    await gateway.api("POST", "/api/v1/deny-rules", json={"host": "localhost", "reason": "not that one"},
                      expect=201)
    r = await asyncio.to_thread(requests.get, f"{_base(gateway)}/call/llm/away",
                                headers={"X-Treg-Token": gateway.org["token"]}, timeout=10)
    assert r.status_code == 403 and r.json()["error"] == "denied_by_rule"
    assert r.history and r.history[0].headers["Location"].startswith("/redirect/")
    assert third.exchanges == []


async def test_a_key_echoed_into_location_is_masked_and_never_forwarded(world):
    gateway, _, third = world
    r = await asyncio.to_thread(requests.get, f"{_base(gateway)}/call/llm/echo",
                                headers={"X-Treg-Token": gateway.org["token"]}, timeout=10)
    hop = r.history[0]
    assert SECRET not in hop.headers["X-Treg-Upstream-Location"]
    assert hop.headers["X-Treg-Upstream-Location"].endswith("k=[REDACTED]")
    assert r.status_code == 200
    _assert_clean(third, gateway)


async def test_locations_treg_cannot_read_strictly_are_dropped(world):
    """A value treg cannot read as an http(s) URL every client reads alike is never relayed as it was
    (tests/test_malformed_locations.py follows such values with real clients): the answer goes out
    without it, the upstream's value kept in X-Treg-Upstream-Location."""
    gateway, vendor, _ = world
    r = await gateway.call("GET", "/call/llm/odd", allow_redirects=False)
    assert r.status == 302  # never a 500
    assert "Location" not in r.headers
    # an empty Content-Location is the request's own URL: inside the tool, so a /call URL
    assert r.headers["Content-Location"] == "/call/llm/odd"
    assert r.headers.getall("X-Treg-Upstream-Location") == ["http://[::1/broken", "myapp://done"]


async def test_a_billed_catalog_answer_redirects_without_the_platform_key(aiohttp_client, make_app):
    from treg.testing import example_provider, vendor_gateway

    def answer(ex: Exchange) -> bytes:
        if ex.target.startswith("/v1/items/7"):
            return _redirect(302, "/v1/items/8")  # the provider's own host: still no key may follow
        return _json(200, {"at": ex.target})

    async with raw_upstream(answer) as up, \
            vendor_gateway(aiohttp_client, make_app, [example_provider(up.url + "/v1")], slug="acme-org",
                           platform={"TREG_PLATFORM_KEY_ACME": "platform-key-123"}, email="o@acme.test",
                           credits=10_000) as gw:
        r = await gw.call("GET", "/catalog/call/acme.items.get?item_id=7", allow_redirects=False)
        assert r.status == 302 and r.headers["X-Treg-Cost-Micro"] == "0"  # not a 2xx: released
        assert r.headers["Location"].startswith("/redirect/") and r.headers["X-Treg-Upstream-Location"] == "/v1/items/8"
        assert up.last.header("authorization") == "Bearer platform-key-123"
        r = await gw.call("GET", r.headers["Location"], allow_redirects=False)
        assert r.status == 200 and (await r.json()) == {"at": "/v1/items/8"}
        assert up.last.header("authorization") is None and "X-Treg-Cost-Micro" not in r.headers
        assert not [k for k, _ in up.last.headers if k.lower().startswith("x-treg")]


async def test_a_project_scoped_deny_rule_follows_the_redirect_hop(world):
    """A rule scoped to the tool's project must catch the hop its answer redirected to: the hop has no
    tool of its own, and before the grant carried the project it was matched as org-wide and let through."""
    gateway, vendor, third = world
    p = await gateway.api("POST", "/api/v1/projects", json={"name": "p"}, expect=201)
    sid = await gateway.secret(SECRET)
    await gateway.tool("scoped", vendor.url, [{"location": "header", "name": "Authorization",
                                                "format": "Bearer {secret}", "secret_id": sid}],
                       project_id=p["id"])
    await gateway.api("POST", "/api/v1/deny-rules", json={"host": "localhost", "project_id": p["id"]}, expect=201)
    r = await asyncio.to_thread(requests.get, f"{_base(gateway)}/call/scoped/away",
                                headers={"X-Treg-Token": gateway.org["token"]}, timeout=10)
    assert r.status_code == 403 and r.json()["error"] == "denied_by_rule"
    assert third.exchanges == []
    # the org-wide tool's hop is not caught by that project's rule
    r = await asyncio.to_thread(requests.get, f"{_base(gateway)}/call/llm/away",
                                headers={"X-Treg-Token": gateway.org["token"]}, timeout=10)
    assert r.status_code == 200 and third.exchanges


async def test_rewritten_locations_keep_the_public_urls_path_prefix(make_app, aiohttp_client):
    """Behind a reverse proxy that mounts treg under /treg (TREG_PUBLIC_URL https://gw.example.com/treg),
    a rewritten Location carries the prefix (operability.md): requests follows it back through the proxy.
    Without the prefix it resolved to the proxy's /call/…, outside treg's mount."""
    from aiohttp import ClientSession, web

    from treg.keys import SERVICES
    from treg.testing import Gateway

    def vendor_answer(ex: Exchange) -> bytes:
        if ex.target.startswith("/inside"):
            return _redirect(302, "/target?page=2")
        if ex.target.startswith("/away"):
            return _redirect(307, f"http://localhost:{vendor.port}/elsewhere")  # another host
        return _json(200, {"target": ex.target, "auth": ex.header("authorization")})

    async with raw_upstream(vendor_answer) as vendor:
        client = await aiohttp_client(make_app(ssrf_allow=("127.0.0.0/8",), public_url="https://gw.example.com/treg/"))
        org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
        gw = Gateway(client, org)
        sid = await gw.secret(SECRET)
        await gw.tool("llm", vendor.url + "/", [{"location": "header", "name": "Authorization",
                                                  "format": "Bearer {secret}", "secret_id": sid}])
        r = await gw.call("GET", "/call/llm/inside", allow_redirects=False)
        assert r.headers["Location"] == "/treg/call/llm/target?page=2"
        r = await gw.call("GET", f"/call/{vendor.url}/inside", allow_redirects=False)
        assert r.headers["Location"] == f"/treg/call/{vendor.url}/target?page=2"
        r = await gw.call("POST", "/call/llm/away", data=b"{}", allow_redirects=False)
        assert r.status == 307 and r.headers["Location"].startswith("/treg/redirect/")

        # the proxy: /treg/<rest> → treg's /<rest>, anything else 404 (as nginx's location /treg/ would)
        async with ClientSession(auto_decompress=False) as session:
            async def forward(request: web.Request) -> web.Response:
                if not request.raw_path.startswith("/treg/"):
                    return web.Response(status=404, text="not treg")
                headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
                async with session.request(request.method, f"http://127.0.0.1:{client.port}{request.raw_path[5:]}",
                                           headers=headers, data=await request.read(), allow_redirects=False) as up:
                    keep = {k: v for k, v in up.headers.items()
                            if k.lower() not in ("content-length", "transfer-encoding", "connection")}
                    return web.Response(status=up.status, headers=keep, body=await up.read())

            proxy_app = web.Application()
            proxy_app.router.add_route("*", "/{tail:.*}", forward)
            proxy = await aiohttp_client(proxy_app)
            base = f"http://127.0.0.1:{proxy.port}/treg"
            headers = {"X-Treg-Token": org["token"]}
            r = await asyncio.to_thread(requests.get, f"{base}/call/llm/inside", headers=headers, timeout=10)
            assert r.status_code == 200 and r.json() == {"target": "/target?page=2", "auth": f"Bearer {SECRET}"}
            r = await asyncio.to_thread(requests.post, f"{base}/call/llm/away", data=b"{}", headers=headers,
                                        timeout=10)
            assert r.status_code == 200 and r.json() == {"target": "/elsewhere", "auth": None}
            await proxy.close()
        await client.close()


async def test_link_header_urls_stay_inside_treg(world):
    """A ``Link`` header's URLs (pagination that clients follow by themselves, with their headers) are
    rewritten as a ``Location`` is: into the tool, a treg call with the credential; elsewhere, a
    ``/redirect/`` link, relayed with no credential and no treg token; each link's parameters as they came.
    requests' ``r.links`` parses the rewritten value, and following it stays clean."""
    gateway, vendor, third = world
    base = _base(gateway)
    with requests.Session() as s:
        s.headers["X-Treg-Token"] = gateway.org["token"]
        r = await asyncio.to_thread(s.get, f"{base}/call/llm/paged?p=1")
        assert r.status_code == 200
        assert r.links["next"]["url"] == "/call/llm/paged?p=2"
        assert r.links["last"]["url"].startswith("/redirect/") and r.links["last"]["title"] == "the, last one"
        assert r.headers["X-Treg-Upstream-Link"].startswith("</paged?p=2>")
        nxt = await asyncio.to_thread(s.get, base + r.links["next"]["url"])
        assert nxt.status_code == 200 and nxt.json()["page"] == "/paged?p=2"
        assert vendor.exchanges[-1].header("authorization") == f"Bearer {SECRET}"  # a call of the tool
        last = await asyncio.to_thread(s.get, base + r.links["last"]["url"])
        assert last.status_code == 200 and last.json() == {"at": "third", "target": "/elsewhere?x=1,2"}
    _assert_clean(third, gateway)
    # a value that is not the header's grammar is not relayed at all (the upstream's value beside it)
    r = await gateway.raw("GET", "/call/llm/badlink")
    assert r.status == 200 and r.header("Link") is None
    assert r.header("X-Treg-Upstream-Link") == "https://x.example/2; rel=next"


async def test_a_link_hidden_in_a_quoted_parameter_is_left_out(world):
    """RFC 8288 reads ``<a>; title="x, <https://far/stolen>; rel=next"`` as one link with a title;
    requests' (and httpx's) ``links`` split it at ``, <`` and find a ``next`` link to the third party, which
    treg never rewrote. A link whose parameters hold ``<`` or ``>`` is left out, so no client finds one."""
    gateway, vendor, third = world
    with requests.Session() as s:
        s.headers["X-Treg-Token"] = gateway.org["token"]
        r = await asyncio.to_thread(s.get, f"{_base(gateway)}/call/llm/smuggle")
    assert r.status_code == 200 and "Link" not in r.headers and r.links == {}
    assert "stolen" in r.headers["X-Treg-Upstream-Link"]  # the upstream's value, which no client follows
