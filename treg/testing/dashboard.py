"""The dashboard (/ui/) over HTTP, as a browser uses it: ``login`` (the login form's token, its pre-login
cookie and treg's own Origin; the session cookie kept in the client's jar, its CSRF token returned),
``post_login`` for a login test's own form, ``session_cookie`` and ``CSRF``, the pattern of a page's
CSRF field."""

from __future__ import annotations

import re
from typing import Any

CSRF = re.compile(r'name="csrf" value="([^"]+)"')
FORM_TOKEN = re.compile(r'name="form_token" value="([^"]*)"')


def own_origin(client: Any) -> str:
    """The origin a browser on ``client``'s server sends (``http://127.0.0.1:<port>``)."""
    return str(client.make_url("/")).rstrip("/")


async def login_form(client: Any) -> str:
    """``GET /ui/login`` (``client``'s jar keeps the pre-login cookie); the form's token."""
    resp = await client.get("/ui/login")
    assert resp.status == 200, resp.status
    match = FORM_TOKEN.search(await resp.text())
    assert match and match.group(1), "no form token on the login page"
    return match.group(1)


async def post_login(client: Any, form: dict[str, str], **kw: Any) -> Any:
    """The login form sent as treg's own login page sends it (its token fetched first)."""
    form = {"form_token": await login_form(client), **form}
    return await client.post("/ui/login", data=form, headers={"Origin": own_origin(client)}, **kw)


async def login(client: Any, token: str, org: str | None = None) -> str:
    """Logs ``client`` in (its cookie jar keeps ``treg_session``); returns the session's CSRF token."""
    form = {"token": token}
    if org:
        form["org"] = org
    resp = await post_login(client, form, allow_redirects=False)
    assert resp.status == 303, (resp.status, await resp.text())
    page = await client.get("/ui/")
    assert page.status == 200
    match = CSRF.search(await page.text())
    assert match, "no CSRF token on the overview page"
    return match.group(1)


def session_cookie(client: Any) -> str:
    for cookie in client.session.cookie_jar:
        if cookie.key == "treg_session":
            return cookie.value
    raise AssertionError("no treg_session cookie")
