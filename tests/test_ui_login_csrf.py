"""Login CSRF (surfaces.md, Login): a page on another origin must not log a victim's browser into the
attacker's org. Reproduced in Debian's chromium (an attacker page on another port of 127.0.0.1 with a
sandboxed iframe that posts the login form: ``Origin: null``), then every variant over raw HTTP."""

from __future__ import annotations

import asyncio
import re
import time
from types import SimpleNamespace
from urllib.parse import urlencode

import pytest
from aiohttp import web


from treg import membership, ui_sessions
from treg.infra import crypto
from treg.keys import SERVICES
from treg.settings import SecretStr
from treg.testing import Served, browser as chromium_browser, raw_exchange, raw_request_bytes, treg_env

FORM_TOKEN = re.compile(r'name="form_token" value="([^"]*)"')


class Attacker:
    """The attacker's site: another origin (another port of 127.0.0.1; the same *site* for cookies, as a
    sibling subdomain would be), serving a page whose sandboxed iframe auto-submits treg's login form."""

    def __init__(self, treg_base: str, token: str, form_token: str, login_cookie: str, sandbox: str,
                 target: str | None) -> None:
        self.treg_base, self.token = treg_base, token
        self.form_token, self.login_cookie = form_token, login_cookie
        self.sandbox, self.target = sandbox, target
        self.runner: web.AppRunner | None = None
        self.base = ""

    def frame(self) -> str:
        target = f' target="{self.target}"' if self.target else ""
        return (f'<form method="post" action="{self.treg_base}/ui/login"{target}>'
                f'<input name="token" value="{self.token}"><input name="form_token" value="{self.form_token}">'
                '<input name="next" value="/ui/secrets"></form>'
                "<script>document.forms[0].submit()</script>")

    def page(self) -> str:
        # the strongest attacker this setup allows: it also tosses its own pre-login cookie into the
        # victim's jar (cookies ignore ports, so 127.0.0.1:<any> may set one treg will read), so the form
        # token and the cookie agree and only the Origin check stands in the way
        toss = (f"document.cookie = 'treg_login={self.login_cookie}; path=/ui/login';"
                if self.login_cookie else "")
        return (f"<!doctype html><title>cute cats</title><script>{toss}</script>"
                f'<iframe sandbox="{self.sandbox}" src="/frame"></iframe>')

    async def __aenter__(self) -> "Attacker":
        app = web.Application()
        app.router.add_get("/", lambda r: web.Response(text=self.page(), content_type="text/html"))
        app.router.add_get("/frame", lambda r: web.Response(text=self.frame(), content_type="text/html"))
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.base = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


async def _attacker_form(gateway) -> tuple[str, str]:
    """What the attacker can fetch from treg for itself: a login form's token and its pre-login cookie."""
    resp = await gateway.client.get("/ui/login")
    match = FORM_TOKEN.search(await resp.text())
    cookie = resp.cookies.get("treg_login")
    return (match.group(1) if match else ""), (cookie.value if cookie else "")


#: how a sandboxed frame's form reaches treg: in the frame itself (chromium then drops the SameSite=Strict
#: cookie of that answer, but treg accepted the login all the same), navigating the attacker's whole tab
#: (the victim is left on treg's dashboard, logged into the attacker's org), or in a popup
FRAMINGS = {
    "in-frame": ("allow-forms allow-scripts", None),
    "top": ("allow-forms allow-scripts allow-top-navigation", "_top"),
    "popup": ("allow-forms allow-scripts allow-popups", "_blank"),
}


@pytest.mark.skipif(chromium_browser.skip_reason() is not None, reason=str(chromium_browser.skip_reason()))
@pytest.mark.parametrize("framing", sorted(FRAMINGS))
async def test_a_sandboxed_iframe_on_another_origin_cannot_log_the_victim_in(gateway, framing):
    evil = await membership.create_org(gateway.services, slug="evil", email="attacker@evil.test")
    treg_base = f"http://127.0.0.1:{gateway.client.port}"
    form_token, cookie = await _attacker_form(gateway)
    sandbox, target = FRAMINGS[framing]
    async with Attacker(treg_base, evil["token"], form_token, cookie, sandbox, target) as attacker, \
            chromium_browser.chromium() as browser:
        ctx = await browser.new_context()
        posted: asyncio.Future = asyncio.get_running_loop().create_future()

        def seen(resp) -> None:
            if resp.url == treg_base + "/ui/login" and resp.request.method == "POST" and not posted.done():
                posted.set_result(resp)

        ctx.on("response", seen)
        page = await ctx.new_page()
        await page.goto(attacker.base + "/")
        login = await asyncio.wait_for(posted, 30)
        assert await login.request.header_value("origin") == "null"  # a sandboxed frame's: what treg let in
        await asyncio.sleep(0.5)  # let the browser finish with that answer (its redirect, its cookie)
        # the victim now opens treg in a tab of their own
        victim = await ctx.new_page()
        await victim.goto(treg_base + "/ui/")
        body = await victim.content()
        jar = {c["name"] for c in await ctx.cookies(treg_base)}
        await ctx.close()
    assert "attacker@evil.test" not in body, "the victim's browser was logged into the attacker's org"
    assert login.status == 403
    assert "treg_session" not in jar
    assert victim.url.startswith(treg_base + "/ui/login")


# -- every variant over raw HTTP ----------------------------------------------------------------------

FORM = "application/x-www-form-urlencoded"


def _set_cookies(reply) -> dict[str, str]:
    """name → the whole Set-Cookie line, of one answer."""
    return {v.split("=", 1)[0]: v for v in reply.header_all("Set-Cookie")}


async def _login_form(gateway, headers: list[tuple[str, str]] | None = None) -> tuple[str, str]:
    """(form token, pre-login cookie value) of ``GET /ui/login``, read from the wire."""
    return _form_of(await gateway.raw("GET", "/ui/login", headers, auth=False))


def _form_of(reply) -> tuple[str, str]:
    assert reply.status == 200, reply.body
    token = FORM_TOKEN.search(reply.body.decode())
    cookie = _set_cookies(reply).get("treg_login", "=")
    # "" when the page has none (a login form without a token: refused below for that too)
    return (token.group(1) if token else ""), cookie.split(";", 1)[0].split("=", 1)[1]


async def _post(gateway, headers: list[tuple[str, str]], form: dict[str, str]):
    return await gateway.raw("POST", "/ui/login", [("Content-Type", FORM), *headers], urlencode(form).encode(),
                             auth=False)


def _refused(reply) -> None:
    assert reply.status == 403, (reply.status, reply.body[:400])
    assert reply.header("Set-Cookie") is None  # no session, and no cookie of any kind
    assert b'for="token">Token</label>' in reply.body and b'role="alert"' in reply.body


async def _sessions(gateway) -> int:
    from sqlalchemy import func, select

    from treg.infra.schema import ui_sessions as table

    async with gateway.services.db.tx() as tx:
        return (await tx.fetch_one(select(func.count().label("n")).select_from(table)))["n"]


async def test_every_login_not_from_treg_s_own_login_form_is_403_and_sets_no_cookie(gateway):
    port = gateway.client.port
    own = f"http://127.0.0.1:{port}"
    token, nonce = await _login_form(gateway)
    jar = [("Cookie", f"treg_login={nonce}")]
    good = {"token": gateway.org["token"], "form_token": token}
    refused = {
        "Origin: null": [("Origin", "null")],
        "no Origin, no Referer": [],
        "another port": [("Origin", "http://127.0.0.1:1")],
        "another host": [("Origin", "http://evil.test")],
        "https of the same host and port": [("Origin", f"https://127.0.0.1:{port}")],
        "own origin as a prefix of another host": [("Origin", f"http://127.0.0.1:{port}.evil.test")],
        "userinfo": [("Origin", f"http://x@127.0.0.1:{port}")],
        "garbage": [("Origin", "http://[::1")],
        # what main let in: the Origin equal to the request's own Host header (DNS rebinding, a forged Host)
        "Host-equal, not treg's origin": [("Host", f"evil.test:{port}"), ("Origin", f"http://evil.test:{port}")],
        "Referer on another origin": [("Referer", "http://evil.test/ui/login")],
        "Referer on another port": [("Referer", f"http://127.0.0.1:{port + 1}/ui/login")],
        "Referer null-ish": [("Referer", "null")],
        "Referer with userinfo": [("Referer", f"http://evil@127.0.0.1:{port}/ui/login")],
        # an Origin decides when there is one: a good Referer beside a foreign Origin does not help
        "foreign Origin, own Referer": [("Origin", "http://evil.test"), ("Referer", own + "/ui/login")],
    }
    for name, headers in refused.items():
        reply = await _post(gateway, headers + jar, good)
        assert reply.status == 403, name
        _refused(reply)
    # treg's own origin, but not the login form's token
    other = ui_sessions.new_login_nonce()
    expired = ui_sessions.login_form_token(gateway.services, nonce, now=time.time() - ui_sessions.LOGIN_FORM_TTL_S - 5)
    future = ui_sessions.login_form_token(gateway.services, nonce, now=time.time() + 3600)
    issued, _, mac = token.partition(".")
    bad_forms = {
        "no form token": ({"token": gateway.org["token"]}, jar),
        "empty form token": ({**good, "form_token": ""}, jar),
        "altered MAC": ({**good, "form_token": f"{issued}.{mac[:-2]}AA"}, jar),
        "altered time": ({**good, "form_token": f"{int(issued) + 1}.{mac}"}, jar),
        "not a number": ({**good, "form_token": f"x{issued}.{mac}"}, jar),
        "no pre-login cookie": (good, []),
        "another pre-login cookie": (good, [("Cookie", f"treg_login={other}")]),
        "a malformed pre-login cookie": (good, [("Cookie", f"treg_login={nonce}!")]),
        "expired": ({**good, "form_token": expired}, jar),
        "from the future": ({**good, "form_token": future}, jar),
    }
    for name, (form, cookie) in bad_forms.items():
        reply = await _post(gateway, [("Origin", own), *cookie], form)
        assert reply.status == 403, name
        _refused(reply)
        assert b"expired or did not come from this browser" in reply.body, name
    assert await _sessions(gateway) == 0

    # treg's own origin, by Origin or (without one) by Referer, with the form's token: logged in
    for headers in ([("Origin", own)], [("Origin", f"http://localhost:{port}")], [("Referer", own + "/ui/login")],
                    [("Referer", f"HTTP://127.0.0.1:{port}/ui/login?next=%2Fui%2F")]):
        reply = await _post(gateway, headers + jar, good)
        assert reply.status == 303, (headers, reply.body[:300])
        cookies = _set_cookies(reply)
        assert cookies["treg_session"].startswith("treg_session=") and "HttpOnly" in cookies["treg_session"]
        assert "Max-Age=0" in cookies["treg_login"] or "expires=Thu, 01 Jan 1970" in cookies["treg_login"]
    assert await _sessions(gateway) == 4


async def test_a_bad_token_re_renders_a_form_still_good_for_this_browser(gateway):
    token, nonce = await _login_form(gateway)
    own = f"http://127.0.0.1:{gateway.client.port}"
    # a bad treg token from the right page: the form again (still good for this browser), no cookie
    reply = await _post(gateway, [("Origin", own), ("Cookie", f"treg_login={nonce}")],
                        {"token": "treg_nope", "form_token": token})
    assert reply.status == 401 and reply.header("Set-Cookie") is None
    again = FORM_TOKEN.search(reply.body.decode()).group(1)
    reply = await _post(gateway, [("Origin", own), ("Cookie", f"treg_login={nonce}")],
                        {"token": gateway.org["token"], "form_token": again})
    assert reply.status == 303


async def test_the_login_form_of_one_process_is_good_at_another_sharing_the_master_key(
        make_app, aiohttp_client, settings, dsn, tmp_path):
    """Several treg processes behind one URL on one database and master key: the form one shows is good at
    another (a real ``treg serve``: nothing of it lives in one process's memory); a treg with another
    master key refuses it."""
    public = "https://gw.test/treg"
    a = await aiohttp_client(make_app(public_url=public))
    org = await membership.create_org(a.app[SERVICES], slug="acme", email="owner@acme.test")
    token, nonce = _form_of(await raw_exchange(a.port, raw_request_bytes("GET", "/ui/login")))
    post = raw_request_bytes("POST", "/ui/login", [("Content-Type", FORM), ("Origin", "https://gw.test"),
                                                   ("Cookie", f"treg_login={nonce}")],
                             urlencode({"token": org["token"], "form_token": token}).encode())
    env = treg_env(tmp_path / "home-b", dsn, TREG_SECRET_KEY=settings.secret_key.reveal(), TREG_PUBLIC_URL=public)
    served = await asyncio.to_thread(Served, env, tmp_path / "b.log")
    try:
        at_b = await raw_exchange(served.port, post)
    finally:
        assert await asyncio.to_thread(served.stop) == 0
    assert at_b.status == 303, at_b.body[:300]
    assert at_b.header("Location") == "/treg/ui/"
    assert "treg_session" in _set_cookies(at_b)
    c = await aiohttp_client(make_app(public_url=public, secret_key=SecretStr(crypto.new_key_text())))
    at_c = await raw_exchange(c.port, post)
    assert at_c.status == 403 and at_c.header("Set-Cookie") is None


def test_a_form_signed_under_the_previous_master_key_stays_good_through_a_rotation():
    old, new = crypto.decode_key(crypto.new_key_text()), crypto.decode_key(crypto.new_key_text())
    before = SimpleNamespace(box=crypto.SecretBox(current=old))
    after = SimpleNamespace(box=crypto.SecretBox(current=new, previous=(old,)))
    elsewhere = SimpleNamespace(box=crypto.SecretBox(current=new))
    nonce = ui_sessions.new_login_nonce()
    token = ui_sessions.login_form_token(before, nonce)
    assert ui_sessions.login_form_ok(before, nonce, token) and ui_sessions.login_form_ok(after, nonce, token)
    assert not ui_sessions.login_form_ok(elsewhere, nonce, token)
    assert not ui_sessions.login_form_ok(before, ui_sessions.new_login_nonce(), token)
    # good for its whole life, and not a second longer
    now = float(int(time.time()))
    token = ui_sessions.login_form_token(before, nonce, now=now)
    assert ui_sessions.login_form_ok(before, nonce, token, now=now + ui_sessions.LOGIN_FORM_TTL_S)
    assert not ui_sessions.login_form_ok(before, nonce, token, now=now + ui_sessions.LOGIN_FORM_TTL_S + 1)


# -- the cookie's flags come from treg's own origin ----------------------------------------------------

async def test_the_cookies_are_secure_and_under_the_prefix_when_treg_s_own_origin_is_https(make_app, aiohttp_client):
    """Behind a proxy terminating TLS the hop to treg is plain http: ``Secure`` comes from TREG_PUBLIC_URL,
    not from the hop (a hop saying http does not take it away); ``Path`` is treg's own prefix."""
    client = await aiohttp_client(make_app(public_url="https://gw.test/treg/"))
    org = await membership.create_org(client.app[SERVICES], slug="acme", email="owner@acme.test")
    token, nonce = _form_of(await raw_exchange(client.port, raw_request_bytes("GET", "/ui/login")))
    form = urlencode({"token": org["token"], "form_token": token}).encode()
    for hop in ([], [("X-Forwarded-Proto", "http")]):
        reply = await raw_exchange(client.port, raw_request_bytes("GET", "/ui/login", hop))
        pre = _set_cookies(reply)["treg_login"]
        assert "; Secure" in pre and "Path=/treg/ui/login" in pre and "HttpOnly" in pre and "SameSite=Strict" in pre
        assert 'action="/treg/ui/login"' in reply.body.decode()
        reply = await raw_exchange(client.port, raw_request_bytes("POST", "/ui/login", [
            ("Content-Type", FORM), ("Origin", "https://gw.test"), ("Cookie", f"treg_login={nonce}"), *hop], form))
        assert reply.status == 303 and reply.header("Location") == "/treg/ui/", reply.body[:300]
        session = _set_cookies(reply)["treg_session"]
        flags = [f.strip() for f in session.split(";")[1:]]
        assert "Secure" in flags and "HttpOnly" in flags and "SameSite=Strict" in flags and "Path=/treg/" in flags
    # treg's own listen address is not its origin once TREG_PUBLIC_URL says what is
    reply = await raw_exchange(client.port, raw_request_bytes("POST", "/ui/login", [
        ("Content-Type", FORM), ("Origin", f"http://127.0.0.1:{client.port}"), ("Cookie", f"treg_login={nonce}")],
        form))
    assert reply.status == 403 and reply.header("Set-Cookie") is None


async def test_x_forwarded_proto_sets_secure_only_from_a_trusted_proxy(make_app, aiohttp_client):
    client = await aiohttp_client(make_app(trusted_proxies=("127.0.0.1/32",)))
    org = await membership.create_org(client.app[SERVICES], slug="acme", email="owner@acme.test")
    own = f"http://127.0.0.1:{client.port}"

    async def session_cookie(source: str, proto: str | None) -> str:
        hop = [("X-Forwarded-Proto", proto)] if proto else []
        token, nonce = _form_of(await raw_exchange(client.port, raw_request_bytes("GET", "/ui/login"), source=source))
        reply = await raw_exchange(client.port, raw_request_bytes("POST", "/ui/login", [
            ("Content-Type", FORM), ("Origin", own), ("Cookie", f"treg_login={nonce}"), *hop],
            urlencode({"token": org["token"], "form_token": token}).encode()), source=source)
        assert reply.status == 303, reply.body[:300]
        return _set_cookies(reply)["treg_session"]

    assert "Secure" in await session_cookie("127.0.0.1", "https")  # the trusted proxy's word
    assert "Secure" not in await session_cookie("127.0.0.1", None)
    assert "Secure" not in await session_cookie("127.0.0.1", "http")
    assert "Secure" not in await session_cookie("127.0.0.2", "https")  # anyone else's is ignored
