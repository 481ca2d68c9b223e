"""OAuth connections against a real authorization server nobody on this project wrote: Django OAuth Toolkit
(PKCE required, rotated refresh tokens, RFC 7009 revocation) on 127.0.0.1, the consent driven by Debian's
chromium through Playwright, DOT's own login form included (treg.testing.oauth_server)."""

from __future__ import annotations

import base64
import json

import pytest

from treg import membership
from treg.keys import SERVICES
from treg.oauth import store
from treg.testing import ProviderPlugin, audit_row
from treg.testing.gateway import Gateway
from treg.testing.oauth_server import CLIENT_ID, CLIENT_SECRET, DotServer, consent_in_browser

pytest.importorskip("django", reason="django is not installed (the test extra: pip install -e '.[test]')")
pytest.importorskip("oauth2_provider", reason="django-oauth-toolkit is not installed (the test extra)")


@pytest.fixture
async def dot_gw(make_app, aiohttp_client, tmp_path):
    """A treg whose catalog has DOT as provider ``dot`` (the org's own OAuth app registered), and DOT
    itself, started once treg's callback URL is known; DOT stopped by its PID at the end."""
    dot = DotServer(tmp_path / "dot", [])
    client = await aiohttp_client(make_app(extra_plugins=(ProviderPlugin([dot.provider_row()]),),
                                           ssrf_allow=("127.0.0.0/8",)))
    dot.redirect_uris = [f"http://127.0.0.1:{client.port}/oauth/callback"]
    dot.start()
    try:
        org = await membership.create_org(client.app[SERVICES], slug="acme", email="owner@acme.test")
        gw = Gateway(client, org)
        await gw.api("PUT", "/api/v1/oauth-apps/dot", json={"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET},
                     expect=200)
        yield gw, dot
    finally:
        dot.stop()
        await client.close()


async def tokens_of(gw: Gateway, connection_id: str) -> store.Tokens:
    row = await store.fresh_row(gw.services, gw.org["org_id"], connection_id)
    return store.open_tokens(gw.services, gw.org["org_id"], connection_id, row["tokens_blob"])


async def test_a_person_connects_dot_in_the_browser_and_the_agent_call_succeeds(dot_gw, browser):
    gw, dot = dot_gw
    created = await gw.api("POST", "/api/v1/connections", json={"provider": "dot"}, expect=201)
    page = await consent_in_browser(browser, created["connect_url"])
    assert page.callback_status == 200
    assert "Dot connected" in await page.content()
    assert dot.token_requests() == {"authorization_code": 1}
    r = await gw.call("GET", "/catalog/call/dot.me")
    body = await r.json()
    assert r.status == 200 and body == {"user": "alice", "scope": "items.read", "path": "/api/me"}
    row = await audit_row(gw, r.headers["X-Treg-Call-Id"])
    assert row["credential_kind"] == "oauth" and row["connection_id"] == created["id"]
    detail = await gw.api("GET", f"/api/v1/connections/{created['id']}", expect=200)
    assert detail["status"] == "active" and detail["scopes"] == ["items.read"] and detail["expires_at"]
    tokens = await tokens_of(gw, created["id"])
    assert tokens.access_token not in json.dumps(detail) and tokens.refresh_token not in json.dumps(detail)
    # a forced refresh at DOT rotates the refresh token; the old one is refused from then on
    await gw.api("POST", f"/api/v1/connections/{created['id']}/refresh", expect=200)
    rotated = await tokens_of(gw, created["id"])
    assert rotated.refresh_token != tokens.refresh_token and rotated.access_token != tokens.access_token
    assert dot.refreshes() == 1
    assert (await gw.call("GET", "/catalog/call/dot.items.list")).status == 200
    await page.context.close()


async def test_cancel_at_dot_marks_the_connection_denied(dot_gw, browser):
    gw, dot = dot_gw
    created = await gw.api("POST", "/api/v1/connections", json={"provider": "dot"}, expect=201)
    page = await consent_in_browser(browser, created["connect_url"], deny=True)
    assert page.callback_status == 400 and "access_denied" in await page.content()
    assert (await gw.api("GET", f"/api/v1/connections/{created['id']}", expect=200))["status"] == "denied"
    assert dot.token_requests() == {}
    await page.context.close()


async def test_revoked_at_dot_needs_reauth_then_reconsent_and_delete_revokes(dot_gw, browser):
    import aiohttp

    gw, dot = dot_gw
    created = await gw.api("POST", "/api/v1/connections", json={"provider": "dot", "shared": True}, expect=201)
    page = await consent_in_browser(browser, created["connect_url"])
    await page.context.close()
    tokens = await tokens_of(gw, created["id"])
    async with aiohttp.ClientSession() as http:  # the person revokes treg's grant at the provider
        basic = base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode()).decode()
        async with http.post(f"{dot.url}/o/revoke_token/", data={"token": tokens.refresh_token,
                                                                 "token_type_hint": "refresh_token"},
                             headers={"Authorization": f"Basic {basic}"}) as r:
            assert r.status == 200
    r = await gw.call("POST", f"/api/v1/connections/{created['id']}/refresh")
    body = await r.json()
    assert r.status == 409 and body["error"] == "connection_needs_reauth" and body["connect_url"], body
    page = await consent_in_browser(browser, body["connect_url"])
    assert page.callback_status == 200
    await page.context.close()
    assert (await gw.api("GET", f"/api/v1/connections/{created['id']}", expect=200))["status"] == "active"
    assert (await gw.call("GET", "/catalog/call/dot.me")).status == 200
    fresh = await tokens_of(gw, created["id"])
    await gw.api("DELETE", f"/api/v1/connections/{created['id']}", expect=204)
    async with aiohttp.ClientSession() as http:  # revoked at DOT: the access token no longer works there
        async with http.get(f"{dot.url}/api/me", headers={"Authorization": f"Bearer {fresh.access_token}"}) as r:
            assert r.status == 401
