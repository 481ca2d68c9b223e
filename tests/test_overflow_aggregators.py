"""The built-in aggregators against fake Orthogonal and Monid servers on 127.0.0.1, and overflow's budget
and health store against the real PostgreSQL."""

from __future__ import annotations

import logging
from datetime import timedelta

import aiohttp
import pytest
from aiohttp import web

from treg.overflow import aggregator as agg
from treg.overflow.aggregator import OverflowInput, OverflowRoute
from treg.overflow.store import OverflowStore
from treg.settings import SecretStr
from treg.testing import T0, Clock
from treg_plugins.aggregator_monid import Monid
from treg_plugins.aggregator_orthogonal import Orthogonal

KEY = SecretStr("sk-agg-secret-123")
CALL = OverflowInput(method="GET", path_params={"item_id": "a/b"}, query={"q": "x"}, body=None)


async def serve(aiohttp_server, handler_map):
    app = web.Application()
    seen: list[dict] = []

    async def record(request: web.Request, fn):
        seen.append({"method": request.method, "path": request.path, "auth": request.headers.get("Authorization"),
                     "json": await request.json() if request.can_read_body else None})
        return await fn(request)

    def recording(fn):
        async def handler(request):
            return await record(request, fn)
        return handler

    for (method, path), fn in handler_map.items():
        app.router.add_route(method, path, recording(fn))
    server = await aiohttp_server(app)
    return str(server.make_url("")), seen


def reply(status, body):
    async def handler(request):
        if isinstance(body, str):
            return web.Response(status=status, text=body, content_type="text/html")
        return web.json_response(body, status=status)
    return handler


ORTH_ROUTE = OverflowRoute("orthogonal", 12000, (("api", "acme"), ("path", "/items/{item_id}")))
MONID_ROUTE = OverflowRoute("monid", 15000, (("endpoint", "items-get"), ("provider", "acme")))


async def orth(aiohttp_server, status, body):
    url, seen = await serve(aiohttp_server, {("POST", "/v1/run"): reply(status, body)})
    async with aiohttp.ClientSession() as session:
        res = await Orthogonal().run(session, base_url=url, key=KEY, route=ORTH_ROUTE, call=CALL, poll_max_s=5)
    return res, seen


async def test_orthogonal_success_speaks_the_envelope(aiohttp_server, caplog):
    with caplog.at_level(logging.DEBUG):
        res, seen = await orth(aiohttp_server, 200, {"success": True, "price": "0.012", "data": {"id": 1},
                                                     "requestId": "r1"})
    assert res.ok and res.vendor_status == 200 and res.vendor_body == {"id": 1} and res.price_micro == 12000
    assert seen == [{"method": "POST", "path": "/v1/run", "auth": "Bearer sk-agg-secret-123",
                     "json": {"api": "acme", "path": "/items/a%2Fb", "query": {"q": "x"}}}]
    assert "sk-agg-secret-123" not in caplog.text


@pytest.mark.parametrize("status,code,kind", [(401, "UNAUTHORIZED", agg.UNAUTHORIZED),
                                              (402, "INSUFFICIENT_CREDITS", agg.WALLET),
                                              (429, "RATE_LIMITED", agg.RATE_LIMITED),
                                              (400, "BAD_REQUEST", agg.REFUSED), (404, "NOT_FOUND", agg.REFUSED),
                                              (422, "INVALID", agg.REFUSED)])
async def test_orthogonal_failures(aiohttp_server, status, code, kind):
    res, _ = await orth(aiohttp_server, status, {"success": False, "error": f"no: {code}", "code": code})
    assert res.failure == kind and res.message == f"no: {code}" and res.price_micro == 0
    assert res.marks_aggregator == (kind != agg.REFUSED)


async def test_orthogonal_upstream_error_carries_the_vendor_answer(aiohttp_server):
    res, _ = await orth(aiohttp_server, 502, {"success": False, "error": "upstream", "code": "UPSTREAM_ERROR",
                                              "upstreamStatus": 404, "data": {"error": "no item"}})
    assert res.ok and res.vendor_status == 404 and res.vendor_body == {"error": "no item"} and res.price_micro == 0
    res, _ = await orth(aiohttp_server, 502, {"success": False, "error": "upstream", "code": "UPSTREAM_ERROR",
                                              "upstreamStatus": 402, "data": {}})
    assert res.failure == agg.VENDOR_CAPACITY and not res.marks_aggregator


@pytest.mark.parametrize("status,body", [(200, "<html>not json</html>"), (500, {"oops": 1}), (503, "down"),
                                         (200, {"success": True, "data": {}})])
async def test_orthogonal_not_envelope(aiohttp_server, status, body):
    res, _ = await orth(aiohttp_server, status, body)
    assert res.failure == agg.NOT_ENVELOPE and res.marks_aggregator


async def test_transport_error_is_not_envelope():
    async with aiohttp.ClientSession() as session:
        res = await Orthogonal().run(session, base_url="http://127.0.0.1:9", key=KEY, route=ORTH_ROUTE, call=CALL,
                                     poll_max_s=2)
    assert res.failure == agg.NOT_ENVELOPE and res.aggregator_status is None


def completed(http_status=200, body=None, value=0.015):
    return {"runId": "run-1", "status": "COMPLETED", "providerResponse": {"httpStatus": http_status, "body": body},
            "cost": {"value": value, "currency": "USD"}}


async def monid(aiohttp_server, first, polls=(), poll_max_s=5.0):
    answers = list(polls)

    async def poll(request):
        status, body = answers.pop(0) if len(answers) > 1 else answers[0]
        return web.json_response(body, status=status)

    url, seen = await serve(aiohttp_server, {("POST", "/v1/run"): reply(*first), ("GET", "/v1/runs/{run_id}"): poll})
    async with aiohttp.ClientSession() as session:
        res = await Monid().run(session, base_url=url, key=KEY, route=MONID_ROUTE,
                                call=OverflowInput("POST", {"item_id": "7"}, {"q": "x"}, {"a": 1}), poll_max_s=poll_max_s)
    return res, seen


async def test_monid_200_completed(aiohttp_server):
    res, seen = await monid(aiohttp_server, (200, completed(201, {"ok": True})))
    assert res.ok and res.vendor_status == 201 and res.vendor_body == {"ok": True} and res.price_micro == 15000
    assert seen[0]["json"] == {"provider": "acme", "endpoint": "items-get",
                               "input": {"body": {"a": 1}, "queryParams": {"q": "x"}, "pathParams": {"item_id": "7"}}}
    assert seen[0]["auth"] == "Bearer sk-agg-secret-123"


async def test_monid_202_then_polling_to_completed(aiohttp_server):
    running = (200, {"runId": "run-1", "status": "RUNNING"})
    res, seen = await monid(aiohttp_server, (202, {"runId": "run-1", "status": "RUNNING"}),
                            polls=[running, running, (200, completed(200, [1, 2]))])
    assert res.ok and res.vendor_body == [1, 2]
    assert [s["path"] for s in seen] == ["/v1/run", "/v1/runs/run-1", "/v1/runs/run-1", "/v1/runs/run-1"]


@pytest.mark.parametrize("end,kind", [("FAILED", agg.NOT_ENVELOPE), ("TIMED_OUT", agg.NOT_ENVELOPE),
                                      ("STOPPED", agg.NOT_ENVELOPE), ("BLOCKED", agg.REFUSED)])
async def test_monid_202_then_an_unbilled_end(aiohttp_server, end, kind):
    res, _ = await monid(aiohttp_server, (202, {"runId": "run-1", "status": "RUNNING"}),
                         polls=[(200, {"runId": "run-1", "status": end})])
    assert res.failure == kind and res.price_micro == 0


async def test_monid_polling_is_bounded(aiohttp_server):
    res, seen = await monid(aiohttp_server, (202, {"runId": "run-1", "status": "RUNNING"}),
                            polls=[(200, {"runId": "run-1", "status": "RUNNING"})], poll_max_s=0.5)
    assert res.failure == agg.NOT_ENVELOPE and "0.5" in res.message
    assert 1 < len(seen) < 10


@pytest.mark.parametrize("status,kind", [(401, agg.UNAUTHORIZED), (402, agg.WALLET), (429, agg.RATE_LIMITED),
                                         (422, agg.REFUSED), (502, agg.VENDOR_CAPACITY), (500, agg.NOT_ENVELOPE)])
async def test_monid_failures(aiohttp_server, status, kind):
    res, _ = await monid(aiohttp_server, (status, {"error": {"message": "nope"}}))
    assert res.failure == kind and res.price_micro == 0


async def test_monid_not_json(aiohttp_server):
    res, _ = await monid(aiohttp_server, (200, "<html>"))
    assert res.failure == agg.NOT_ENVELOPE


def test_usd_to_micro_rounds_up_and_refuses_garbage():
    assert agg.usd_to_micro("0.012") == 12000 and agg.usd_to_micro(0.0000001) == 1
    assert agg.usd_to_micro("-1") is None and agg.usd_to_micro("x") is None and agg.usd_to_micro(True) is None


async def test_budget_per_utc_day(svc):
    clock = Clock(T0.replace(hour=23))
    store = OverflowStore(svc.db, svc.settings.replace(overflow_budgets={"ORTHOGONAL": 30000}), clock=clock)
    assert await store.within_budget("orthogonal", 30000)
    assert await store.record_spend("orthogonal", 12000) == 12000
    assert await store.record_spend("orthogonal", 12000) == 24000
    assert not await store.within_budget("orthogonal", 12000) and await store.within_budget("orthogonal", 6000)
    assert await store.within_budget("monid", 9_000_000)  # the documented default: USD 10
    clock.now += timedelta(hours=2)  # the next UTC day
    assert await store.spent_today("orthogonal") == 0


async def test_health_marks_aggregator_wide_or_per_vendor(svc):
    clock = Clock(T0.replace(hour=23))
    settings = svc.settings.replace(overflow_unhealthy_s=900, overflow_keys={"ORTHOGONAL": KEY, "MONID": KEY})
    store = OverflowStore(svc.db, settings, clock=clock)
    await store.mark_unhealthy("overflow:monid:acme", agg.VENDOR_CAPACITY)
    assert not await store.healthy("monid", "acme") and await store.healthy("monid", "beta")
    await store.mark_unhealthy("overflow:orthogonal", agg.WALLET)
    assert not await store.healthy("orthogonal", "beta")
    routes = (ORTH_ROUTE, MONID_ROUTE)
    assert await store.first_usable(routes, "acme") is None
    assert await store.first_usable(routes, "beta") == MONID_ROUTE
    clock.now += timedelta(seconds=901)
    assert await store.first_usable(routes, "acme") == ORTH_ROUTE
    no_key = OverflowStore(svc.db, svc.settings, clock=clock)
    assert await no_key.first_usable(routes, "acme") is None  # no TREG_OVERFLOW_KEY_*: skipped


async def test_monid_200_still_running_is_polled(aiohttp_server):
    res, seen = await monid(aiohttp_server, (200, {"runId": "run-1", "status": "RUNNING"}),
                            polls=[(200, completed(200, {"done": 1}))])
    assert res.ok and res.vendor_body == {"done": 1} and len(seen) == 2


def test_judge_an_aggregator_failure_is_data():
    from treg.capacity.signatures import Signature, SignatureRegistry
    from treg.call.overflow_outcome import judge

    sigs = SignatureRegistry((Signature(provider="acme", kind="balance", plugin="p", index=0, status=(402,),
                                        body_contains="insufficient credits"),))
    ok = judge("monid", "acme", "acme.items-get",
               agg.OverflowResult(vendor_status=200, vendor_body={"a": 1}, price_micro=15000), sigs)
    assert ok.serve and ok.charge_micro == 15000 and ok.mark is None
    vendor_404 = judge("monid", "acme", None, agg.OverflowResult(vendor_status=404, vendor_body={"e": 1}), sigs)
    assert vendor_404.serve and vendor_404.charge_micro == 0  # the vendor's own answer, relayed as it is
    out = judge("monid", "acme", None, agg.OverflowResult(vendor_status=403, vendor_body={"error": "Insufficient Credits"},
                                                          price_micro=15000), sigs)
    assert out.serve  # 403 is not the row's status: not capacity
    dry = judge("monid", "acme", None, agg.OverflowResult(vendor_status=402, vendor_body="insufficient credits",
                                                          price_micro=15000), sigs)
    assert (dry.serve, dry.charge_micro, dry.mark) == (False, 0, "overflow:monid:acme")
    relayed_402 = judge("orthogonal", "acme", None, agg.OverflowResult(agg.VENDOR_CAPACITY, vendor_status=402), sigs)
    assert relayed_402.mark == "overflow:orthogonal:acme" and not relayed_402.serve
    for kind in (agg.UNAUTHORIZED, agg.WALLET, agg.RATE_LIMITED, agg.NOT_ENVELOPE):
        v = judge("orthogonal", "acme", None, agg.OverflowResult(kind), sigs)
        assert (v.serve, v.mark, v.mark_reason, v.charge_micro) == (False, "overflow:orthogonal", kind, 0)
    refused = judge("orthogonal", "acme", None, agg.OverflowResult(agg.REFUSED, message="unknown api"), sigs)
    assert (refused.serve, refused.mark, refused.refused_message) == (False, None, "unknown api")


def test_vendor_bytes():
    assert agg.OverflowResult(vendor_body={"a": [1]}).vendor_bytes() == b'{"a":[1]}'
    assert agg.OverflowResult(vendor_body="text").vendor_bytes() == b"text"
    assert agg.OverflowResult(vendor_body=None).vendor_bytes() == b"null"
