"""The refresh lease across two real ``treg serve`` processes on one PostgreSQL database (docs/oauth.md
"Refresh"): 50 calls at expiry over both make exactly one token request, each expiry, against Django OAuth
Toolkit (its token requests counted by DOT itself); a slow token endpoint is waited for by both (a
counting fake on 127.0.0.1); no token reaches either process's log."""

from __future__ import annotations

import asyncio
import datetime as dt
import json

import aiohttp
import pytest

from treg.testing import Api, assert_clean_exits, run_treg, serve_pair, stop_all, treg_env
from treg.testing.oauth_server import CLIENT_ID, CLIENT_SECRET, DotServer, consent_in_browser
from treg.testing.vendors import oauth as vendor

CALLS = 50
SKEW_S = 2


def _env(tmp_path, dsn, settings, plugins, **extra):
    return treg_env(tmp_path / "home", dsn, TREG_SECRET_KEY=settings.secret_key.reveal(), TREG_SSRF_ALLOW="127.0.0.0/8",
                    TREG_PLUGINS_DIR=str(plugins), TREG_OAUTH_REFRESH_SKEW_S=str(SKEW_S), **extra)


async def _owner(env) -> dict:
    done = await asyncio.to_thread(run_treg, env, "init", "--org", "acme", "--email", "o@acme.test")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


async def _until_due(api: Api, token: str, connection_id: str) -> None:
    """Sleep until the connection's token is inside the refresh skew (its expiry read from treg)."""
    _, detail, _ = await api.req("GET", f"/api/v1/connections/{connection_id}", token, 200)
    expires = dt.datetime.fromisoformat(detail["expires_at"])
    wait = (expires - dt.timedelta(seconds=SKEW_S) - dt.datetime.now(dt.timezone.utc)).total_seconds()
    await asyncio.sleep(max(0.0, wait) + 0.3)


async def _burst(session: aiohttp.ClientSession, bases: list[str], token: str, path: str) -> list[int]:
    async def one(i: int) -> int:
        async with session.get(bases[i % len(bases)] + path, headers={"X-Treg-Token": token}) as r:
            await r.read()
            return r.status
    return list(await asyncio.gather(*(one(i) for i in range(CALLS))))


pytest.importorskip("oauth2_provider", reason="django-oauth-toolkit is not installed (the test extra)")


async def test_fifty_calls_at_expiry_over_two_processes_make_one_refresh_at_dot(dsn, settings, tmp_path, browser):
    dot = DotServer(tmp_path / "dot", [], expires_s=8)
    plugins = tmp_path / "plugins"
    vendor.write_plugin(plugins, dot.provider_row())
    env = _env(tmp_path, dsn, settings, plugins, TREG_OAUTH_CLIENT_ID_DOT=CLIENT_ID,
               TREG_OAUTH_CLIENT_SECRET_DOT=CLIENT_SECRET)
    owner = (await _owner(env))["token"]
    a, b = await serve_pair(env, tmp_path)
    try:
        dot.redirect_uris = [f"{a.base}/oauth/callback", f"{b.base}/oauth/callback"]
        await asyncio.to_thread(dot.start)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90)) as session:
            A = Api(session, a.base)
            _, created, _ = await A.req("POST", "/api/v1/connections", owner, 201, json={"provider": "dot"})
            page = await consent_in_browser(browser, created["connect_url"])
            assert page.callback_status == 200
            await page.context.close()
            statuses = await _burst(session, [a.base, b.base], owner, "/catalog/call/dot.me")
            assert statuses == [200] * CALLS and dot.refreshes() == 0
            for expiry in (1, 2):  # each expiry: one token request, whichever process and however many calls
                await _until_due(A, owner, created["id"])
                statuses = await _burst(session, [a.base, b.base], owner, "/catalog/call/dot.me")
                assert statuses == [200] * CALLS, statuses
                assert dot.refreshes() == expiry, dot.token_requests()
            _, detail, _ = await A.req("GET", f"/api/v1/connections/{created['id']}", owner, 200)
            assert [r["outcome"] for r in detail["refreshes"]] == ["ok", "ok"] and detail["refresh_count"] == 2
    finally:
        codes = await stop_all(a, b)
        dot.stop()
    assert_clean_exits(codes, a, b)
    logs = a.log.read_text() + b.log.read_text()
    assert CLIENT_SECRET not in logs and "access_token" not in logs and "/oauth/connect/…" in logs
    assert created["connect_url"].rsplit("/", 1)[1] not in logs  # the link's opaque is never logged


async def test_a_slow_token_endpoint_is_one_request_for_both_processes(dsn, settings, tmp_path):
    async with vendor.FakeOAuth() as fake:
        plugins = tmp_path / "plugins"
        vendor.write_plugin(plugins, vendor.provider_row(fake.url))
        env = _env(tmp_path, dsn, settings, plugins, TREG_OAUTH_CLIENT_ID_OAUTHY=vendor.CLIENT_ID,
                   TREG_OAUTH_CLIENT_SECRET_OAUTHY=vendor.CLIENT_SECRET)
        owner = (await _owner(env))["token"]
        a, b = await serve_pair(env, tmp_path)
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=90)) as session:
                A = Api(session, a.base)
                _, created, _ = await A.req("POST", "/api/v1/connections", owner, 201, json={"provider": "oauthy"})
                done = await vendor.consent_by_http(created["connect_url"])
                assert done.callback_status == 200
                fake.mode, fake.delay_s = "slow", 3.0
                psql = await asyncio.to_thread(_expire_in_db, dsn)
                assert psql == 1
                await asyncio.sleep(2.5)  # both processes' caches dropped by the NOTIFY
                statuses = await _burst(session, [a.base, b.base], owner, "/catalog/call/oauthy.me")
                assert statuses == [200] * CALLS and fake.refreshes() == 1
                # the token endpoint down: one failed request for the burst, the connection stays active
                fake.mode = "down"
                assert await asyncio.to_thread(_expire_in_db, dsn) == 1
                await asyncio.sleep(2.5)
                statuses = await _burst(session, [a.base, b.base], owner, "/catalog/call/oauthy.me")
                # at most one attempt per process (a process that waited on the other's failed refresh
                # fails with it instead of trying again)
                assert set(statuses) == {502} and 2 <= fake.refreshes() <= 3
                _, detail, _ = await A.req("GET", f"/api/v1/connections/{created['id']}", owner, 200)
                assert detail["status"] == "active"
        finally:
            codes = await stop_all(a, b)
        assert_clean_exits(codes, a, b)


def _expire_in_db(dsn: str) -> int:
    """The token's stored expiry moved inside the skew, and every process told (as a refresh would be)."""
    import psycopg2

    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute("UPDATE oauth_connections SET expires_at = now() + interval '1 second' RETURNING org_id")
            rows = cur.fetchall()
            for (org_id,) in rows:
                cur.execute("SELECT pg_notify('treg_changes', %s)", (f"connections:{org_id}",))
            return len(rows)
    finally:
        conn.close()
