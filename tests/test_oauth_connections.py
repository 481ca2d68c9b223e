"""OAuth connections end to end against a scripted provider on 127.0.0.1 (treg.testing.vendors.oauth):
OAuth apps, the consent flow over plain HTTP, connections as credentials on the catalog ladder and in
tool bindings, refresh and its faults, revocation, the audit row (docs/oauth.md)."""

from __future__ import annotations

import asyncio
import json

import pytest

from treg.testing import audit_row
from treg.testing.gateway import Gateway
from treg.testing.vendors.oauth import (CLIENT_ID, CLIENT_SECRET, FakeOAuth, consent_by_http, oauth_gateway,
                                        provider_row)


@pytest.fixture
def fake(fake_oauth):
    return fake_oauth


@pytest.fixture
async def gw(make_app, aiohttp_client, fake):
    """A treg serving ``oauthy`` (the fake), org ``acme``, no OAuth app yet (:func:`register_app`)."""
    async with oauth_gateway(aiohttp_client, make_app, provider_row(fake.url), client=None) as g:
        yield g


async def register_app(gw: Gateway) -> None:
    await gw.api("PUT", "/api/v1/oauth-apps/oauthy", json={"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET},
                 expect=200)


async def connect(gw: Gateway, **body) -> dict:
    created = await gw.api("POST", "/api/v1/connections", json={"provider": "oauthy", **body}, expect=201)
    done = await consent_by_http(created["connect_url"])
    assert done.callback_status == 200, done.callback_body
    return created


async def test_a_person_connects_and_a_catalog_call_carries_the_token(gw, fake):
    await register_app(gw)
    created = await connect(gw)
    assert created["status"] == "pending" and created["connect_url"].startswith(
        f"http://127.0.0.1:{gw.client.port}/oauth/connect/")
    r = await gw.call("GET", "/catalog/call/oauthy.items.list")
    body = await r.json()
    assert r.status == 200, body
    assert body["user"] == "alice" and r.headers["X-Treg-Credential-Tier"] == "own"
    assert fake.resource_calls[-1] in fake.access
    row = await audit_row(gw, r.headers["X-Treg-Call-Id"])
    assert row["credential_kind"] == "oauth" and row["connection_id"] == created["id"]
    listed = (await gw.api("GET", "/api/v1/connections", expect=200))["connections"]
    assert [c["status"] for c in listed] == ["active"]
    assert fake.resource_calls[-1] not in json.dumps(listed)


# -- OAuth apps ---------------------------------------------------------------------------------------

async def test_an_org_app_is_write_only_and_the_deployment_one_stands_in(gw, make_app, aiohttp_client, fake):
    r = await gw.call("GET", "/api/v1/oauth-apps/oauthy")
    assert r.status == 404 and (await r.json())["error"] == "oauth_app_missing" and r.headers["X-Treg-Error"] == "1"
    r = await gw.call("POST", "/api/v1/connections", json={"provider": "oauthy"})
    assert r.status == 422 and (await r.json())["error"] == "oauth_app_missing"
    out = await gw.api("PUT", "/api/v1/oauth-apps/oauthy",
                       json={"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET}, expect=200)
    assert out == {"provider": "oauthy", "client_id": CLIENT_ID, "source": "org"}
    got = await gw.api("GET", "/api/v1/oauth-apps/oauthy", expect=200)
    assert got == out and CLIENT_SECRET not in json.dumps(got)
    member = await gw.member("m@acme.test")
    r = await gw.call("PUT", "/api/v1/oauth-apps/oauthy", as_=member["headers"],
                      json={"client_id": "x", "client_secret": "y"})
    assert r.status == 403 and (await r.json())["error"] == "forbidden_role"
    r = await gw.call("PUT", "/api/v1/oauth-apps/nope", json={"client_id": "x", "client_secret": "y"})
    assert r.status == 404 and (await r.json())["error"] == "oauth_provider_unknown"
    r = await gw.call("PUT", "/api/v1/oauth-apps/oauthy", json={"client_id": "", "client_secret": "y"})
    assert r.status == 400 and (await r.json())["error"] == "invalid_oauth_app"
    await gw.api("DELETE", "/api/v1/oauth-apps/oauthy", expect=204)
    assert (await gw.call("GET", "/api/v1/oauth-apps/oauthy")).status == 404
    # at rest the secret is sealed: no row holds it in clear
    async with gw.services.db.tx() as tx:
        raw = await tx.fetch_all("SELECT * FROM oauth_apps")
    assert CLIENT_SECRET.encode() not in repr(raw).encode()

    from treg.settings import SecretStr

    async with oauth_gateway(aiohttp_client, make_app, provider_row(fake.url), client=None, slug="dep",
                             oauth_client_ids={"OAUTHY": CLIENT_ID},
                             oauth_client_secrets={"OAUTHY": SecretStr(CLIENT_SECRET)}) as other:
        assert await other.api("GET", "/api/v1/oauth-apps/oauthy", expect=200) == {
            "provider": "oauthy", "client_id": CLIENT_ID, "source": "deployment"}
        created = await connect(other)
        r = await other.call("GET", "/catalog/call/oauthy.me")
        assert r.status == 200 and (await r.json())["user"] == "alice", created


def test_the_deployment_app_is_read_from_prefixed_settings():
    from treg import settings as settings_mod

    s = settings_mod.load({"TREG_OAUTH_CLIENT_ID_MY_PROVIDER": "cid",
                           "TREG_OAUTH_CLIENT_SECRET_MY_PROVIDER": "cs-Zq9-unique"})
    client_id, secret = s.oauth_client("my-provider")
    assert client_id == "cid" and secret.reveal() == "cs-Zq9-unique" and "cs-Zq9-unique" not in repr(s)
    assert settings_mod.load({"TREG_OAUTH_CLIENT_ID_X": "cid"}).oauth_client("x") is None  # both or none


# -- the consent flow and its attackers ---------------------------------------------------------------

async def test_the_consent_page_names_org_member_provider_and_scopes_and_asks_pkce(gw, fake):
    await register_app(gw)
    member = await gw.member("dev@acme.test")
    created = await gw.api("POST", "/api/v1/connections", as_=member["headers"],
                           json={"provider": "oauthy", "scopes": ["items.read", "items.write"]}, expect=201)
    done = await consent_by_http(created["connect_url"])
    assert "acme" in done.page and "dev@acme.test" in done.page and "Oauthy" in done.page
    assert "items.read" in done.page and "items.write" in done.page
    [asked] = fake.authorize_requests
    assert asked["code_challenge_method"] == "S256" and asked["scope"] == "items.read items.write"
    assert asked["redirect_uri"] == f"http://127.0.0.1:{gw.client.port}/oauth/callback"
    exchange = next(f for f in fake.token_requests if f["grant_type"] == "authorization_code")
    assert exchange["redirect_uri"] == asked["redirect_uri"] and len(exchange["code_verifier"]) >= 43
    assert done.callback_status == 200 and "connected" in done.callback_body
    # the link was used: a second opening is a 404 page, never a redirect
    r = await gw.client.get(created["connect_url"].split(str(gw.client.port), 1)[1])
    assert r.status == 404 and "text/html" in r.headers["Content-Type"]
    # the member sees their own; another member does not
    other = await gw.member("x@acme.test")
    assert (await gw.api("GET", "/api/v1/connections", as_=other["headers"], expect=200))["connections"] == []
    r = await gw.call("GET", f"/api/v1/connections/{created['id']}", as_=other["headers"])
    assert r.status == 404 and (await r.json())["error"] == "connection_not_found"


def _path(url: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "")


async def test_a_replayed_state_a_swapped_code_and_a_foreign_post_change_nothing(gw, fake):
    import aiohttp

    await register_app(gw)
    created = await gw.api("POST", "/api/v1/connections", json={"provider": "oauthy"}, expect=201)
    page = await gw.client.get(_path(created["connect_url"]))
    text = await page.text()
    token = text.split('name="consent_token" value="', 1)[1].split('"', 1)[0]
    # posted cross-site (a page elsewhere auto-submitting the form): 403 page, the link still good
    r = await gw.client.post(_path(created["connect_url"]), data={"consent_token": token},
                             headers={"Origin": "https://evil.example"}, allow_redirects=False)
    assert r.status == 403 and "Location" not in r.headers
    r = await gw.client.post(_path(created["connect_url"]), data={},
                             headers={"Origin": f"http://127.0.0.1:{gw.client.port}"}, allow_redirects=False)
    assert r.status == 403 and "Location" not in r.headers  # without the page's token
    # the real flow, stopped before the provider answers
    done = await consent_by_http(created["connect_url"], follow_authorize=False)
    from urllib.parse import parse_qs, urlsplit

    state = parse_qs(urlsplit(done.authorize_url).query)["state"][0]
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as victim:
        # the callback in a browser that never pressed the button (a forwarded provider page): 400, nothing used
        async with victim.get(f"{gw.client.make_url('/oauth/callback')}?code=x&state={state}") as r:
            assert r.status == 400 and "another browser" in await r.text()
    # a code of another authorization request (swapped): the provider refuses it (PKCE), the connection is denied
    other = await gw.api("POST", "/api/v1/connections", json={"provider": "oauthy"}, expect=201)
    stolen = await consent_by_http(other["connect_url"], follow_authorize=False)
    async with aiohttp.ClientSession() as http:
        async with http.get(stolen.authorize_url, allow_redirects=False) as r:
            other_code = parse_qs(urlsplit(r.headers["Location"]).query)["code"][0]
    async with aiohttp.ClientSession(cookies={"treg_oauth_state": done.cookie}) as browser:
        url = gw.client.make_url("/oauth/callback")
        async with browser.get(f"{url}?code={other_code}&state={state}") as r:
            assert r.status == 400 and "refused the code" in await r.text()
        async with browser.get(f"{url}?code={other_code}&state={state}") as r:  # replayed: nothing changes
            assert r.status == 400 and "unknown or was used" in await r.text()
    detail = await gw.api("GET", f"/api/v1/connections/{created['id']}", expect=200)
    assert detail["status"] == "denied"
    # a state that was never issued
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{gw.client.make_url('/oauth/callback')}?code=x&state=" + "A" * 43) as r:
            assert r.status == 400


async def test_denied_at_the_provider_marks_the_connection_denied(gw, fake):
    await register_app(gw)
    fake.deny = True
    created = await gw.api("POST", "/api/v1/connections", json={"provider": "oauthy"}, expect=201)
    done = await consent_by_http(created["connect_url"])
    assert done.callback_status == 400 and "access_denied" in done.callback_body
    assert (await gw.api("GET", f"/api/v1/connections/{created['id']}", expect=200))["status"] == "denied"


async def test_an_expired_link_is_a_410_page_and_the_pending_connection_goes(gw, fake):
    await register_app(gw)
    created = await gw.api("POST", "/api/v1/connections", json={"provider": "oauthy"}, expect=201)
    async with gw.services.db.tx() as tx:
        await tx.execute("UPDATE oauth_connections SET link_expires_at = now() - interval '1 second'")
    r = await gw.client.get(_path(created["connect_url"]))
    assert r.status == 410 and "expired" in await r.text()
    assert (await gw.api("GET", "/api/v1/connections", expect=200))["connections"] == []


async def test_redirect_after_stays_on_treg_and_the_browser_lands_there(gw, fake):
    await register_app(gw)
    own = f"http://127.0.0.1:{gw.client.port}"
    for bad in ("https://evil.example/ui/", "//evil.example/", f"http://user@127.0.0.1:{gw.client.port}/",
                "javascript:alert(1)", f"{own}/ui/#x", "/ui/connections"):
        r = await gw.call("POST", "/api/v1/connections", json={"provider": "oauthy", "redirect_after": bad})
        assert r.status == 400 and (await r.json())["error"] == "invalid_redirect_after", bad
    created = await gw.api("POST", "/api/v1/connections",
                           json={"provider": "oauthy", "redirect_after": f"{own}/ui/connections?x=1"}, expect=201)
    done = await consent_by_http(created["connect_url"])
    assert done.callback_status == 303 and done.callback_location == f"{own}/ui/connections?x=1"


async def test_a_shared_connection_is_the_team_tier_and_only_managers_make_one(gw, fake):
    await register_app(gw)
    member = await gw.member("dev@acme.test")
    r = await gw.call("POST", "/api/v1/connections", as_=member["headers"], json={"provider": "oauthy", "shared": True})
    assert r.status == 403 and (await r.json())["error"] == "forbidden_role"
    await connect(gw, shared=True)
    r = await gw.call("GET", "/catalog/call/oauthy.me", as_=member["headers"])
    assert r.status == 200 and r.headers["X-Treg-Credential-Tier"] == "team"
    r = await gw.call("GET", "/catalog/call/oauthy.me")  # its creator too
    assert r.status == 200 and r.headers["X-Treg-Credential-Tier"] == "team"
    # the member's own connection, once made, is their own tier (the table's order)
    await gw.api("POST", "/api/v1/connections", as_=member["headers"], json={"provider": "oauthy"}, expect=201)
    mine = await gw.api("POST", "/api/v1/connections", as_=member["headers"], json={"provider": "oauthy"}, expect=201)
    assert (await consent_by_http(mine["connect_url"])).callback_status == 200
    r = await gw.call("GET", "/catalog/call/oauthy.me", as_=member["headers"])
    assert r.status == 200 and r.headers["X-Treg-Credential-Tier"] == "own"
    row = await audit_row(gw, r.headers["X-Treg-Call-Id"])
    assert row["connection_id"] == mine["id"]


async def test_a_connection_beats_a_secret_within_the_team_tier(gw, fake):
    await register_app(gw)
    await gw.secret("sk-static-key-123", provider="oauthy")
    r = await gw.call("GET", "/catalog/call/oauthy.me")
    assert r.status == 401 and r.headers["X-Treg-Credential-Tier"] == "team"  # the static key: the fake refuses it
    await connect(gw, shared=True)
    r = await gw.call("GET", "/catalog/call/oauthy.me")
    assert r.status == 200 and r.headers["X-Treg-Credential-Tier"] == "team"


# -- no credential: a connect_url for the agent to hand over ------------------------------------------

async def test_no_credential_carries_a_connect_url_reused_while_valid(gw, fake):
    from treg.testing import Mcp

    await register_app(gw)
    r = await gw.call("GET", "/catalog/call/oauthy.items.list")
    body = await r.json()
    assert r.status == 404 and body["error"] == "no_credential" and r.headers["X-Treg-Error"] == "1"
    assert body["connect_url"].startswith(f"http://127.0.0.1:{gw.client.port}/oauth/connect/")
    assert "person" in body["hint"] and "connect" in body["detail"]
    again = await (await gw.call("GET", "/catalog/call/oauthy.items.list")).json()
    assert again["connect_url"] == body["connect_url"]  # the pending one is reused
    # over MCP: the same body is the error result
    result = await Mcp(gw).call("catalog_call", {"endpoint": "oauthy.items.list"})
    assert result["isError"] is True
    assert result["structuredContent"]["error"] == "no_credential"
    assert result["structuredContent"]["connect_url"] == body["connect_url"]
    # the person opens it; the agent retries and succeeds
    done = await consent_by_http(body["connect_url"])
    assert done.callback_status == 200
    r = await gw.call("GET", "/catalog/call/oauthy.items.list")
    assert r.status == 200


async def test_without_an_app_no_credential_says_who_can_add_one(gw, fake):
    r = await gw.call("GET", "/catalog/call/oauthy.items.list")
    body = await r.json()
    assert r.status == 404 and body["error"] == "no_credential" and "connect_url" not in body
    assert "oauth-apps" in body["hint"]


# -- refresh ------------------------------------------------------------------------------------------

async def expire_now(gw: Gateway) -> None:
    """The stored expiry moved into the refresh skew (as time passing would), the provider's tokens too."""
    async with gw.services.db.tx() as tx:
        await tx.execute("UPDATE oauth_connections SET expires_at = now() + interval '5 seconds'")
        await tx.execute("SELECT pg_notify('treg_changes', 'connections:' || %(o)s)", {"o": gw.org["org_id"]})
    from treg.org_changes import forget_local

    forget_local(gw.services, gw.org["org_id"])


async def test_a_due_token_is_refreshed_once_and_a_rotated_refresh_token_replaces_the_old(gw, fake):
    await register_app(gw)
    created = await connect(gw)
    first_refresh = next(iter(fake.refresh_tokens))
    assert (await gw.call("GET", "/catalog/call/oauthy.me")).status == 200
    assert fake.refreshes() == 0
    await expire_now(gw)
    fake.expire_all()
    answers = await asyncio.gather(*(gw.call("GET", "/catalog/call/oauthy.me") for _ in range(20)))
    assert [a.status for a in answers] == [200] * 20
    assert fake.refreshes() == 1  # one refresh for twenty calls at expiry
    assert [f["refresh_token"] for f in fake.token_requests if f["grant_type"] == "refresh_token"] == [first_refresh]
    # rotated: the next refresh sends the new refresh token, never the old one again
    await expire_now(gw)
    fake.expire_all()
    assert (await gw.call("GET", "/catalog/call/oauthy.me")).status == 200
    sent = [f["refresh_token"] for f in fake.token_requests if f["grant_type"] == "refresh_token"]
    assert len(sent) == 2 and sent[1] != first_refresh and sent.count(first_refresh) == 1
    detail = await gw.api("GET", f"/api/v1/connections/{created['id']}", expect=200)
    assert detail["refresh_count"] == 2 and [r["outcome"] for r in detail["refreshes"]] == ["ok", "ok"]
    assert detail["last_refreshed_at"] is not None
    metrics = await (await gw.client.get("/metrics")).text()
    assert 'treg_oauth_refresh_total{outcome="ok"} 2.0' in metrics


async def test_invalid_grant_needs_reauth_and_reconsent_keeps_the_connection(gw, fake):
    await register_app(gw)
    created = await connect(gw)
    tool = await gw.tool("items", f"{fake.url}/api", [{"location": "header", "name": "Authorization",
                                                       "format": "Bearer {secret}", "connection_id": created["id"]}])
    assert (await gw.call("GET", "/call/items/items")).status == 200
    fake.mode = "invalid_grant"
    await expire_now(gw)
    r = await gw.call("GET", "/call/items/items")
    body = await r.json()
    assert r.status == 409 and body["error"] == "connection_needs_reauth" and body["blame"] == "caller"
    assert body["connect_url"].startswith(f"http://127.0.0.1:{gw.client.port}/oauth/connect/")
    assert r.headers["X-Treg-Error"] == "1"
    # a catalog call it served answers the same (not a new connection's no_credential), the same link
    r = await gw.call("GET", "/catalog/call/oauthy.me")
    again = await r.json()
    assert r.status == 409 and again["error"] == "connection_needs_reauth"
    assert again["connect_url"] == body["connect_url"] and "X-Treg-Cost-Micro" not in r.headers
    detail = await gw.api("GET", f"/api/v1/connections/{created['id']}", expect=200)
    assert detail["status"] == "needs_reauth" and detail["refreshes"][0]["outcome"] == "invalid_grant"
    assert detail["connect_url"] == body["connect_url"]
    r = await gw.call("POST", f"/api/v1/connections/{created['id']}/refresh")
    forced = await r.json()
    assert r.status == 409 and forced["error"] == "connection_not_active"
    assert forced["connect_url"] == body["connect_url"]
    fake.mode = "ok"
    done = await consent_by_http(body["connect_url"])
    assert done.callback_status == 200
    assert (await gw.api("GET", f"/api/v1/connections/{created['id']}", expect=200))["status"] == "active"
    r = await gw.call("GET", "/call/items/items")  # the tool's binding still names it
    assert r.status == 200, await r.text()
    assert tool["bindings"][0]["connection_id"] == created["id"]


async def test_a_token_endpoint_down_is_502_and_the_connection_stays_active(gw, fake):
    await register_app(gw)
    created = await connect(gw)
    for mode in ("down", "not_json"):
        fake.mode = mode
        await expire_now(gw)
        r = await gw.call("GET", "/catalog/call/oauthy.me")
        body = await r.json()
        assert r.status == 502 and body["error"] == "oauth_refresh_failed" and body["blame"] == "upstream", body
        assert r.headers["X-Treg-Credential-Tier"] == "own"
        detail = await gw.api("GET", f"/api/v1/connections/{created['id']}", expect=200)
        assert detail["status"] == "active" and detail["refreshes"][0]["outcome"] == "failed"
    async with gw.services.db.tx() as tx:
        assert await tx.scalar("SELECT lease_holder FROM oauth_connections") is None  # the lease was released
    fake.mode = "ok"
    assert (await gw.call("GET", "/catalog/call/oauthy.me")).status == 200  # the next call refreshes
    r = await gw.call("POST", f"/api/v1/connections/{created['id']}/refresh")
    assert r.status == 200 and (await r.json())["refreshes"][0]["outcome"] == "ok"
    metrics = await (await gw.client.get("/metrics")).text()
    assert 'treg_oauth_refresh_total{outcome="failed"} 2.0' in metrics


async def test_a_slow_token_endpoint_is_waited_for_by_every_call(gw, fake):
    await register_app(gw)
    await connect(gw)
    fake.mode, fake.delay_s = "slow", 1.0
    await expire_now(gw)
    answers = await asyncio.gather(*(gw.call("GET", "/catalog/call/oauthy.me") for _ in range(10)))
    assert [a.status for a in answers] == [200] * 10 and fake.refreshes() == 1


async def test_an_upstream_401_marks_the_token_stale_and_is_relayed_unchanged(gw, fake):
    await register_app(gw)
    await connect(gw)
    fake.expire_all()  # the provider stopped taking the token before its stated expiry
    seen = len(fake.resource_calls)
    r = await gw.call("GET", "/catalog/call/oauthy.me")
    assert r.status == 401 and "X-Treg-Error" not in r.headers
    assert (await r.json()) == {"error": "invalid_token"} and "invalid_token" in r.headers["WWW-Authenticate"]
    assert len(fake.resource_calls) == seen + 1  # never re-sent by treg
    assert fake.refreshes() == 0
    r = await gw.call("GET", "/catalog/call/oauthy.me")
    assert r.status == 200 and fake.refreshes() == 1


async def test_a_forced_refresh_and_who_may_ask_for_one(gw, fake):
    await register_app(gw)
    created = await connect(gw)
    member = await gw.member("m@acme.test")
    r = await gw.call("POST", f"/api/v1/connections/{created['id']}/refresh", as_=member["headers"])
    assert r.status == 404  # another member's own connection is not visible
    detail = await gw.api("POST", f"/api/v1/connections/{created['id']}/refresh", expect=200)
    assert detail["refresh_count"] == 1 and fake.refreshes() == 1
    assert all(t not in json.dumps(detail) for t in list(fake.access) + list(fake.refresh_tokens))
    pending = await gw.api("POST", "/api/v1/connections", json={"provider": "oauthy"}, expect=201)
    r = await gw.call("POST", f"/api/v1/connections/{pending['id']}/refresh")
    assert r.status == 409 and (await r.json())["error"] == "connection_not_active"


# -- bindings, deletion, revocation -------------------------------------------------------------------

async def test_bindings_name_exactly_one_source_and_a_deleted_connection_is_409(gw, fake):
    await register_app(gw)
    created = await connect(gw)
    bad = [{"location": "header", "name": "Authorization", "connection_id": created["id"], "secret_id": "sec_x"}]
    r = await gw.call("POST", "/api/v1/tools", json={"name": "t", "base_url": f"{fake.url}/api", "bindings": bad})
    assert r.status == 400 and (await r.json())["error"] == "invalid_binding"
    r = await gw.call("POST", "/api/v1/tools", json={"name": "t", "base_url": f"{fake.url}/api", "bindings": [
        {"location": "header", "name": "Authorization", "connection_id": "conn_nope"}]})
    assert r.status == 422 and (await r.json())["error"] == "unknown_connection"
    admin = await gw.member("admin@acme.test", role="admin")
    r = await gw.call("POST", "/api/v1/tools", as_=admin["headers"], json={
        "name": "t", "base_url": f"{fake.url}/api",
        "bindings": [{"location": "header", "name": "Authorization", "connection_id": created["id"]}]})
    assert r.status == 422 and (await r.json())["error"] == "connection_not_shared"
    await gw.tool("items", f"{fake.url}/api", [{"location": "header", "name": "Authorization",
                                                "format": "Bearer {secret}", "connection_id": created["id"]}])
    r = await gw.call("GET", "/call/items/me")
    assert r.status == 200
    row = await audit_row(gw, r.headers["X-Treg-Call-Id"])
    assert row["credential_kind"] == "oauth" and row["connection_id"] == created["id"]
    refresh_token = next(iter(fake.refresh_tokens))
    await gw.api("DELETE", f"/api/v1/connections/{created['id']}", expect=204)
    assert fake.revoked == [{"token": refresh_token, "token_type_hint": "refresh_token"}]
    r = await gw.call("GET", "/call/items/me")
    body = await r.json()
    assert r.status == 409 and body["error"] == "connection_missing" and body["blame"] == "org_connection"
    assert (await gw.call("GET", f"/api/v1/connections/{created['id']}")).status == 404


async def test_a_failed_revocation_is_logged_and_the_delete_goes_on(gw, fake, caplog):
    await register_app(gw)
    created = await connect(gw)
    fake.client_secret = "changed"  # the provider now refuses treg's client: the revocation fails
    await gw.api("DELETE", f"/api/v1/connections/{created['id']}", expect=204)
    assert fake.revoked == [] and "revocation" in caplog.text
    assert (await gw.api("GET", "/api/v1/connections", expect=200))["connections"] == []


async def test_no_token_code_verifier_or_secret_in_answers_audit_or_logs(gw, fake, caplog):
    import logging

    caplog.set_level(logging.DEBUG)
    await register_app(gw)
    created = await connect(gw)
    await gw.tool("items", f"{fake.url}/api", [{"location": "query", "name": "access_token",
                                                "connection_id": created["id"]}])
    fake.expire_all()
    r = await gw.call("GET", "/call/items/me")  # a failed call: its evidence is kept
    assert r.status == 401
    await expire_now(gw)
    assert (await gw.call("GET", "/catalog/call/oauthy.me")).status == 200
    calls = await gw.calls()
    details = [await audit_row(gw, c["call_id"]) for c in calls]
    async with gw.services.db.tx() as tx:
        stored = repr(await tx.fetch_all("SELECT * FROM calls")) + repr(await tx.fetch_all(
            "SELECT * FROM oauth_connections")) + repr(await tx.fetch_all("SELECT * FROM oauth_refreshes"))
    # treg's own lines (aiohttp's test server logs requests with its own access logger, query and all;
    # treg serve's access log never has a query or a connect link's opaque: test_oauth_logged_paths)
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("treg"))
    everything = json.dumps(details, default=str) + stored + logged + json.dumps(
        await gw.api("GET", "/api/v1/connections", expect=200), default=str)
    secrets = (list(fake.access) + [g.refresh_token for g in fake.refresh_tokens.values()]
               + [f.get("code") for f in fake.token_requests if f.get("code")]
               + [f.get("code_verifier") for f in fake.token_requests if f.get("code_verifier")]
               + [f.get("refresh_token") for f in fake.token_requests if f.get("refresh_token")] + [CLIENT_SECRET])
    assert len(secrets) >= 6
    for value in secrets:
        assert value not in everything, value
    failed = next(d for d in details if d["status"] == 401)
    assert "[REDACTED]" in failed["error_request"]["url"]


def test_the_access_log_keeps_neither_a_connect_link_nor_a_callback_code():
    from treg.web.access_log import logged_path

    assert logged_path("/oauth/connect/Wbjn8h52MdV1qlQySsXQkw2FI6Hj6I9tIeowHGxw4AI") == "/oauth/connect/…"
    assert logged_path("/oauth/callback?code=code-1&state=s") == "/oauth/callback"


async def test_rotate_key_moves_the_client_secret_and_the_tokens(gw, fake):
    from treg import secrets_store
    from treg.infra import crypto
    from treg.infra.crypto import SecretBox
    from treg.org_changes import forget_local

    await register_app(gw)
    created = await connect(gw)
    svc = gw.services
    new_box = SecretBox(crypto.decode_key(crypto.new_key_text()), previous=(svc.box.current,))
    assert await secrets_store.rotate_key(svc, new_box) == 2  # the app's secret, the connection's tokens
    assert await secrets_store.rotate_key(svc, new_box) == 0
    svc.box = SecretBox(new_box.current)  # the old key gone: everything must read under the new one
    forget_local(svc, gw.org["org_id"])
    assert (await gw.call("GET", "/catalog/call/oauthy.me")).status == 200
    await gw.api("POST", f"/api/v1/connections/{created['id']}/refresh", expect=200)
    assert (await gw.call("GET", "/catalog/call/oauthy.me")).status == 200


async def test_rotate_key_moves_the_verifier_of_a_consent_in_flight(gw, fake):
    """A consent a person has started but not finished holds only its PKCE verifier (no tokens yet): rotation
    moves it too, so the callback still reads it once the old key is gone."""
    from treg import secrets_store
    from treg.infra import crypto
    from treg.infra.crypto import SecretBox

    await register_app(gw)
    pending = await gw.api("POST", "/api/v1/connections", json={"provider": "oauthy"}, expect=201)
    svc = gw.services
    aad = {"org_id": gw.org["org_id"], "secret_id": f"oauth-verifier:{pending['id']}"}
    async with svc.db.tx() as tx:  # the consent button was pressed: the verifier is sealed, no tokens yet
        await tx.execute("UPDATE oauth_connections SET verifier_blob = %(b)s WHERE id = %(id)s",
                         {"b": svc.box.encrypt(b"verifier-in-flight", **aad), "id": pending["id"]})
    new_box = SecretBox(crypto.decode_key(crypto.new_key_text()), previous=(svc.box.current,))
    assert await secrets_store.rotate_key(svc, new_box) == 2  # the app's secret, the verifier
    assert await secrets_store.rotate_key(svc, new_box) == 0
    async with svc.db.tx() as tx:
        row = await tx.fetch_one("SELECT tokens_blob, verifier_blob FROM oauth_connections WHERE id = %(id)s",
                                 {"id": pending["id"]})
    assert row["tokens_blob"] is None
    assert SecretBox(new_box.current).decrypt(row["verifier_blob"], **aad) == b"verifier-in-flight"


async def test_a_lease_left_by_a_dead_process_is_taken_over_once_it_expires(make_app, aiohttp_client, fake):
    async with oauth_gateway(aiohttp_client, make_app, provider_row(fake.url), oauth_refresh_lease_s=2.0) as gw:
        await _dead_lease_taken_over(gw, fake)


async def _dead_lease_taken_over(gw: Gateway, fake: FakeOAuth) -> None:
    created = await connect(gw)
    async with gw.services.db.tx() as tx:  # a process took the lease and died
        await tx.execute("UPDATE oauth_connections SET lease_holder = 'dead:1', lease_until = now() + interval '1.5 s'")
    await expire_now(gw)
    r = await gw.call("GET", "/catalog/call/oauthy.me")
    assert r.status == 200 and fake.refreshes() == 1
    detail = await gw.api("GET", f"/api/v1/connections/{created['id']}", expect=200)
    assert detail["refreshes"][0]["outcome"] == "ok"


async def test_a_token_without_expires_in_is_refreshed_only_after_a_401(gw, fake):
    await register_app(gw)
    fake.expires_in = None
    created = await connect(gw)
    assert (await gw.api("GET", f"/api/v1/connections/{created['id']}", expect=200))["expires_at"] is None
    for _ in range(3):
        assert (await gw.call("GET", "/catalog/call/oauthy.me")).status == 200
    assert fake.refreshes() == 0
    fake.expire_all()
    assert (await gw.call("GET", "/catalog/call/oauthy.me")).status == 401
    assert (await gw.call("GET", "/catalog/call/oauthy.me")).status == 200 and fake.refreshes() == 1


async def test_an_answer_without_a_new_refresh_token_keeps_the_old_one(gw, fake):
    await register_app(gw)
    fake.rotate = False
    await connect(gw)
    first = next(iter(fake.refresh_tokens))
    for _ in range(2):
        await expire_now(gw)
        assert (await gw.call("GET", "/catalog/call/oauthy.me")).status == 200
    assert [f["refresh_token"] for f in fake.token_requests if f["grant_type"] == "refresh_token"] == [first, first]


async def test_connect_urls_and_the_redirect_uri_come_from_treg_public_url(make_app, aiohttp_client, fake):
    async with oauth_gateway(aiohttp_client, make_app, provider_row(fake.url),
                             public_url="https://gw.example.com/treg") as gw:
        await _behind_a_proxy(gw)


async def _behind_a_proxy(gw: Gateway) -> None:
    from urllib.parse import parse_qs, urlsplit

    client = gw.client
    created = await gw.api("POST", "/api/v1/connections", json={"provider": "oauthy"},
                           as_={**gw.owner, "Host": "evil.example"}, expect=201)
    assert created["connect_url"].startswith("https://gw.example.com/treg/oauth/connect/")
    r = await gw.call("POST", "/api/v1/connections", json={
        "provider": "oauthy", "redirect_after": f"http://127.0.0.1:{client.port}/ui/"})
    assert r.status == 400  # the listen address is not treg's own origin once TREG_PUBLIC_URL says otherwise
    path = urlsplit(created["connect_url"]).path.removeprefix("/treg")  # the proxy strips the prefix
    page = await (await client.get(path)).text()
    assert 'action="/treg/oauth/connect/' in page
    token = page.split('name="consent_token" value="', 1)[1].split('"', 1)[0]
    r = await client.post(path, data={"consent_token": token}, headers={"Origin": "https://gw.example.com"},
                          allow_redirects=False)
    assert r.status == 302
    asked = parse_qs(urlsplit(r.headers["Location"]).query)
    assert asked["redirect_uri"] == ["https://gw.example.com/treg/oauth/callback"]
    cookie = r.headers["Set-Cookie"]
    assert "treg_oauth_state=" in cookie and "Path=/treg/oauth/" in cookie and "Secure" in cookie
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie
    r = await gw.call("GET", "/catalog/call/oauthy.me")
    assert (await r.json())["connect_url"].startswith("https://gw.example.com/treg/oauth/connect/")


async def test_an_echoed_token_is_masked_in_evidence_in_every_encoding(gw, fake, up):
    """An upstream that echoes the injected access token back (raw, percent-encoded, base64, hex, JSON
    escaped) in a failed answer: the evidence keeps none of it; nor the refresh token."""
    import base64 as b64
    from urllib.parse import quote

    from treg.testing.upstreams import http_response

    await register_app(gw)
    created = await connect(gw)
    refresh_token = next(iter(fake.refresh_tokens))

    def echo(ex):
        token = ex.header("Authorization").removeprefix("Bearer ")
        forms = [token, quote(token, safe=""), "".join(f"%{b:02x}" for b in token.encode()),
                 b64.b64encode(token.encode()).decode(),
                 b64.urlsafe_b64encode(token.encode()).decode().rstrip("="), token.encode().hex(),
                 "".join(f"\\u{ord(c):04x}" for c in token), refresh_token]
        return http_response(400, json.dumps({"echo": forms}).encode(), [("Content-Type", "application/json")])

    up.responder = echo
    # the upstream is on 127.0.0.1 as the gateway allows; the tool binds the connection
    await gw.tool("echo", up.url, [{"location": "header", "name": "Authorization", "format": "Bearer {secret}",
                                    "connection_id": created["id"]}])
    r = await gw.call("GET", "/call/echo/x")
    assert r.status == 400
    row = await audit_row(gw, r.headers["X-Treg-Call-Id"])
    evidence = json.dumps(row["error_response"]) + json.dumps(row["error_request"])
    access = next(iter(fake.access))
    for value in (access, quote(access, safe=""), b64.b64encode(access.encode()).decode(), access.encode().hex(),
                  refresh_token):
        assert value not in evidence
    assert evidence.count("[REDACTED]") >= 8


async def test_the_token_endpoint_is_dialled_through_the_ssrf_guard(make_app, aiohttp_client, fake, fake_dns):
    """A token_url whose name resolves inside (a poisoned catalog row, a DNS rebinding): the code is never
    sent there; the sign-in ends on a 502 page and nothing is stored."""
    fake_dns.records["tokens.inside.example"] = [("10.0.0.7", 60)]
    row = provider_row(fake.url)
    row["oauth"]["token_url"] = "https://tokens.inside.example/token"
    async with oauth_gateway(aiohttp_client, make_app, row) as gw:
        created = await gw.api("POST", "/api/v1/connections", json={"provider": "oauthy"}, expect=201)
        done = await consent_by_http(created["connect_url"])
        assert done.callback_status == 502 and "internal address" in done.callback_body
        assert not any(f.get("grant_type") == "authorization_code" for f in fake.token_requests)
        detail = await gw.api("GET", f"/api/v1/connections/{created['id']}", expect=200)
        assert detail["status"] == "pending" and detail["expires_at"] is None
