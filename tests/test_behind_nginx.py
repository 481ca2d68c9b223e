"""treg behind a real nginx (Debian's), terminating TLS under the path prefix ``/treg/`` with the
configuration docs/operations.md gives (treg.testing.nginx): ``TREG_PUBLIC_URL=https://127.0.0.1:<nginx
port>/treg``, ``TREG_TRUSTED_PROXIES=127.0.0.1``. The dashboard in chromium through it (login, cookie
flags, every link under the prefix, Try it), the request target relayed byte for byte, redirects
rewritten with the prefix kept, and ``X-Forwarded-*`` believed only from nginx."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import pytest
from aiohttp import web

from treg import logs, membership
from treg.app import make_runner
from treg.keys import SERVICES
from treg.testing import browser as chromium_browser, http_response, nginx, raw_exchange, raw_request_bytes

needs_chromium = pytest.mark.skipif(chromium_browser.skip_reason() is not None,
                                    reason=str(chromium_browser.skip_reason()))

FORM = "application/x-www-form-urlencoded"


class _Access(logging.Handler):
    """The access lines' fields (treg's own runner hands them to logging)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.fields: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "aiohttp.access":
            self.fields.append(getattr(record, logs.EXTRA_FIELDS))


@dataclass
class Behind:
    app: web.Application
    treg_port: int
    proxy: nginx.Nginx
    org: dict[str, Any]
    access: _Access

    async def via_proxy(self, method: str, target: str, headers: list[tuple[str, str]] | None = None,
                        body: bytes | None = None, *, source: str | None = None):
        """One request through nginx (TLS, the certificate checked), exact bytes."""
        headers = list(headers or [])
        if not any(k.lower() == "host" for k, _ in headers):
            headers.insert(0, ("Host", f"127.0.0.1:{self.proxy.port}"))
        data = raw_request_bytes(method, target, headers, body)
        return await raw_exchange(self.proxy.port, data, tls=self.proxy.client_context(), source=source)

    async def direct(self, method: str, target: str, headers: list[tuple[str, str]] | None = None,
                     body: bytes | None = None, *, source: str | None = None):
        """One request straight to treg, not through nginx."""
        return await raw_exchange(self.treg_port, raw_request_bytes(method, target, headers, body), source=source)

    async def api(self, method: str, path: str, body: Any = None, expect: int = 200) -> Any:
        headers = [("X-Treg-Token", self.org["token"]), ("Content-Type", "application/json")]
        reply = await self.direct(method, path, headers, json.dumps(body).encode() if body is not None else None)
        assert reply.status == expect, (reply.status, reply.body)
        return reply.json() if reply.body else None

    async def access_of(self, path: str, n: int) -> list[dict[str, Any]]:
        for _ in range(200):  # an access line is handed over when the answer is done: bounded wait
            found = [f for f in self.access.fields if f["path"] == path]
            if len(found) >= n:
                return found
            await asyncio.sleep(0.02)
        raise AssertionError(f"no access line for {path}: {self.access.fields}")


#: a site's own protected files beside treg, served only on an internal redirect (``X-Accel-Redirect``
#: from a backend: the usual way an app hands nginx a download it authorized)
PROTECTED = """\
    location /protected/ {{
        internal;
        alias {folder}/;
    }}
"""


#: beside treg, with a shared cache (``behind`` with ``{"shared_cache": True}``): the upstream proxied
#: straight, no treg between, through the same cache (the control: it does keep a ``public`` answer)
STRAIGHT = """\
    location /straight/ {{
        proxy_pass http://{upstream}/;
        proxy_cache shared;
        add_header X-Cache $upstream_cache_status always;
    }}
"""


@pytest.fixture
async def behind(make_app, tmp_path, request, up):
    if (why := nginx.available()) is not None:
        pytest.skip(why)
    shared_cache = getattr(request, "param", {}).get("shared_cache", False)
    port = nginx.free_port()
    public = f"https://127.0.0.1:{port}/treg"
    app = make_app(ssrf_allow=("127.0.0.0/8",), public_url=public, trusted_proxies=("127.0.0.1",))
    runner = make_runner(app)  # as `treg serve` runs it
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    treg_port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    access = _Access()
    access_logger = logging.getLogger("aiohttp.access")
    level = access_logger.level
    access_logger.setLevel(logging.INFO)
    access_logger.addHandler(access)
    # readable by nginx's workers (an unprivileged user), which pytest's own temporary folders are not
    files = Path(tempfile.mkdtemp(prefix="treg-nginx-protected-"))
    files.chmod(0o755)
    (files / "secret.txt").write_text("the site's protected file\n")
    (files / "secret.txt").chmod(0o644)
    extra = PROTECTED.format(folder=files)
    if shared_cache:
        extra += STRAIGHT.format(upstream=urlsplit(up.url).netloc)
    proxy = nginx.Nginx(tmp_path / "nginx", f"127.0.0.1:{treg_port}", prefix="/treg", port=port,
                        extra=extra, shared_cache=shared_cache)
    try:
        await asyncio.to_thread(proxy.start)
        org = await membership.create_org(app[SERVICES], slug="acme", email="owner@acme.test")
        yield Behind(app, treg_port, proxy, org, access)
    finally:
        await asyncio.to_thread(proxy.stop)
        shutil.rmtree(files, ignore_errors=True)
        access_logger.removeHandler(access)
        access_logger.setLevel(level)
        await runner.cleanup()


def _cookie_flags(line: str) -> tuple[str, set[str]]:
    head, *flags = [part.strip() for part in line.split(";")]
    return head, {f for f in flags}


async def _login_raw(b: Behind, origin: str | None = None, form_token: str | None = None):
    """GET the login form through nginx, then post it (with ``origin`` and ``form_token`` when given)."""
    page = await b.via_proxy("GET", "/treg/ui/login")
    assert page.status == 200, page.body[:300]
    pre = next(v for v in page.header_all("Set-Cookie") if v.startswith("treg_login="))
    nonce = pre.split(";", 1)[0].split("=", 1)[1]
    token = page.body.decode().split('name="form_token" value="', 1)[1].split('"', 1)[0]
    headers = [("Content-Type", FORM), ("Cookie", f"treg_login={nonce}")]
    if origin is not None:
        headers.append(("Origin", origin))
    body = urlencode({"token": b.org["token"], "form_token": token if form_token is None else form_token})
    return page, pre, await b.via_proxy("POST", "/treg/ui/login", headers, body.encode())


async def test_the_login_cookie_is_secure_httponly_strict_and_under_the_prefix(behind):
    page, pre, reply = await _login_raw(behind, behind.proxy.origin)
    assert 'action="/treg/ui/login"' in page.body.decode() and 'href="/treg/ui/static/treg.css"' in page.body.decode()
    _, flags = _cookie_flags(pre)
    assert {"Secure", "HttpOnly", "SameSite=Strict", "Path=/treg/ui/login"} <= flags
    assert reply.status == 303, reply.body[:300]
    assert reply.header("Location") == "/treg/ui/"
    session = next(v for v in reply.header_all("Set-Cookie") if v.startswith("treg_session="))
    _, flags = _cookie_flags(session)
    # the hop from nginx is plain http: Secure comes from TREG_PUBLIC_URL; Path is treg's own prefix
    assert {"Secure", "HttpOnly", "SameSite=Strict", "Path=/treg/"} <= flags, session


async def test_login_csrf_and_mcp_origin_through_the_proxy(behind):
    port = behind.proxy.port
    for origin in (None, "null", f"https://evil.test:{port}", f"http://127.0.0.1:{port}",
                   f"http://127.0.0.1:{behind.treg_port}"):
        _, _, reply = await _login_raw(behind, origin)
        assert reply.status == 403 and reply.header("Set-Cookie") is None, origin
    # the Host header is not treg's origin, even when the Origin agrees with it
    page = await behind.via_proxy("GET", "/treg/ui/login")
    reply = await behind.via_proxy("POST", "/treg/ui/login", [
        ("Host", f"evil.test:{port}"), ("Origin", f"https://evil.test:{port}"), ("Content-Type", FORM)],
        urlencode({"token": behind.org["token"]}).encode())
    assert page.status == 200 and reply.status == 403 and reply.header("Set-Cookie") is None
    # treg's own origin without the form's token
    _, _, reply = await _login_raw(behind, behind.proxy.origin, form_token="")
    assert reply.status == 403 and reply.header("Set-Cookie") is None
    # MCP's Origin check reads the same own origin
    mcp = [("Content-Type", "application/json"), ("Authorization", f"Bearer {behind.org['token']}")]
    ping = b'{"jsonrpc": "2.0", "id": 1, "method": "ping"}'
    assert (await behind.via_proxy("POST", "/treg/mcp", [*mcp, ("Origin", behind.proxy.origin)], ping)).status == 200
    for origin in (f"http://127.0.0.1:{behind.treg_port}", f"https://evil.test:{port}"):
        assert (await behind.via_proxy("POST", "/treg/mcp", [*mcp, ("Origin", origin)], ping)).status == 403


async def test_the_request_target_is_relayed_byte_for_byte_through_the_prefix(behind, up):
    await behind.api("POST", "/api/v1/tools", {"name": "up", "base_url": up.url + "/v1", "bindings": []}, 201)
    headers = [("X-Treg-Token", behind.org["token"])]
    reply = await behind.via_proxy("GET", "/treg/call/up/a%2Fb/c%20d?x=%41&y=1%2F2&z", headers)
    assert reply.status == 200, reply.body
    assert up.last.target == "/v1/a%2Fb/c%20d?x=%41&y=1%2F2&z"
    # a chunked upload streams through (proxy_request_buffering off) and arrives whole
    data = raw_request_bytes("POST", "/treg/call/up/upload", [("Host", f"127.0.0.1:{behind.proxy.port}"), *headers,
                                                               ("Transfer-Encoding", "chunked")],
                             chunks=[b"hello ", b"world"])
    reply = await raw_exchange(behind.proxy.port, data, tls=behind.proxy.client_context())
    assert reply.status == 200 and up.last.body == b"hello world"


async def test_x_forwarded_is_believed_only_from_the_proxy_and_never_relayed(behind, up):
    await behind.api("POST", "/api/v1/tools", {"name": "up", "base_url": up.url + "/v1", "bindings": []}, 201)
    forged = [("X-Forwarded-For", "6.6.6.6"), ("X-Forwarded-Proto", "http"), ("X-Treg-Token", behind.org["token"])]
    # through nginx from 127.0.0.3: nginx appends the address it saw; what the client wrote left of it is not read
    reply = await behind.via_proxy("GET", "/treg/call/up/via-proxy", forged, source="127.0.0.3")
    assert reply.status == 200
    raw = up.last.raw.lower()
    assert b"x-forwarded" not in raw and b"6.6.6.6" not in raw and b"127.0.0.3" not in raw  # never upstream
    # straight to treg from 127.0.0.2 (not a trusted proxy): its X-Forwarded-* are not believed
    reply = await behind.direct("GET", "/call/up/direct", forged, source="127.0.0.2")
    assert reply.status == 200
    assert b"x-forwarded" not in up.last.raw.lower()
    [via] = await behind.access_of("/call/up/via-proxy", 1)
    [direct] = await behind.access_of("/call/up/direct", 1)
    assert via["client"] == "127.0.0.3"
    assert direct["client"] == "127.0.0.2"


async def test_a_relayed_redirect_keeps_the_prefix(behind, up):
    """The rewritten Location carries TREG_PUBLIC_URL's prefix (branch sec-location makes it so; on a
    branch without that change this test fails only on the prefix)."""
    await behind.api("POST", "/api/v1/tools", {"name": "up", "base_url": up.url + "/v1", "bindings": []}, 201)
    up.responder = lambda ex: http_response(302, b"", reason="Found", headers=[("Location", up.url + "/v1/next?p=2")])
    reply = await behind.via_proxy("GET", "/treg/call/up/first", [("X-Treg-Token", behind.org["token"])])
    assert reply.status == 302
    assert reply.header("Location") == "/treg/call/up/next?p=2"


async def test_an_upstream_cannot_steer_the_proxy_in_front_of_treg(behind, up):
    """An upstream's ``X-Accel-Redirect`` reached nginx as treg's own answer, and nginx served whatever
    location it named: the site's internal files, or another treg call as the caller. Its other
    ``X-Accel-*`` headers (rate, buffering, caching, charset) and the ``X-Sendfile`` family (Apache's
    mod_xsendfile, lighttpd) steer the proxy the same way. None reaches it: the caller gets the upstream's
    own answer."""
    await behind.api("POST", "/api/v1/tools", {"name": "up", "base_url": up.url + "/v1", "bindings": []}, 201)
    steering = [("X-Accel-Redirect", "/protected/secret.txt"), ("X-Accel-Limit-Rate", "1"),
                ("x-accel-buffering", "yes"), ("X-Accel-Expires", "86400"), ("X-Accel-Charset", "utf-8"),
                ("X-Sendfile", "/etc/passwd"), ("X-LIGHTTPD-send-file", "/etc/passwd"), ("X-Sendfile2", "/etc/passwd 0-"),
                ("X-Other", "kept")]
    up.responder = lambda ex: http_response(200, b"the upstream's own answer", headers=steering)
    reply = await behind.via_proxy("GET", "/treg/call/up/download", [("X-Treg-Token", behind.org["token"])])
    assert reply.status == 200
    assert reply.body == b"the upstream's own answer"
    assert b"protected file" not in reply.body
    assert reply.header("X-Other") == "kept"
    direct = await behind.direct("GET", "/call/up/download", [("X-Treg-Token", behind.org["token"])])
    for name, _ in steering[:-1]:
        assert direct.header(name) is None, name


@pytest.mark.parametrize("behind", [{"shared_cache": True}], indirect=True)
async def test_a_shared_cache_in_front_keeps_no_answer_for_another_caller(behind, up):
    """A cache in front of treg keys on the URL and does not know X-Treg-Token is a credential. An
    upstream's ``Cache-Control: public, max-age=600`` made nginx's proxy_cache keep one org's answer and
    hand it to the next caller of the URL, with no token at all; with ``proxy_cache_valid`` it kept treg's
    own JSON (an org's tools) the same way. Relayed answers now say ``private`` and treg's own ``no-store``,
    which nginx honours: every caller reaches treg, and treg answers each as itself."""
    n = iter(range(1, 100))
    up.responder = lambda ex: http_response(200, f"acme's answer #{next(n)}".encode(), headers=[
        ("Cache-Control", "public, max-age=600"), ("CDN-Cache-Control", "max-age=600")])
    # the control: the same answer straight from the upstream through the same cache is kept and served
    first = await behind.via_proxy("GET", "/straight/v1/report")
    again = await behind.via_proxy("GET", "/straight/v1/report")
    assert (first.header("X-Cache"), again.header("X-Cache")) == ("MISS", "HIT"), behind.proxy.log()
    assert again.body == first.body == b"acme's answer #1"

    await behind.api("POST", "/api/v1/tools", {"name": "up", "base_url": up.url + "/v1", "bindings": []}, 201)
    token = [("X-Treg-Token", behind.org["token"])]
    mine = await behind.via_proxy("GET", "/treg/call/up/report", token)
    assert mine.status == 200 and mine.body == b"acme's answer #2"
    assert mine.header("Cache-Control") == "private, max-age=600" and mine.header("CDN-Cache-Control") is None
    stranger = await behind.via_proxy("GET", "/treg/call/up/report")
    assert stranger.status == 401 and b"acme" not in stranger.body
    assert stranger.header("X-Cache") != "HIT"
    again = await behind.via_proxy("GET", "/treg/call/up/report", token)
    assert again.body == b"acme's answer #3" and again.header("X-Cache") != "HIT"

    tools = await behind.via_proxy("GET", "/treg/api/v1/tools", token)
    assert tools.status == 200 and b'"up"' in tools.body and tools.header("Cache-Control") == "no-store"
    stranger = await behind.via_proxy("GET", "/treg/api/v1/tools")
    assert stranger.status == 401 and b'"up"' not in stranger.body and stranger.header("X-Cache") != "HIT"


@needs_chromium
async def test_the_dashboard_through_nginx_in_chromium(behind, up):
    secret = await behind.api("POST", "/api/v1/secrets", {"name": "up-key", "value": "s3cr3t-value"}, 201)
    await behind.api("POST", "/api/v1/tools", {"name": "up", "base_url": up.url + "/v1", "bindings": [
        {"location": "header", "name": "Authorization", "format": "Bearer {secret}", "secret_id": secret["id"]}]}, 201)
    from playwright.async_api import expect

    base = behind.proxy.url
    async with chromium_browser.chromium(args=("--ignore-certificate-errors",)) as browser:
        ctx = await browser.new_context(ignore_https_errors=True)
        page = await ctx.new_page()
        seen: list[tuple[str, int]] = []
        page.on("response", lambda r: seen.append((r.url, r.status)))
        await page.goto(base + "/ui/")  # not logged in: to the login form, under the prefix
        await page.wait_for_url(base + "/ui/login?next=%2Fui%2F")
        await page.get_by_label("Token").fill(behind.org["token"])
        await page.get_by_role("button", name="Log in").click()
        await page.wait_for_url(base + "/ui/")
        await expect(page.locator("header")).to_contain_text("owner@acme.test")
        cookies = {c["name"]: c for c in await ctx.cookies(behind.proxy.origin + "/treg/ui/")}
        session = cookies["treg_session"]
        assert session["secure"] and session["httpOnly"] and session["sameSite"] == "Strict"
        assert session["path"] == "/treg/"
        assert "treg_login" not in cookies  # deleted at login
        # every page of the navigation, through the prefix
        for name in ("Tools", "Secrets", "Members and tokens", "Deny rules", "Activity", "Catalog", "Capacity",
                     "Try it", "Overview"):
            await page.get_by_role("navigation", name="Main").get_by_role("link", name=name, exact=True).click()
            await expect(page.get_by_role("heading", level=1)).to_be_visible()
            assert page.url.startswith(base + "/ui/"), page.url

        # Try it through the prefix: the call, then a redirect shown with treg's rewritten Location
        await page.get_by_role("navigation", name="Main").get_by_role("link", name="Try it", exact=True).click()
        await page.get_by_label("Tool").select_option("up")
        await page.get_by_label("Path and query").fill("/items?limit=1")
        await page.get_by_role("button", name="Send").click()
        await expect(page.locator("#try-status")).to_have_text("Status 200 OK")
        assert up.last.target == "/v1/items?limit=1" and up.last.header("Authorization") == "Bearer s3cr3t-value"
        await page.get_by_role("link", name="Open call").click()
        await expect(page.get_by_role("heading", level=1)).to_contain_text("Call")
        assert page.url.startswith(base + "/ui/activity/call_")

        # a form's post-redirect-get stays under the prefix too
        await page.get_by_role("navigation", name="Main").get_by_role("link", name="Deny rules", exact=True).click()
        await page.get_by_label("Host").fill("api.example.com")
        await page.get_by_role("button", name="Add deny rule").click()
        await expect(page.get_by_role("status")).to_contain_text("Deny rule added")
        assert page.url.startswith(base + "/ui/deny-rules")

        up.responder = lambda ex: http_response(302, b"", reason="Found", headers=[("Location", up.url + "/v1/next")])
        await page.get_by_role("navigation", name="Main").get_by_role("link", name="Try it", exact=True).click()
        await page.get_by_label("Tool").select_option("up")
        await page.get_by_label("Path and query").fill("/moved")
        await page.get_by_role("button", name="Send").click()
        await expect(page.locator("#try-status")).to_have_text("Status 302 Found")
        location = await page.locator("#try-location code").first.inner_text()

        await page.get_by_role("button", name="Log out").click()
        await page.wait_for_url(base + "/ui/login?done=*")
        assert "treg_session" not in {c["name"] for c in await ctx.cookies(behind.proxy.origin + "/treg/ui/")}
        await ctx.close()
    assert "s3cr3t-value" not in json.dumps(seen)
    assert [u for u, s in seen if s >= 400] == []
    assert {urlsplit(u).netloc for u, _ in seen} == {f"127.0.0.1:{behind.proxy.port}"}
    assert all(urlsplit(u).path.startswith("/treg/") for u, _ in seen), seen
    # last: it needs the sec-location branch's prefix on rewritten Locations
    assert location == "/treg/call/up/next"


def test_docs_give_the_configuration_this_test_runs():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    assert nginx.LOCATION.format(prefix="/treg", upstream="127.0.0.1:8080") in doc
