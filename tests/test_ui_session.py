"""The dashboard's session and its safety over real sockets: login, cookie flags, expiry, logout, CSRF,
the cookie as a call's identity only with X-Treg-CSRF, and the cookie never reaching an upstream."""

from __future__ import annotations

import asyncio

from sqlalchemy import select, text

from treg import authentication, membership
from treg.infra.schema import ui_sessions
from treg.testing import CSRF, http_response, login, own_origin, post_login, session_cookie


async def test_login_sets_a_strict_httponly_cookie_bound_to_a_hashed_row(gateway):
    resp = await post_login(gateway.client, {"token": gateway.org["token"]}, allow_redirects=False)
    assert resp.status == 303 and resp.headers["Location"] == "/ui/"
    cookie = resp.headers["Set-Cookie"]
    assert cookie.startswith("treg_session=")
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/;" in cookie
    assert "Secure" not in cookie  # served over http here; over https it is set (test_ui_login_csrf.py)
    value = session_cookie(gateway.client)
    async with gateway.services.db.tx() as tx:
        rows = await tx.fetch_all(select(ui_sessions.c.id_hash, ui_sessions.c.csrf))
    assert len(rows) == 1
    assert rows[0]["id_hash"] == authentication.hash_token(value) and value not in str(rows)
    page = await gateway.client.get("/ui/")
    assert page.status == 200 and "owner@acme.test" in await page.text()


async def test_a_bad_token_re_renders_the_form_with_a_message(gateway):
    for token in ("treg_nope", "", "x" * 5000):
        resp = await post_login(gateway.client, {"token": token}, allow_redirects=False)
        body = await resp.text()
        assert resp.status in (400, 401), (resp.status, body)
        assert 'for="token">Token</label>' in body and 'role="alert"' in body
        assert "Set-Cookie" not in resp.headers
    # malformed bytes and a NUL are a 400 page too, never a 500
    resp = await gateway.client.post("/ui/login", data=b"token=%ff%fe&x=\x00",
                                     headers={"Content-Type": "application/x-www-form-urlencoded",
                                              "Origin": own_origin(gateway.client)})
    assert resp.status == 400 and "Token" in await resp.text()


async def test_pages_need_a_session_and_send_you_to_the_login(gateway):
    resp = await gateway.client.get("/ui/activity?outcome=ok", allow_redirects=False)
    assert resp.status == 303 and resp.headers["Location"].startswith("/ui/login?next=")
    resp = await gateway.client.get("/ui/login")
    assert resp.status == 200 and 'for="token"' in await resp.text()


async def test_a_state_change_without_the_csrf_token_is_403(gateway):
    csrf = await login(gateway.client, gateway.org["token"])
    for form in ({"name": "k", "value": "v"}, {"name": "k", "value": "v", "csrf": "wrong"}):
        resp = await gateway.client.post("/ui/secrets", data=form)
        assert resp.status == 403, await resp.text()
    assert await gateway.api("GET", "/api/v1/secrets") == {"secrets": []}
    resp = await gateway.client.post("/ui/secrets", data={"name": "k", "value": "v", "csrf": csrf})
    assert resp.status == 200 and "k" in await resp.text()
    listed = await gateway.api("GET", "/api/v1/secrets")
    assert [s["name"] for s in listed["secrets"]] == ["k"]
    # and logging out is a state change too
    assert (await gateway.client.post("/ui/logout", data={})).status == 403


async def test_logout_and_expiry_end_the_session(gateway):
    csrf = await login(gateway.client, gateway.org["token"])
    resp = await gateway.client.post("/ui/logout", data={"csrf": csrf}, allow_redirects=False)
    assert resp.status == 303
    assert (await gateway.client.get("/ui/", allow_redirects=False)).status == 303
    await login(gateway.client, gateway.org["token"])
    async with gateway.services.db.tx() as tx:
        await tx.execute(text("UPDATE ui_sessions SET expires_at = now() - interval '1 second'"))
    assert (await gateway.client.get("/ui/", allow_redirects=False)).status == 303


async def test_revoking_the_login_token_ends_its_sessions(gateway):
    member = await gateway.member("dev@acme.test")
    await login(gateway.client, member["token"])
    tokens = await gateway.api("GET", "/api/v1/tokens")
    tok = next(t for t in tokens["tokens"] if t["member_id"] == member["member_id"])
    await gateway.api("DELETE", f"/api/v1/tokens/{tok['id']}", expect=204)
    assert (await gateway.client.get("/ui/", allow_redirects=False)).status == 303


async def test_the_cookie_identifies_a_call_only_with_x_treg_csrf(gateway, up, tool):
    csrf = await login(gateway.client, gateway.org["token"])
    cookie = session_cookie(gateway.client)
    # the cookie alone (what a cross-site request would carry): 401, and nothing reaches the upstream
    reply = await gateway.raw("GET", "/call/up/x", [("Cookie", f"treg_session={cookie}")], auth=False)
    assert reply.status == 401 and reply.json()["error"] == "missing_csrf"
    reply = await gateway.raw("GET", "/call/up/x", [("Cookie", f"treg_session={cookie}"), ("X-Treg-CSRF", "nope")],
                              auth=False)
    assert reply.status == 401 and reply.json()["error"] == "invalid_csrf"
    reply = await gateway.raw("GET", "/catalog/call/nope", [("Cookie", f"treg_session={cookie}")], auth=False)
    assert reply.status == 401
    assert up.exchanges == []
    # with the session's token: relayed, and the upstream never sees treg's cookie (others are kept)
    reply = await gateway.raw("GET", "/call/up/x", [("Cookie", f"theirs=1; treg_session={cookie}; other=2"),
                                                    ("X-Treg-CSRF", csrf)], auth=False)
    assert reply.status == 200, reply.body
    raw = up.last.raw
    assert cookie.encode() not in raw and b"treg_session" not in raw and csrf.encode() not in raw
    assert up.last.header("Cookie") == "theirs=1; other=2"
    calls = await gateway.api("GET", "/api/v1/calls")
    assert calls["calls"][0]["status"] == 200


async def test_an_upstream_cannot_set_the_session_cookie(gateway, up, tool):
    up.responder = lambda ex: http_response(200, b"ok", headers=[("Set-Cookie", "treg_session=evil; Path=/"),
                                                                 ("Set-Cookie", "theirs=1")])
    csrf = await login(gateway.client, gateway.org["token"])
    cookie = session_cookie(gateway.client)
    reply = await gateway.raw("GET", "/call/up/x", [("Cookie", f"treg_session={cookie}"), ("X-Treg-CSRF", csrf)],
                              auth=False)
    assert reply.status == 200
    assert [v for k, v in reply.headers if k.lower() == "set-cookie"] == ["theirs=1; Path=/call/up"]  # scoped to the tool


async def test_a_logged_out_session_cannot_call(gateway, up, tool):
    csrf = await login(gateway.client, gateway.org["token"])
    cookie = session_cookie(gateway.client)
    await gateway.client.post("/ui/logout", data={"csrf": csrf})
    reply = await gateway.raw("GET", "/call/up/x", [("Cookie", f"treg_session={cookie}"), ("X-Treg-CSRF", csrf)],
                              auth=False)
    assert reply.status == 401 and reply.json()["error"] == "invalid_session"
    await asyncio.sleep(0)
    assert up.exchanges == []


async def test_the_org_choice_for_a_user_of_several_orgs(gateway):
    other = await membership.create_org(gateway.services, slug="beta", email="owner@acme.test")
    resp = await post_login(gateway.client, {"token": other["token"]})
    body = await resp.text()
    assert resp.status == 200 and 'for="org">Org</label>' in body and "acme" in body and "beta" in body
    # the token decides: choosing an org it does not belong to is refused as X-Treg-Org would be
    resp = await post_login(gateway.client, {"token": other["token"], "org": "acme"})
    assert resp.status == 403 and "another org" in await resp.text()
    resp = await post_login(gateway.client, {"token": other["token"], "org": "beta"}, allow_redirects=False)
    assert resp.status == 303
    page = await gateway.client.get("/ui/")
    assert "beta" in await page.text() and CSRF.search(await page.text())
