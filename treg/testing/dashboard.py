"""The dashboard (/ui/) over HTTP: ``login`` (a session cookie in the client's jar, its CSRF token returned),
``session_cookie`` and ``CSRF``, the pattern of a page's CSRF field."""

from __future__ import annotations

import re
from typing import Any

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


async def login(client: Any, token: str, org: str | None = None) -> str:
    """Logs ``client`` in (its cookie jar keeps ``treg_session``); returns the session's CSRF token."""
    form = {"token": token}
    if org:
        form["org"] = org
    resp = await client.post("/ui/login", data=form, allow_redirects=False)
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
