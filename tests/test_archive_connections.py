"""The archive keyed by an OAuth connection (lifecycle.md: "own + the tool, secret or connection id; team
+ the secret or connection id"): an answer fetched with one member's connection is served again to
that connection only; another member's own connection, or the org's shared one, reads the vendor.

Real parts: the fake OAuth provider over a real socket (treg.testing.vendors.oauth), the consent over
plain HTTP, treg on a real socket."""

from __future__ import annotations

import pytest

from treg.testing.vendors.oauth import consent_by_http, oauth_gateway, provider_row


def _archived_row(base: str) -> dict:
    row = provider_row(base)
    for ep in row["endpoints"]:
        if ep["id"].endswith(".items.list"):
            ep["archive"] = {"ttl_s": 3600, "cache_price": "free"}
    return row


async def _connect(gw, as_, *, shared: bool = False) -> str:
    body = {"provider": "oauthy", "shared": shared}
    conn = await gw.api("POST", "/api/v1/connections", as_=as_, json=body, expect=201)
    done = await consent_by_http(conn["connect_url"])
    assert done.callback_status == 200, done.callback_body
    return conn["id"]


@pytest.fixture
async def world(aiohttp_client, make_app, fake_oauth):
    async with oauth_gateway(aiohttp_client, make_app, _archived_row(fake_oauth.url)) as gw:
        a = await gw.api("POST", "/api/v1/members", json={"email": "a@acme.test", "role": "member"}, expect=201)
        b = await gw.api("POST", "/api/v1/members", json={"email": "b@acme.test", "role": "member"}, expect=201)
        yield gw, fake_oauth, {"X-Treg-Token": a["token"]}, {"X-Treg-Token": b["token"]}


async def _call(gw, as_):
    r = await gw.call("GET", "/catalog/call/oauthy.items.list", as_=as_)
    assert r.status == 200, await r.text()
    return r.headers["X-Treg-Credential-Tier"], r.headers["X-Treg-Cache"]


async def test_one_members_connection_never_reads_another_s_archived_answer(world):
    gw, _, a, b = world
    await _connect(gw, a)
    await _connect(gw, b)
    assert await _call(gw, a) == ("own", "stored")
    assert await _call(gw, a) == ("own", "hit")
    # b's own connection is another credential: the vendor is asked again, the answer stored under it
    assert await _call(gw, b) == ("own", "stored")
    assert await _call(gw, b) == ("own", "hit")


async def test_the_shared_connection_is_its_own_credential(world):
    gw, _, a, b = world
    await _connect(gw, gw.owner, shared=True)
    await _connect(gw, a)
    assert await _call(gw, b) == ("team", "stored")  # b has no connection of its own: the org's
    assert await _call(gw, b) == ("team", "hit")
    assert await _call(gw, a) == ("own", "stored")  # a's own connection wins its ladder: another key
