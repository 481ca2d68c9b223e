"""Login CSRF (surfaces.md, Login): a page on another origin must not log a victim's browser into the
attacker's org. Reproduced in Debian's chromium (an attacker page on another port of 127.0.0.1 with a
sandboxed iframe that posts the login form: ``Origin: null``), then every variant over raw HTTP."""

from __future__ import annotations

import asyncio
import re
import time
from urllib.parse import urlencode

import pytest
from aiohttp import web

from treg import tenancy, ui_sessions
from treg.testing import browser as chromium_browser

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
    evil = await tenancy.create_org(gateway.services, slug="evil", email="attacker@evil.test")
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
