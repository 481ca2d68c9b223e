"""OAuth connections end to end against a scripted provider on 127.0.0.1 (treg.testing.vendors.oauth):
OAuth apps, the consent flow over plain HTTP, connections as credentials on the catalog ladder and in
tool bindings, refresh and its faults, revocation, the audit row (docs/oauth.md)."""

from __future__ import annotations

import asyncio
import json

import pytest

from treg import tenancy
from treg.keys import SERVICES
from treg.testing import ProviderPlugin, audit_row
from treg.testing.gateway import Gateway
from treg.testing.vendors import oauth as vendor
from treg.testing.vendors.oauth import CLIENT_ID, CLIENT_SECRET, FakeOAuth, consent_by_http, provider_row


@pytest.fixture
async def fake():
    async with FakeOAuth() as server:
        yield server


@pytest.fixture
async def gw(make_app, aiohttp_client, fake):
    client = await aiohttp_client(make_app(extra_plugins=(ProviderPlugin([provider_row(fake.url)]),),
                                           ssrf_allow=("127.0.0.0/8",)))
    org = await tenancy.create_org(client.app[SERVICES], slug="acme", email="owner@acme.test")
    g = Gateway(client, org)
    yield g
    await client.close()


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
