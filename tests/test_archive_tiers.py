"""The archive on the team and own tiers (answers streamed, not metered: read whole within the archive's
cap only for an archived endpoint), the limits of what is stored, and own-tool relays left alone."""

from __future__ import annotations


import pytest

from treg import membership
from treg.keys import SERVICES
from treg.testing import Events, Gateway, raw_upstream
from treg.testing.vendors.archive import PeopleVendor, people_app


@pytest.fixture
async def team(aiohttp_client, make_app, tmp_path):
    """(gateway with a team key for ``people``, vendor, upstream); no platform key, no credit."""
    vendor = PeopleVendor()
    events = Events()
    async with raw_upstream(vendor) as up:
        app = people_app(make_app, up, tmp_path / "plugins", events, archive_max_bytes=1000)
        client = await aiohttp_client(app)
        org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
        gw = Gateway(client, org)
        await gw.secret("team-key-4242", name="people key", provider="people")
        yield gw, vendor, up
        await client.close()


async def _get(gw, endpoint, q, **headers):
    r = await gw.call("GET", f"/catalog/call/{endpoint}?q={q}", headers=headers)
    return r, await r.read()


async def test_a_team_tier_answer_is_stored_and_served_free(team):
    gw, vendor, up = team
    r1, b1 = await _get(gw, "people.find", "ada")
    assert r1.headers["X-Treg-Credential-Tier"] == "team" and r1.headers["X-Treg-Cache"] == "stored"
    assert up.last.target.endswith("api_key=team-key-4242")
    r2, b2 = await _get(gw, "people.find", "ada")
    assert r2.headers["X-Treg-Cache"] == "hit" and b2 == b1 and vendor.hits["ada"] == 1
    assert r2.headers["X-Treg-Cost-Micro"] == "0"
    d = await gw.api("GET", f"/api/v1/calls/{r2.headers['X-Treg-Call-Id']}", expect=200)
    assert (d["credential_tier"], d["cache_state"], d["result_state"], d["hold_state"]) == ("team", "hit", "hit", None)
    async with gw.services.db.tx() as tx:
        assert await tx.scalar("SELECT count(*) FROM holds") == 0
        (key,) = [r["key"] for r in await tx.fetch_all("SELECT key FROM archive_entries")]
    assert "team-key-4242" not in key


async def test_a_chunked_answer_within_the_cap_is_stored(team):
    gw, vendor, _ = team
    r1, b1 = await _get(gw, "people.find", "chunked")
    assert r1.headers["X-Treg-Cache"] == "stored" and b1 == b'{"data": {"emails": ["c@h.unk"]}}'
    r2, b2 = await _get(gw, "people.find", "chunked")
    assert r2.headers["X-Treg-Cache"] == "hit" and b2 == b1 and vendor.hits["chunked"] == 1


async def test_an_answer_over_the_cap_streams_whole_and_is_not_stored(team):
    gw, vendor, _ = team
    r1, b1 = await _get(gw, "people.find", "big")
    assert len(b1) > 1000 and b1.startswith(b'{"data": {"emails": ["x@y.z", ') and b1.endswith(b'"]}}')
    assert r1.headers["X-Treg-Cache"] == "miss"
    r2, b2 = await _get(gw, "people.find", "big")
    assert r2.headers["X-Treg-Cache"] == "miss" and b2 == b1 and vendor.hits["big"] == 2


async def test_a_compressed_answer_is_relayed_as_sent_and_not_stored(team):
    gw, vendor, _ = team
    r1, b1 = await _get(gw, "people.find", "gzip", **{"Accept-Encoding": "gzip"})
    assert r1.headers["X-Treg-Cache"] == "miss"
    r2, b2 = await _get(gw, "people.find", "gzip", **{"Accept-Encoding": "gzip"})
    assert r2.headers["X-Treg-Cache"] == "miss" and vendor.hits["gzip"] == 2
    assert b2 == b'{"data": {"emails": ["g@z.ip"]}}'  # the client inflated the vendor's gzip bytes


async def test_an_unknown_answer_on_the_team_tier_is_relayed_and_not_stored(team):
    gw, vendor, _ = team
    for _ in range(2):
        r, body = await _get(gw, "people.find", "text")
        assert r.headers["X-Treg-Cache"] == "miss" and body == b"found: a@b.c"
    assert vendor.hits["text"] == 2


async def test_the_own_tier_is_archived_but_an_own_tool_relay_never(team):
    gw, vendor, up = team
    sid = await gw.secret("own-key-77", name="mine", provider="people")
    await gw.tool("people-own", up.url + "/v1", [{"location": "query", "name": "api_key", "secret_id": sid}])
    r1, _ = await _get(gw, "people.find", "own")
    assert r1.headers["X-Treg-Credential-Tier"] == "own" and r1.headers["X-Treg-Cache"] == "stored"
    r2, _ = await _get(gw, "people.find", "own")
    assert r2.headers["X-Treg-Cache"] == "hit" and vendor.hits["own"] == 1
    for _ in range(2):  # the same vendor URL through the org's own tool: relayed, never archived
        r = await gw.call("GET", "/call/people-own/find?q=own")
        assert r.status == 200 and "X-Treg-Cache" not in r.headers
        await r.read()
    assert vendor.hits["own"] == 3
