"""A bodiless catalog call's checked request and ladder decision are kept per shape (``Services.catalog_plans``,
treg/call/catalog_stage.py ``plan_key``): a repeated call skips the check and the ladder, and any change
that would change the decision — a new team secret, its removal, another query, another endpoint —
reaches a fresh decision. The credential that reaches the vendor is the proof: a raw-socket upstream
records each request's ``Authorization``."""

from __future__ import annotations

from treg import membership, money
from treg.keys import SERVICES
from treg.settings import SecretStr
from treg.testing import Gateway, ProviderPlugin, example_provider, http_response, raw_upstream

PATH = "/catalog/call/acme.items.get?item_id=7"


async def _gateway(aiohttp_client, make_app, up):
    app = make_app(extra_plugins=(ProviderPlugin([example_provider(up.url + "/v1")]),), ssrf_allow=("127.0.0.0/8",),
                   platform={"TREG_PLATFORM_KEY_ACME": SecretStr("pk-platform")})
    client = await aiohttp_client(app)
    org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
    gw = Gateway(client, org)
    await money.grant(gw.services, org_id=org["org_id"], amount_micro=1_000_000, actor="test")
    return gw


async def test_a_repeated_call_reuses_its_plan_and_a_new_credential_replans(aiohttp_client, make_app):
    async with raw_upstream(lambda ex: http_response(200, b'{"ok": true}', [("Content-Type", "application/json")])) as up:
        gw = await _gateway(aiohttp_client, make_app, up)
        plans = gw.services.catalog_plans

        async def called(path: str = PATH) -> tuple[int, str | None, str | None]:
            r = await gw.call("GET", path)
            await r.read()
            sent = up.exchanges[-1].header("Authorization") if r.status == 200 else None
            return r.status, r.headers.get("X-Treg-Credential-Tier"), sent

        assert await called() == (200, "platform", "Bearer pk-platform")
        assert len(plans) == 1
        assert await called() == (200, "platform", "Bearer pk-platform")
        assert len(plans) == 1  # the same shape: the kept plan
        secret_id = await gw.secret("sk-team", name="acme-team", provider="acme")
        assert await called() == (200, "team", "Bearer sk-team")  # the org's key now, not treg's
        assert len(plans) == 2
        await gw.api("DELETE", f"/api/v1/secrets/{secret_id}", expect=204)
        assert await called() == (200, "platform", "Bearer pk-platform")
        # another query is checked on its own: a bad value is refused every time, a good one planned
        for _ in range(2):
            status, _, _ = await called(PATH + "&fields=bad")
            assert status == 400
        assert await called(PATH + "&fields=all") == (200, "platform", "Bearer pk-platform")
        assert up.exchanges[-1].request_line.startswith("GET /v1/items/7?fields=all ")
        status, _, _ = await called("/catalog/call/acme.items.cheap?item_id=3")
        assert status == 200 and up.exchanges[-1].request_line.startswith("GET /v1/cheap/3 ")


async def test_a_member_without_the_org_tool_gets_its_own_plan(aiohttp_client, make_app):
    """The owner calls through an own tool bound to an acme secret (own tier); a member who may not use
    that tool gets the platform tier, from a plan of its own, on the same request."""
    async with raw_upstream(lambda ex: http_response(200, b'{"ok": true}', [("Content-Type", "application/json")])) as up:
        gw = await _gateway(aiohttp_client, make_app, up)
        member = await gw.member("m@acme.test", project_ids=[])
        secret_id = await gw.secret("sk-own", name="acme-own", provider="acme")
        project = await gw.api("POST", "/api/v1/projects", json={"name": "p"}, expect=201)
        await gw.tool("acme", up.url + "/v1", [{"location": "header", "name": "Authorization", "format": "Bearer {secret}",
                                                "secret_id": secret_id}], project_id=project["id"])
        r = await gw.call("GET", PATH)
        assert r.status == 200 and up.exchanges[-1].header("Authorization") == "Bearer sk-own"
        tier_owner = r.headers["X-Treg-Credential-Tier"]
        r = await gw.call("GET", PATH, as_=member["headers"])
        assert r.status == 200, await r.text()
        assert up.exchanges[-1].header("Authorization") == "Bearer sk-own"  # the team's key: same secret
        assert r.headers["X-Treg-Credential-Tier"] == "team" and tier_owner == "own"
        assert len(gw.services.catalog_plans) == 2
