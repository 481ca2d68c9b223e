"""Routed endpoints (lifecycle.md "Routed endpoints") over real HTTP: three fake vendors on 127.0.0.1
share the capability ``people.find``; ``treg.people.find`` tries them cheapest first.

alpha.find (500 µ$) < gamma.find (1000 µ$) < beta.find (2000 µ$). Platform keys exist for alpha and beta
only, so a caller without a gamma secret has no tier for gamma: it is skipped.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from treg import membership, money
from treg.keys import SERVICES
from treg import reaper
from treg.money import holds as money_holds
from treg.settings import SecretStr
from treg.testing import Gateway, ProviderPlugin, http_response, raw_upstream

ALPHA, GAMMA, BETA = 500, 1000, 2000
CREDITS = 10_000
ROUTED = "/catalog/call/treg.people.find?q=ada"


def vendor(pid: str, url: str, price: int, **endpoint: Any) -> dict[str, Any]:
    """A fake vendor's provider row: one people.find endpoint at ``url``."""
    return {"id": pid, "base_url": url,
            "auth": [{"location": "header", "name": "Authorization", "format": "Bearer {secret}"}],
            "endpoints": [{"id": f"{pid}.find", "method": "GET", "path": "/find",
                           "params": [{"name": "q", "in": "query", "required": True}],
                           "price": {"per_call_micro": price}, "capability": "people.find", **endpoint}]}


class Vendors:
    """The three vendors' upstreams; ``status[pid]`` is what each answers next (200: a JSON match)."""

    def __init__(self) -> None:
        self.status = {"alpha": 200, "beta": 200, "gamma": 200}
        self.ups: dict[str, Any] = {}
        self.on_answer: dict[str, Any] = {}

    def responder(self, pid: str):
        async def answer(ex):
            hook = self.on_answer.get(pid)
            if hook is not None:
                await hook(ex)
            status = self.status[pid]
            body = json.dumps({"vendor": pid, "people": [{"name": "Ada"}]} if status < 300 else {"error": "no"})
            return http_response(status, body.encode(), [("Content-Type", "application/json")])
        return answer


@pytest.fixture
async def routed(aiohttp_client, make_app):
    v = Vendors()
    async with raw_upstream(v.responder("alpha")) as a, raw_upstream(v.responder("beta")) as b, \
            raw_upstream(v.responder("gamma")) as g:
        v.ups = {"alpha": a, "beta": b, "gamma": g}
        rows = [vendor("alpha", a.url, ALPHA), vendor("beta", b.url, BETA), vendor("gamma", g.url, GAMMA),
                # one live endpoint (and a broken sibling) is not enough for a routed entry
                {"id": "solo", "base_url": a.url, "auth": [],
                 "endpoints": [{"id": "solo.only", "method": "GET", "path": "/s", "params": [],
                                "price": {"per_call_micro": 0}, "capability": "solo.thing"},
                               {"id": "solo.old", "method": "GET", "path": "/o", "params": [],
                                "price": {"per_call_micro": 0}, "capability": "solo.thing", "status": "broken"}]}]
        app = make_app(extra_plugins=(ProviderPlugin(rows),), ssrf_allow=("127.0.0.0/8",),
                       platform={"TREG_PLATFORM_KEY_ALPHA": SecretStr("alpha-platform"),
                                 "TREG_PLATFORM_KEY_BETA": SecretStr("beta-platform")})
        client = await aiohttp_client(app)
        org = await membership.create_org(client.app[SERVICES], slug="routed-org", email="o@routed.test")
        gw = Gateway(client, org)
        await money.grant(gw.services, org_id=org["org_id"], amount_micro=CREDITS, actor="test")
        yield gw, v
        await client.close()


async def holds_of(gw) -> dict[str, dict[str, Any]]:
    async with gw.services.db.tx() as tx:
        rows = await tx.fetch_all("SELECT id, state, amount_micro, settled_micro, closed_at FROM holds "
                                  "WHERE org_id = %(o)s", {"o": gw.org["org_id"]})
    return {r["id"]: r for r in rows}


async def children_of(gw, routed_id: str) -> list[dict[str, Any]]:
    """The child calls' audit rows, by endpoint id (rows of one batch share created_at: no order there)."""
    await gw.services.audit.flush()
    async with gw.services.db.tx() as tx:
        return await tx.fetch_all("SELECT id, endpoint_id, status, outcome, cost_micro, hold_state, error_code "
                                  "FROM calls WHERE parent_call_id = %(p)s ORDER BY endpoint_id", {"p": routed_id})


async def assert_money(gw, charged: int) -> None:
    """Balance = credits − what was settled, nothing held, every hold closed (settled or released once)."""
    bal = await money.balance(gw.services, gw.org["org_id"])
    holds = await holds_of(gw)
    assert all(h["state"] in ("settled", "released") and h["closed_at"] is not None for h in holds.values())
    assert sum(h["settled_micro"] for h in holds.values()) == charged
    assert all(h["settled_micro"] == 0 for h in holds.values() if h["state"] == "released")
    assert bal.held_micro == 0 and bal.balance_micro == CREDITS - charged, bal


# -- listing ----------------------------------------------------------------------------------------

async def test_listed_with_kind_routed_and_children_cheapest_first(routed):
    gw, _ = routed
    rows = (await gw.api("GET", "/api/v1/catalog/endpoints?capability=people.find", expect=200))["endpoints"]
    by_id = {r["id"]: r for r in rows}
    assert set(by_id) == {"alpha.find", "beta.find", "gamma.find", "treg.people.find"}
    r = by_id["treg.people.find"]
    assert r["kind"] == "routed" and by_id["alpha.find"]["kind"] == "endpoint"
    assert [c["id"] for c in r["children"]] == ["alpha.find", "gamma.find", "beta.find"]
    assert [(c["price_micro"], c["tier"], c["callable"]) for c in r["children"]] == [
        (ALPHA, "platform", True), (GAMMA, "team", False), (BETA, "platform", True)]
    assert r["credential_tier"] == "platform" and r["callable"] and r["price_micro"] == ALPHA
    assert [p["name"] for p in r["params"]] == ["q"] and r["example"] == "GET /catalog/call/treg.people.find?q=<q>"
    # one live endpoint of a capability: no routed entry
    all_ids = {e["id"] for e in (await gw.api("GET", "/api/v1/catalog/endpoints", expect=200))["endpoints"]}
    assert "treg.people.find" in all_ids and "treg.solo.thing" not in all_ids
    detail = await gw.api("GET", "/api/v1/catalog/endpoints/treg.people.find", expect=200)
    assert detail["kind"] == "routed" and [c["id"] for c in detail["children"]][0] == "alpha.find"
    # never an alternative to its own children
    alpha = await gw.api("GET", "/api/v1/catalog/endpoints/alpha.find", expect=200)
    assert [a["id"] for a in alpha["alternatives"]] == ["gamma.find", "beta.find"]
    found = (await gw.api("GET", "/api/v1/catalog/endpoints?q=people+find", expect=200))["endpoints"]
    assert "treg.people.find" in [e["id"] for e in found]
    # a team secret for gamma shows in the children's tiers
    await gw.secret("gamma-team", name="g", provider="gamma")
    detail = await gw.api("GET", "/api/v1/catalog/endpoints/treg.people.find", expect=200)
    assert [c["tier"] for c in detail["children"]] == ["platform", "team", "platform"]


# -- calls ------------------------------------------------------------------------------------------

async def test_the_cheapest_child_answers_and_only_it_is_charged(routed):
    gw, v = routed
    r = await gw.call("GET", ROUTED)
    body = await r.json()
    assert r.status == 200, body
    assert r.headers["X-Treg-Routed-To"] == "alpha.find" and r.headers["X-Treg-Cost-Micro"] == str(ALPHA)
    assert r.headers["X-Treg-Credential-Tier"] == "platform"
    assert body["output"] == {"vendor": "alpha", "people": [{"name": "Ada"}]}
    assert body["_treg"] == {"endpoint": "alpha.find", "credential_tier": "platform", "cost_micro": ALPHA,
                             "attempts": [{"endpoint": "alpha.find", "status": 200, "error": None}]}
    a = v.ups["alpha"]
    assert len(a.exchanges) == 1 and a.last.target == "/find?q=ada"
    assert a.last.header("Authorization") == "Bearer alpha-platform"
    assert a.last.header("Accept-Encoding") == "identity"
    assert not v.ups["beta"].exchanges and not v.ups["gamma"].exchanges
    await assert_money(gw, ALPHA)


async def test_a_failing_cheapest_child_passes_on_and_only_the_answer_is_charged(routed):
    gw, v = routed
    v.status["alpha"] = 503
    seen: dict[str, Any] = {}

    async def while_beta_answers(ex):
        # the failed child's hold is still open: it closes when the routed call ends
        seen["holds"] = {h["state"] for h in (await holds_of(gw)).values()}

    v.on_answer["beta"] = while_beta_answers
    r = await gw.call("GET", ROUTED, headers={"X-Treg-Tag": "crm"})
    body = await r.json()
    assert r.status == 200, body
    assert r.headers["X-Treg-Routed-To"] == "beta.find" and r.headers["X-Treg-Cost-Micro"] == str(BETA)
    assert body["output"]["vendor"] == "beta"
    assert body["_treg"]["attempts"] == [{"endpoint": "alpha.find", "status": 503, "error": "upstream_error"},
                                         {"endpoint": "gamma.find", "status": None, "error": "no_credential"},
                                         {"endpoint": "beta.find", "status": 200, "error": None}]
    assert seen["holds"] == {"held"}  # alpha's (its own) hold, open while beta ran
    assert not v.ups["gamma"].exchanges  # no tier: skipped without a call
    await assert_money(gw, BETA)
    holds = await holds_of(gw)
    assert len(holds) == 2 and sorted((h["state"], h["settled_micro"]) for h in holds.values()) == [
        ("released", 0), ("settled", BETA)]

    routed_id = r.headers["X-Treg-Call-Id"]
    kids = await children_of(gw, routed_id)
    assert [(k["endpoint_id"], k["status"], k["cost_micro"], k["hold_state"]) for k in kids] == [
        ("alpha.find", 503, 0, "released"), ("beta.find", 200, BETA, "settled")]
    assert {k["id"] for k in kids} == set(holds)  # each hold is its child call's
    detail = await gw.api("GET", f"/api/v1/calls/{routed_id}", expect=200)
    assert detail["endpoint_id"] == "treg.people.find" and detail["parent_call_id"] is None
    assert detail["credential_tier"] == "platform" and detail["cost_micro"] == BETA
    assert detail["hold_state"] == "settled" and detail["status"] == 200
    tags = (await gw.api("GET", "/api/v1/balance", expect=200))
    assert tags["held_micro"] == 0


async def test_a_team_tier_child_answers_free_and_the_failed_platform_child_is_released(routed):
    gw, v = routed
    await gw.secret("gamma-team", name="g", provider="gamma")
    v.status["alpha"] = 429
    r = await gw.call("GET", ROUTED)
    body = await r.json()
    assert r.status == 200 and r.headers["X-Treg-Routed-To"] == "gamma.find"
    assert r.headers["X-Treg-Cost-Micro"] == "0" and body["_treg"]["credential_tier"] == "team"
    assert v.ups["gamma"].last.header("Authorization") == "Bearer gamma-team"
    assert not v.ups["beta"].exchanges
    await assert_money(gw, 0)
    assert [h["state"] for h in (await holds_of(gw)).values()] == ["released"]


async def test_a_treg_refusal_passes_to_the_next_child(routed):
    gw, v = routed
    # a deny rule on alpha's upstream: the child is refused (403 denied_by_rule) before any I/O
    await gw.api("POST", "/api/v1/deny-rules", json={"host": f"127.0.0.1:{v.ups['alpha'].port}"}, expect=201)
    r = await gw.call("GET", ROUTED)
    body = await r.json()
    assert r.status == 200 and r.headers["X-Treg-Routed-To"] == "beta.find", body
    assert body["_treg"]["attempts"][0] == {"endpoint": "alpha.find", "status": 403, "error": "denied_by_rule"}
    assert not v.ups["alpha"].exchanges
    await assert_money(gw, BETA)


async def test_every_child_failing_is_a_502_route_exhausted_and_nothing_is_charged(routed):
    gw, v = routed
    v.status.update(alpha=500, beta=404)
    r = await gw.call("GET", ROUTED)
    body = await r.json()
    assert r.status == 502 and body["error"] == "route_exhausted" and body["blame"] == "upstream"
    assert r.headers["X-Treg-Error"] == "1" and r.headers["X-Treg-Cost-Micro"] == "0"
    assert "X-Treg-Routed-To" not in r.headers
    assert body["attempts"] == [{"endpoint": "alpha.find", "status": 500, "error": "upstream_error"},
                                {"endpoint": "gamma.find", "status": None, "error": "no_credential"},
                                {"endpoint": "beta.find", "status": 404, "error": "upstream_error"}]
    await assert_money(gw, 0)
    assert sorted(h["state"] for h in (await holds_of(gw)).values()) == ["released", "released"]
    detail = await gw.api("GET", f"/api/v1/calls/{r.headers['X-Treg-Call-Id']}", expect=200)
    assert detail["error_code"] == "route_exhausted" and detail["cost_micro"] == 0


async def test_every_child_refusing_the_callers_own_input_blames_the_caller(routed):
    """A required parameter missing: every child the caller could call refused it (400), the one it has
    no tier for was skipped: the caller must act, and ``reasons`` say what each child wanted."""
    gw, v = routed
    r = await gw.call("GET", "/catalog/call/treg.people.find")
    body = await r.json()
    assert r.status == 502 and body["error"] == "route_exhausted" and body["blame"] == "caller", body
    assert r.headers["X-Treg-Cost-Micro"] == "0"
    assert body["attempts"] == [{"endpoint": "alpha.find", "status": 400, "error": "invalid_parameters"},
                                {"endpoint": "gamma.find", "status": None, "error": "no_credential"},
                                {"endpoint": "beta.find", "status": 400, "error": "invalid_parameters"}]
    reasons = body["reasons"]
    assert [(x["endpoint"], x["error"], x["blame"]) for x in reasons] == [
        ("alpha.find", "invalid_parameters", "caller"), ("gamma.find", "no_credential", "caller"),
        ("beta.find", "invalid_parameters", "caller")]
    assert "'q'" in reasons[0]["detail"] and "'q'" in body["detail"]
    assert not any(up.exchanges for up in v.ups.values())
    await assert_money(gw, 0)


async def test_a_route_with_one_upstream_failure_still_blames_the_upstream(routed):
    gw, v = routed
    # alpha refused for a caller reason (a deny rule), beta's vendor failing: not the caller's alone
    await gw.api("POST", "/api/v1/deny-rules", json={"host": f"127.0.0.1:{v.ups['alpha'].port}"}, expect=201)
    v.status["beta"] = 503
    r = await gw.call("GET", ROUTED)
    body = await r.json()
    assert r.status == 502 and body["error"] == "route_exhausted" and body["blame"] == "upstream", body
    assert [(x["endpoint"], x["error"], x["blame"]) for x in body["reasons"]] == [
        ("alpha.find", "denied_by_rule", "caller"), ("gamma.find", "no_credential", "caller"),
        ("beta.find", "upstream_error", "upstream")]
    await assert_money(gw, 0)


async def test_the_idempotency_key_is_the_routed_calls(routed):
    gw, v = routed
    v.status["alpha"] = 500
    first = await gw.call("GET", ROUTED, headers={"Idempotency-Key": "order-77"})
    assert first.status == 200
    body = await first.read()
    second = await gw.call("GET", ROUTED, headers={"Idempotency-Key": "order-77"})
    assert second.status == 200 and await second.read() == body
    assert second.headers["X-Treg-Idempotent-Replay"] == "true" and second.headers["X-Treg-Cost-Micro"] == "0"
    assert second.headers["X-Treg-Routed-To"] == "beta.find"
    assert len(v.ups["alpha"].exchanges) == 1 and len(v.ups["beta"].exchanges) == 1  # no child ran again
    # a platform-tier child's upstream gets the (org, label) digest, never the caller's label
    sent = v.ups["beta"].last.header("Idempotency-Key")
    assert sent and sent != "order-77"
    await assert_money(gw, BETA)
    async with gw.services.db.tx() as tx:
        claims = await tx.fetch_all("SELECT call_id, state FROM idempotency_keys WHERE org_id = %(o)s",
                                    {"o": gw.org["org_id"]})
    assert [(c["call_id"], c["state"]) for c in claims] == [(first.headers["X-Treg-Call-Id"], "done")]
    # the same label with another request is refused
    other = await gw.call("GET", "/catalog/call/treg.people.find?q=bob", headers={"Idempotency-Key": "order-77"})
    assert other.status == 422 and (await other.json())["error"] == "idempotency_mismatch"


async def test_a_crash_before_the_close_leaves_the_holds_to_the_reaper(routed, monkeypatch):
    """The database goes away as the winning child answers: the routed call's answer (closed off its
    path, treg/money/settler.py) still leaves, both children's holds stay open, and the reaper releases
    them: the caller is charged nothing, each hold closed once."""
    gw, v = routed
    v.status["alpha"] = 500
    gw.services.settler.retry_for_s = 0.3  # the settler gives up soon: the holds are the reaper's

    async def database_gone(*args: Any, **kw: Any) -> Any:
        from treg.errors import DatabaseError
        raise DatabaseError("the database went away", code="database_unavailable")

    async def crash_when_beta_answers(ex):
        # from here on no hold can be closed: the routed call ends with both children's holds open
        monkeypatch.setattr(money_holds, "close_on", database_gone)

    v.on_answer["beta"] = crash_when_beta_answers
    r = await gw.call("GET", ROUTED)
    assert r.status == 200 and r.headers["X-Treg-Routed-To"] == "beta.find"
    assert gw.services.settler.left_to_reaper == 2
    monkeypatch.undo()
    holds = await holds_of(gw)
    assert sorted(h["state"] for h in holds.values()) == ["held", "held"]
    assert await reaper.reap_orphans(gw.services, older_than_s=0) == 2
    await assert_money(gw, 0)
    assert sorted(h["state"] for h in (await holds_of(gw)).values()) == ["released", "released"]


async def test_the_call_surface_and_a_replayed_failure_is_not_stored(routed):
    gw, v = routed
    v.status.update(alpha=500, beta=500)
    r = await gw.call("GET", "/call/treg.people.find?q=ada", headers={"Idempotency-Key": "k1"})
    assert r.status == 502
    # a failed routed call charged nothing: its label goes back, so a retry runs the children again
    v.status.update(alpha=200)
    r = await gw.call("GET", "/call/treg.people.find?q=ada", headers={"Idempotency-Key": "k1"})
    assert r.status == 200 and r.headers["X-Treg-Routed-To"] == "alpha.find"
    assert "X-Treg-Idempotent-Replay" not in r.headers
    await assert_money(gw, ALPHA)


async def test_mcp_lists_and_calls_the_routed_endpoint(routed):
    from treg.testing import Mcp

    gw, v = routed
    v.status["alpha"] = 500
    found = (await Mcp(gw).call("catalog_search", {"capability": "people.find"}))["structuredContent"]["endpoints"]
    row = next(e for e in found if e["id"] == "treg.people.find")
    assert row["kind"] == "routed" and row["credential_tier"] == "platform"
    assert [(c["id"], c["callable"]) for c in row["children"]] == [
        ("alpha.find", True), ("gamma.find", False), ("beta.find", True)]
    result = await Mcp(gw).call("catalog_call", {"endpoint": "treg.people.find", "params": {"q": "ada"}})
    out = result["structuredContent"]
    assert out["status"] == 200 and out["cost_micro"] == BETA and out["credential_tier"] == "platform"
    assert out["body"]["output"]["vendor"] == "beta" and out["body"]["_treg"]["endpoint"] == "beta.find"
    kids = await children_of(gw, out["call_id"])
    assert [k["endpoint_id"] for k in kids] == ["alpha.find", "beta.find"]
    await assert_money(gw, BETA)


async def test_a_cancelled_routed_call_releases_every_open_hold(routed):
    import asyncio

    from treg.call import service
    from treg.testing import call_input

    gw, v = routed
    v.status["alpha"] = 500
    beta_asked, done = asyncio.Event(), asyncio.Event()

    async def stall(ex):
        beta_asked.set()
        await asyncio.wait_for(done.wait(), 30)

    v.on_answer["beta"] = stall
    inp = call_input("treg.people.find", surface="catalog", raw_query="q=ada", token=gw.org["token"])
    task = asyncio.create_task(service.execute(gw.services, inp))
    await asyncio.wait_for(beta_asked.wait(), 10)
    assert sorted(h["state"] for h in (await holds_of(gw)).values()) == ["held", "held"]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(100):  # the unwinds are shielded: they finish even though the task was cancelled
        if all(h["state"] != "held" for h in (await holds_of(gw)).values()):
            break
        await asyncio.sleep(0.02)
    await assert_money(gw, 0)
    kids = await children_of(gw, inp.call_id)
    assert {(k["endpoint_id"], k["outcome"], k["hold_state"]) for k in kids} == {
        ("alpha.find", "upstream_error", "released"), ("beta.find", "cancelled", "released")}
    done.set()
