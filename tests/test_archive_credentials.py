"""The archive keeps each credential's answers to the callers whose own ladder picks that credential
(docs/lifecycle.md "The key"): a member refused a tool never reads what its key fetched, another org
never reads an org's own-key answer through a `global` row, an own-key answer is never resold on the
platform tier; and a partial answer (a `206`, any answer to a `Range` request) is never stored or served.
Over real sockets: treg on 127.0.0.1, the vendor a raw socket that counts and records what it is asked."""

from __future__ import annotations

import json
from urllib.parse import parse_qsl, urlsplit

import pytest

from treg import membership, money
from treg.keys import SERVICES
from treg.settings import SecretStr
from treg.testing import Gateway, ProviderPlugin, http_response, raw_upstream
from treg.testing import check_books
from treg.testing.vendors.archive import PLATFORM_KEY, PRICE, PeopleVendor, people_provider, write_classifier_plugin

GRANT = 100_000


class RangeVendor(PeopleVendor):
    """The people vendor, answering a ``Range`` request with a ``206`` part (and ``q=part`` with a
    ``206`` even without one, as a vendor might)."""

    async def __call__(self, ex):
        q = dict(parse_qsl(urlsplit(ex.target).query)).get("q", "")
        rng = ex.header("Range")
        if rng is None and q != "part":
            return await super().__call__(ex)
        self.hits[q] += 1
        self.n += 1
        whole = json.dumps({"data": {"emails": [f"{q}@example.com"]}, "n": self.n}).encode()
        a, b = (0, 9) if rng is None else (int(x) for x in rng.removeprefix("bytes=").split("-"))
        return http_response(206, whole[a:b + 1], [("Content-Type", "application/json"),
                                                   ("Content-Range", f"bytes {a}-{b}/{len(whole)}")],
                             reason="Partial Content")


@pytest.fixture
async def world(aiohttp_client, make_app, tmp_path):
    """(acme's gateway, beta's gateway, vendor, upstream): treg's platform key for ``people``, both
    orgs with credit."""
    vendor = RangeVendor()
    async with raw_upstream(vendor) as up:
        app = make_app(extra_plugins=(ProviderPlugin([people_provider(up.url + "/v1")]),),
                       plugins_dir=write_classifier_plugin(tmp_path / "plugins"), ssrf_allow=("127.0.0.0/8",),
                       platform={"TREG_PLATFORM_KEY_PEOPLE": SecretStr(PLATFORM_KEY)})
        client = await aiohttp_client(app)
        svc = client.app[SERVICES]
        gws = []
        for slug in ("acme", "beta"):
            org = await membership.create_org(svc, slug=slug, email=f"o@{slug}.test")
            await money.grant(svc, org_id=org["org_id"], amount_micro=GRANT, actor="test")
            gws.append(Gateway(client, org))
        yield gws[0], gws[1], vendor, up
        await client.close()


async def _get(gw, endpoint, q, as_=None, **headers):
    r = await gw.call("GET", f"/catalog/call/{endpoint}?q={q}", as_=as_, headers=headers)
    return r, await r.read()


def _key_sent(up) -> str:
    return dict(parse_qsl(urlsplit(up.last.target).query))["api_key"]


async def _owner_tool(gw, up, value: str, name: str = "people-own") -> tuple[str, dict]:
    """A secret ``value`` for ``people`` and a tool bound to it that only the owner may use."""
    sid = await gw.secret(value, name=f"{name} key", provider="people")
    tool = await gw.tool(name, up.url + "/v1", [{"location": "query", "name": "api_key", "secret_id": sid}],
                         allowed_member_ids=[gw.org["member_id"]])
    return sid, tool


async def test_a_member_refused_a_tool_never_reads_what_its_key_fetched(world):
    acme, _, vendor, up = world
    await _owner_tool(acme, up, "owner-only-key-1")
    await acme.secret("team-key-2", name="team key", provider="people")  # newer: the team tier's
    member = await acme.member("m@acme.test")
    r = await acme.call("GET", "/call/people-own/find?q=ada", as_=member["headers"])
    assert r.status == 403 and (await r.json())["error"] == "tool_forbidden"  # the member may not use the tool

    r1, b1 = await _get(acme, "people.find", "ada")  # the owner: the tool's key
    assert (r1.headers["X-Treg-Credential-Tier"], r1.headers["X-Treg-Cache"]) == ("own", "stored")
    assert _key_sent(up) == "owner-only-key-1"
    r2, b2 = await _get(acme, "people.find", "ada", as_=member["headers"])  # the member: the team key
    assert r2.status == 200 and r2.headers["X-Treg-Credential-Tier"] == "team"
    assert r2.headers["X-Treg-Cache"] == "stored" and b2 != b1 and vendor.hits["ada"] == 2
    assert _key_sent(up) == "team-key-2"
    # each credential's entry serves its own callers again
    r3, b3 = await _get(acme, "people.find", "ada", as_=member["headers"])
    r4, b4 = await _get(acme, "people.find", "ada")
    assert (r3.headers["X-Treg-Cache"], b3) == ("hit", b2) and (r4.headers["X-Treg-Cache"], b4) == ("hit", b1)
    assert vendor.hits["ada"] == 2


async def test_a_rebound_tool_or_a_new_team_secret_is_another_credential(world):
    acme, _, vendor, up = world
    _, tool = await _owner_tool(acme, up, "first-account-key")
    r1, _ = await _get(acme, "people.find", "bob")
    assert r1.headers["X-Treg-Cache"] == "stored"
    other = await acme.secret("second-account-key", name="second", provider="people")
    await acme.api("PATCH", f"/api/v1/tools/{tool['id']}", expect=200,
                   json={"bindings": [{"location": "query", "name": "api_key", "secret_id": other}]})
    r2, _ = await _get(acme, "people.find", "bob")
    assert r2.headers["X-Treg-Credential-Tier"] == "own" and r2.headers["X-Treg-Cache"] == "stored"
    assert _key_sent(up) == "second-account-key" and vendor.hits["bob"] == 2


async def test_an_own_key_answer_is_never_resold_on_the_platform_tier(world):
    acme, _, vendor, up = world
    sid, tool = await _owner_tool(acme, up, "acme-own-key")
    r1, b1 = await _get(acme, "people.find", "cy")
    assert (r1.headers["X-Treg-Credential-Tier"], r1.headers["X-Treg-Cache"]) == ("own", "stored")
    await acme.api("DELETE", f"/api/v1/tools/{tool['id']}", expect=204)
    await acme.api("DELETE", f"/api/v1/secrets/{sid}", expect=204)
    r2, b2 = await _get(acme, "people.find", "cy")  # the org's credentials are gone: treg's key now
    assert r2.status == 200 and r2.headers["X-Treg-Credential-Tier"] == "platform"
    assert r2.headers["X-Treg-Cache"] == "stored" and b2 != b1 and vendor.hits["cy"] == 2
    assert _key_sent(up) == PLATFORM_KEY and r2.headers["X-Treg-Cost-Micro"] == str(PRICE)
    r3, b3 = await _get(acme, "people.find", "cy")  # the platform tier's own entry
    assert (r3.headers["X-Treg-Cache"], b3, r3.headers["X-Treg-Cost-Micro"]) == ("hit", b2, str(PRICE))
    books = await check_books(acme.services, acme.org["org_id"])
    assert [(h["state"], h["settled_micro"]) for h in books["holds"]] == [("settled", PRICE)] * 2


async def test_a_global_row_shares_only_treg_keys_answers_across_orgs(world):
    acme, beta, vendor, up = world
    await acme.secret("acme-team-key", name="acme people", provider="people")
    r1, b1 = await _get(acme, "people.public", "dee")  # acme's team key, on a scope: global row
    assert (r1.headers["X-Treg-Credential-Tier"], r1.headers["X-Treg-Cache"]) == ("team", "stored")
    r2, b2 = await _get(beta, "people.public", "dee")  # beta: treg's key
    assert r2.headers["X-Treg-Credential-Tier"] == "platform" and r2.headers["X-Treg-Cache"] == "stored"
    assert b2 != b1 and vendor.hits["dee"] == 2 and _key_sent(up) == PLATFORM_KEY
    r3, b3 = await _get(beta, "people.public", "dee")
    assert (r3.headers["X-Treg-Cache"], b3) == ("hit", b2)
    async with acme.services.db.tx() as tx:
        owners = sorted(str(r["org_id"]) for r in await tx.fetch_all("SELECT org_id FROM archive_entries"))
    assert owners == sorted([acme.org["org_id"], "None"])  # acme's own-credential entry stays acme's


async def test_a_partial_answer_is_never_stored_nor_served_for_a_range(world):
    acme, beta, vendor, up = world
    await acme.secret("acme-team-key", name="acme people", provider="people")
    for gw, tier in ((acme, "team"), (beta, "platform")):
        r, body = await _get(gw, "people.find", "eve", Range="bytes=0-9")
        assert r.status == 206 and r.headers["Content-Range"].startswith("bytes 0-9/") and len(body) == 10
        assert r.headers["X-Treg-Credential-Tier"] == tier and r.headers["X-Treg-Cache"] == "miss"
        assert up.last.header("Range") == "bytes=0-9"
        r, body = await _get(gw, "people.find", "eve")  # the whole answer: from the vendor, then stored
        assert r.status == 200 and r.headers["X-Treg-Cache"] == "stored" and json.loads(body)["data"]
        r, body = await _get(gw, "people.find", "eve", Range="bytes=5-7")  # a whole entry never answers a range
        assert r.status == 206 and len(body) == 3 and r.headers["X-Treg-Cache"] == "miss"
        r, _ = await _get(gw, "people.find", "part")  # a vendor's 206 to no Range at all: not stored either
        assert r.status == 206 and r.headers["X-Treg-Cache"] == "miss"
        r, _ = await _get(gw, "people.find", "part")
        assert r.status == 206 and r.headers["X-Treg-Cache"] == "miss"
    assert vendor.hits["eve"] == 6 and vendor.hits["part"] == 4
    async with acme.services.db.tx() as tx:
        assert await tx.scalar("SELECT count(*) FROM archive_entries WHERE status = 206") == 0
