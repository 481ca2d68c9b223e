"""The declared success rule (sharing.md "The declared success rule"): validated with the other row fields
at startup; over real sockets a billed 2xx whose answer fails it costs the caller nothing (the bytes
relayed unchanged, audited ``vendor_error``, the books exact), and the same rule decides an async
submission's acceptance, what its done poll reads as failed, what the archive stores and which child of a
routed call answered."""

from __future__ import annotations

import json

import pytest

from treg.catalog.success import SuccessRule, parse
from treg.testing import audit_row, catalog_problems, check_books, endpoint_row
from treg.testing.vendors.rules import PRICES, scrape_gateway


# -- the row, at startup ------------------------------------------------------------------------------

@pytest.mark.parametrize("rule, field", [
    ("error", "success"),
    ({"path": "error"}, "success.path"),
    ({"path": "error", "absent": True, "nonempty": True}, "success.path"),
    ({"absent": True}, "success.absent"),
    ({}, "success"),
    ({"path": "error", "absent": False}, "success.absent"),
    ({"path": "error", "nonempty": 1}, "success.nonempty"),
    ({"path": "x", "equals": {"a": 1}}, "success.equals"),
    ({"path": "x", "equals": float("nan")}, "success.equals"),
    ({"path": "a..b", "absent": True}, "success.path"),
    ({"path": "", "absent": True}, "success.path"),
    ({"status": [404], "path": "e", "absent": True}, "success.status"),
    ({"status": [], "path": "e", "absent": True}, "success.status"),
    ({"status": [200, 200]}, "success.status"),
    ({"status": [True]}, "success.status"),
    ({"path": "e", "absent": True, "when": 1}, "success.when"),
])
def test_a_bad_rule_stops_startup_naming_plugin_row_and_field(rule, field):
    problems = catalog_problems(lambda d: endpoint_row(d).update(success=rule))
    assert [(p.plugin, p.row, p.field) for p in problems] == [("acme-plugin", "endpoint 'acme.items.get'", field)]


def test_rules_hold_as_the_contract_says():
    def rule(raw):
        out = parse(raw, lambda field, message: pytest.fail(f"{field}: {message}"))
        assert isinstance(out, SuccessRule)
        return out

    absent = rule({"status": [200, 201], "path": "error", "absent": True})
    assert absent.holds(200, {"data": 1}) and absent.holds(201, {"error": None})
    assert not absent.holds(200, {"error": "quota"}) and not absent.holds(202, {"data": 1})
    assert not absent.holds(200, None)  # not JSON: a rule naming a path fails
    assert not absent.holds(500, {"data": 1})
    assert absent.holds(200, [1, 2])  # JSON, the path absent
    equals = rule({"path": "meta.status", "equals": "ok"})
    assert equals.holds(204, {"meta": {"status": "ok"}}) and not equals.holds(200, {"meta": {"status": "OK"}})
    assert not equals.holds(200, {"meta": {}})
    assert not rule({"path": "ok", "equals": 1}).holds(200, {"ok": True})  # JSON types, not Python's
    assert rule({"path": "ok", "equals": True}).holds(200, {"ok": True})
    nonempty = rule({"path": "data.items", "nonempty": True})
    assert nonempty.holds(200, {"data": {"items": [0]}}) and nonempty.holds(200, {"data": {"items": 0}})
    for empty in (None, "", [], {}):
        assert not nonempty.holds(200, {"data": {"items": empty}})
    assert not nonempty.holds(200, {"data": {}})
    status_only = rule({"status": [200]})
    assert status_only.holds(200, None) and not status_only.holds(201, {"a": 1})
    assert absent.to_json() == {"status": [200, 201], "path": "error", "absent": True}
    assert equals.to_json() == {"path": "meta.status", "equals": "ok"}


# -- over real sockets ----------------------------------------------------------------------------------

@pytest.fixture
async def scrape(aiohttp_client, make_app):
    async with scrape_gateway(aiohttp_client, make_app) as world:
        yield world


async def _balance(gw) -> dict:
    return await gw.api("GET", "/api/v1/balance", expect=200)


async def test_a_200_with_an_error_inside_costs_nothing_and_is_relayed_unchanged(scrape):
    gw, vendor, up = scrape
    answer = b'{"error": {"code": 402, "message": "out of credits"}, "data": null}\n'
    vendor.answer("/v1/search", 200, answer)
    reply = await gw.raw("GET", "/catalog/call/scrape.search?q=cats")
    assert reply.status == 200 and reply.body == answer  # the vendor's bytes, unchanged
    assert reply.header("X-Treg-Cost-Micro") == "0" and reply.header("X-Treg-Credential-Tier") == "platform"
    assert reply.header("X-Treg-Error") is None  # the vendor's answer, not treg's refusal
    call_id = reply.header("X-Treg-Call-Id")
    row = await audit_row(gw, call_id)
    assert row["outcome"] == "vendor_error" and row["blame"] == "upstream"
    assert row["hold_state"] == "released" and row["cost_micro"] == 0
    assert row["error_response"]["status"] == 200 and "out of credits" in row["error_response"]["body"]
    bal = await _balance(gw)
    assert bal["balance_micro"] == 100_000 and bal["held_micro"] == 0
    # a good answer of the same endpoint is charged
    vendor.answer("/v1/search", 200, {"data": ["a"]})
    r = await gw.call("GET", "/catalog/call/scrape.search?q=cats")
    assert r.status == 200 and r.headers["X-Treg-Cost-Micro"] == str(PRICES["scrape.search"])
    assert (await audit_row(gw, r.headers["X-Treg-Call-Id"]))["outcome"] == "ok"
    books = await check_books(gw.services, gw.org["org_id"])
    assert books["settled"] == PRICES["scrape.search"] and books["open"] == 0
    assert (await _balance(gw))["balance_micro"] == 100_000 - PRICES["scrape.search"]


async def test_without_a_rule_any_2xx_is_charged(scrape):
    gw, vendor, _ = scrape
    vendor.answer("/v1/plain", 200, {"error": "inside"})
    r = await gw.call("GET", "/catalog/call/scrape.plain")
    assert r.headers["X-Treg-Cost-Micro"] == str(PRICES["scrape.plain"])
    assert (await audit_row(gw, r.headers["X-Treg-Call-Id"]))["outcome"] == "ok"


@pytest.mark.parametrize("status, body, content_type, charged", [
    (200, {"status": "ok"}, "application/json", True),
    (200, {"status": "error"}, "application/json", False),
    (201, {"status": "ok"}, "application/json", False),  # not among the rule's statuses
    (200, b"<html>ok</html>", "text/html", False),  # not JSON: a rule naming a path fails
    (200, b"", None, False),
    (200, b"null", "application/json", False),
])
async def test_status_equals_and_answers_that_are_not_json(scrape, status, body, content_type, charged):
    gw, vendor, _ = scrape
    vendor.answer("/v1/status", status, body, content_type)
    r = await gw.call("GET", "/catalog/call/scrape.strict")
    assert r.status == status
    assert r.headers["X-Treg-Cost-Micro"] == (str(PRICES["scrape.strict"]) if charged else "0")
    row = await audit_row(gw, r.headers["X-Treg-Call-Id"])
    assert row["outcome"] == ("ok" if charged else "vendor_error")
    assert row["hold_state"] == ("settled" if charged else "released")
    await check_books(gw.services, gw.org["org_id"])


async def test_a_non_2xx_stays_an_upstream_error(scrape):
    gw, vendor, _ = scrape
    vendor.answer("/v1/search", 503, {"status": "down"})
    r = await gw.call("GET", "/catalog/call/scrape.search")
    assert r.status == 503 and r.headers["X-Treg-Cost-Micro"] == "0"
    assert (await audit_row(gw, r.headers["X-Treg-Call-Id"]))["outcome"] == "upstream_error"


async def test_the_rule_reads_a_spooled_answer(scrape):
    gw, vendor, _ = scrape
    media = "A" * 300_000
    vendor.answer("/v1/big", 200, {"error": "render failed", "usage": {"pages": 2}, "media": media})
    r = await gw.call("POST", "/catalog/call/scrape.big", json={})
    assert r.status == 200 and len(await r.read()) > 300_000
    assert r.headers["X-Treg-Cost-Micro"] == "0"
    vendor.answer("/v1/big", 200, {"usage": {"pages": 2}, "media": media})
    r = await gw.call("POST", "/catalog/call/scrape.big", json={})
    assert r.headers["X-Treg-Cost-Micro"] == "1000"
    await check_books(gw.services, gw.org["org_id"])


async def test_an_idempotent_replay_of_a_vendor_error_is_not_charged_either(scrape):
    gw, vendor, _ = scrape
    vendor.answer("/v1/search", 200, {"error": "busy"})
    first = await gw.call("GET", "/catalog/call/scrape.search", headers={"Idempotency-Key": "k1"})
    again = await gw.call("GET", "/catalog/call/scrape.search", headers={"Idempotency-Key": "k1"})
    assert await first.read() == await again.read()
    assert again.headers["X-Treg-Idempotent-Replay"] == "true" and again.headers["X-Treg-Cost-Micro"] == "0"
    assert (await check_books(gw.services, gw.org["org_id"]))["settled"] == 0


async def test_the_archive_never_stores_a_failing_answer(scrape):
    gw, vendor, up = scrape
    vendor.answer("/v1/cached", 200, {"error": "rate limited"})
    r = await gw.call("GET", "/catalog/call/scrape.cached?q=x")
    assert r.headers["X-Treg-Cache"] == "miss" and r.headers["X-Treg-Cost-Micro"] == "0"
    sent = len(up.exchanges)
    r = await gw.call("GET", "/catalog/call/scrape.cached?q=x")
    assert r.headers["X-Treg-Cache"] == "miss" and len(up.exchanges) == sent + 1  # nothing was stored
    vendor.answer("/v1/cached", 200, {"data": ["found"]})
    r = await gw.call("GET", "/catalog/call/scrape.cached?q=x")
    assert r.headers["X-Treg-Cache"] == "stored"
    r = await gw.call("GET", "/catalog/call/scrape.cached?q=x")
    assert r.headers["X-Treg-Cache"] == "hit" and json.loads(await r.read()) == {"data": ["found"]}
    assert len(up.exchanges) == sent + 2
    await check_books(gw.services, gw.org["org_id"])


async def test_the_archive_checks_the_rule_on_the_team_key_too(scrape):
    gw, vendor, up = scrape
    await gw.secret("team-key", provider="scrape")
    vendor.answer("/v1/cached", 200, {"error": "rate limited"})
    r = await gw.call("GET", "/catalog/call/scrape.cached?q=t")
    assert r.headers["X-Treg-Credential-Tier"] == "team" and r.headers["X-Treg-Cache"] == "miss"
    assert json.loads(await r.read()) == {"error": "rate limited"}
    vendor.answer("/v1/cached", 200, {"data": [2]})
    await gw.call("GET", "/catalog/call/scrape.cached?q=t")
    r = await gw.call("GET", "/catalog/call/scrape.cached?q=t")
    assert r.headers["X-Treg-Cache"] == "hit" and json.loads(await r.read()) == {"data": [2]}


async def test_a_submission_with_an_error_inside_starts_no_job(scrape):
    gw, vendor, _ = scrape
    vendor.answer("/v1/jobs", 200, {"error": "bad prompt", "data": {"task_id": "ghost"}})
    r = await gw.call("POST", "/catalog/call/scrape.jobs.create", json={})
    assert r.status == 200 and "X-Treg-Async" not in r.headers and r.headers["X-Treg-Cost-Micro"] == "0"
    # the id it named is no job of the org's: its poll on treg's key is refused
    r = await gw.call("GET", "/catalog/call/scrape.jobs.get?id=ghost")
    assert r.status == 403 and (await r.json())["error"] == "task_not_owned"
    await check_books(gw.services, gw.org["org_id"])


async def test_a_done_poll_with_an_error_inside_reads_failed(scrape):
    gw, vendor, _ = scrape
    jobs = []
    for _ in range(2):
        r = await gw.call("POST", "/catalog/call/scrape.jobs.create", json={})
        jobs.append((r.headers["X-Treg-Call-Id"], json.loads(r.headers["X-Treg-Async"])["task_id"]))
    assert (await _balance(gw))["held_micro"] == 2 * PRICES["scrape.jobs.create"]
    (failed_call, failed_task), (done_call, done_task) = jobs
    # a poll the caller could make fail (an error, no done status) frees nothing: the job stays open
    vendor.jobs[failed_task] = {"error": "unknown parameter"}
    await gw.call("GET", f"/catalog/call/scrape.jobs.get?id={failed_task}")
    assert (await _balance(gw))["held_micro"] == 2 * PRICES["scrape.jobs.create"]
    # done, with an error inside: failed, released
    vendor.jobs[failed_task] = {"status": "completed", "error": "render crashed"}
    await gw.call("GET", f"/catalog/call/scrape.jobs.get?id={failed_task}")
    vendor.jobs[done_task] = {"status": "completed", "result": "ok"}
    await gw.call("GET", f"/catalog/call/scrape.jobs.get?id={done_task}")
    assert (await audit_row(gw, failed_call))["hold_state"] == "released"
    assert (await audit_row(gw, done_call))["hold_state"] == "settled"
    books = await check_books(gw.services, gw.org["org_id"])
    assert books["settled"] == PRICES["scrape.jobs.create"] and books["open"] == 0


async def test_a_routed_child_failing_its_rule_passes_to_the_next(scrape):
    gw, vendor, _ = scrape
    vendor.answer("/v1/search", 200, {"error": "quota"})
    vendor.answer("/v1/search2", 200, {"data": ["from the dearer one"]})
    r = await gw.call("GET", "/catalog/call/treg.web.search?q=x")
    body = await r.json()
    assert r.status == 200, body
    assert body["output"] == {"data": ["from the dearer one"]} and body["_treg"]["endpoint"] == "scrape.search_dear"
    assert body["_treg"]["attempts"][0] == {"endpoint": "scrape.search", "status": 200, "error": "vendor_error"}
    assert r.headers["X-Treg-Cost-Micro"] == str(PRICES["scrape.search_dear"])
    books = await check_books(gw.services, gw.org["org_id"])
    assert books["settled"] == PRICES["scrape.search_dear"] and books["open"] == 0


async def test_the_rule_is_shown_on_the_endpoint(scrape):
    gw, _, _ = scrape
    detail = await gw.api("GET", "/api/v1/catalog/endpoints/scrape.strict", expect=200)
    assert detail["success"] == {"status": [200], "path": "status", "equals": "ok"}
    assert (await gw.api("GET", "/api/v1/catalog/endpoints/scrape.plain", expect=200))["success"] is None
