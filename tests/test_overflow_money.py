"""Overflow money and pool discipline over real HTTP: a mixed run (direct, overflowed, refused, shadowed,
cancelled) settles to the micro-dollar with every hold closed once; no database connection is held while
an aggregator is awaited; an aggregator plugin dropped in TREG_PLUGINS_DIR is used without a core edit."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from treg import money
from treg.call import service
from treg.keys import SERVICES
from treg.settings import SecretStr
from treg.testing import Events, Gateway, call_input, make_settings
from treg.testing.vendors.overflow import AcmePlugin, Fake, make_world, serve, settings_for

pytestmark = pytest.mark.usefixtures("fake_dns")


def _vendor_by_item():
    """``ok-*``: 200; ``nf-*``: a caller-caused 404; everything else: treg's account is out (402)."""
    async def reply(request: web.Request, n: int) -> web.Response:
        item = request.path.rsplit("/", 1)[-1]
        if item.startswith("ok"):
            return web.json_response({"item": item})
        if item.startswith("nf"):
            return web.json_response({"error": "no such item"}, status=404)
        return web.json_response({"error": "insufficient credits"}, status=402)
    return reply


def _orth_by_item():
    """``refuse-*``: the aggregator refuses (422); ``slow-*``: answers after 5 s (the call is cancelled
    meanwhile); ``bad-*``: not an envelope; else served at 0.011 USD."""
    async def reply(request: web.Request, n: int) -> web.Response:
        path = (await request.json())["path"]
        if "refuse" in path:
            return web.json_response({"success": False, "error": "not allowed", "code": "INVALID"}, status=422)
        if "slow" in path:
            await asyncio.sleep(5)
        if "bad" in path:
            return web.Response(status=500, text="<html>")
        return web.json_response({"success": True, "price": "0.011", "data": {"path": path}, "requestId": "r"})
    return reply


async def test_money_after_a_mixed_run(make_app, aiohttp_server, aiohttp_client):
    w = await make_world(make_app, aiohttp_server, aiohttp_client)
    w.vendor.reply = _vendor_by_item()
    w.orth.reply = _orth_by_item()
    # a second treg process on the same database, in shadow mode, for the same org
    shadow_app = make_app(extra_plugins=(AcmePlugin(w.vendor.url + "/v1"), Events()),
                          **settings_for(w.vendor, w.orth, w.monid, overflow_mode="shadow"))
    shadow = Gateway(await aiohttp_client(shadow_app), w.gw.org)
    svc = w.svc
    org = w.gw.org

    plan = (["ok"] * 6 + ["nf"] * 3 + ["out"] * 8 + ["refuse"] * 3 + ["shadow"] * 4 + ["cancel-http"] * 2
            + ["cancel-task"] * 2)
    told: list[tuple[str, int, int]] = []

    async def via_http(i: int, kind: str) -> None:
        gw = shadow if kind == "shadow" else w.gw
        item = {"ok": "ok", "nf": "nf", "out": "out", "refuse": "refuse", "shadow": "out"}[kind] + f"-{i}"
        r = await gw.call("GET", f"/catalog/call/acme.items.get?item_id={item}")
        await r.read()
        told.append((kind, r.status, int(r.headers.get("X-Treg-Cost-Micro") or 0)))

    async def seen_by_aggregator(item: str) -> None:
        for _ in range(500):  # bounded: the call is cancelled while its aggregator is awaited
            if any((x["json"] or {}).get("path") == f"/items/{item}" for x in w.orth.seen):
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"{item} never reached the aggregator")

    async def via_http_cancelled(i: int) -> None:
        task = asyncio.create_task(w.gw.call("GET", f"/catalog/call/acme.items.get?item_id=slow-{i}"))
        await seen_by_aggregator(f"slow-{i}")
        task.cancel()  # the client hangs up: treg's handler is cancelled
        with pytest.raises(asyncio.CancelledError):
            await task

    async def via_task_cancelled(i: int) -> None:
        inp = call_input("acme.items.get", surface="catalog", raw_query=f"item_id=slow-t{i}",
                         token=org["token"])
        task = asyncio.create_task(service.execute(svc, inp))
        await seen_by_aggregator(f"slow-t{i}")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    jobs = []
    for i, kind in enumerate(plan):
        if kind == "cancel-http":
            jobs.append(via_http_cancelled(i))
        elif kind == "cancel-task":
            jobs.append(via_task_cancelled(i))
        else:
            jobs.append(via_http(i, kind))
    await asyncio.gather(*jobs)

    for _ in range(200):  # handlers whose client left are unwinding server-side
        async with svc.db.tx() as tx:
            still = await tx.scalar("SELECT count(*) FROM holds WHERE state = 'held'")
        if still == 0:
            break
        await asyncio.sleep(0.05)
    async with svc.db.tx() as tx:
        holds = await tx.fetch_all("SELECT id, state, amount_micro, settled_micro, closed_at FROM holds")
    assert holds and all(h["state"] in ("settled", "released") and h["closed_at"] is not None for h in holds)
    assert all(h["settled_micro"] == 0 for h in holds if h["state"] == "released")
    by_kind: dict[str, list[tuple[int, int]]] = {}
    for kind, status, cost in told:
        by_kind.setdefault(kind, []).append((status, cost))
    assert by_kind["ok"] == [(200, 2000)] * 6
    assert by_kind["nf"] == [(404, 0)] * 3
    assert by_kind["out"] == [(200, 11000)] * 8
    assert by_kind["refuse"] == [(402, 0)] * 3
    assert by_kind["shadow"] == [(402, 0)] * 4
    settled = sum(h["settled_micro"] for h in holds)
    assert settled == sum(cost for _, _, cost in told) == 6 * 2000 + 8 * 11000
    overflow_holds = [h for h in holds if h["id"].endswith(":overflow")]
    # 8 served + 3 refused + 4 cancelled (http and task); shadow places none
    assert len(overflow_holds) == 8 + 3 + 4
    assert sorted(h["state"] for h in overflow_holds) == ["released"] * 7 + ["settled"] * 8
    bal = await money.balance(svc, org["org_id"])
    assert bal.held_micro == 0 and bal.balance_micro == bal.granted_micro - settled
    # treg's spend at the aggregator: what it reported for the served calls and the shadow probes
    async with svc.db.tx() as tx:
        spent = await tx.scalar("SELECT spent_micro FROM overflow_spend WHERE aggregator = 'orthogonal'")
    assert spent == (8 + 4) * 11000
    rows = await w.rows()
    await shadow.services.audit.flush()
    rows = await w.rows()
    assert sum(r["cost_micro"] for r in rows.values()) == settled  # the audit trail agrees with the money
    cancelled = [r for r in rows.values() if r["id"].endswith(":overflow") and r["outcome"] == "cancelled"]
    assert len(cancelled) == 4 and all(r["hold_state"] == "released" for r in cancelled)
    await shadow.client.close()


async def test_no_connection_is_held_while_the_aggregator_is_awaited(make_app, aiohttp_server, aiohttp_client):
    n = 12
    arrived = 0
    all_in = asyncio.Event()

    async def orth(request: web.Request, k: int) -> web.Response:
        nonlocal arrived
        arrived += 1
        if arrived == n:
            all_in.set()
        try:
            await asyncio.wait_for(all_in.wait(), 10)
        except asyncio.TimeoutError:
            pass
        return web.json_response({"success": True, "price": "0.011", "data": {}, "requestId": "r"})

    w = await make_world(make_app, aiohttp_server, aiohttp_client, db_pool_max=2, db_pool_min=1)
    w.orth.reply = orth
    svc = w.svc
    aggregator = svc.aggregators["orthogonal"]
    real_run = aggregator.run
    boundary = []

    async def watched_run(*a, **kw):
        boundary.append(asyncio.current_task() in svc.db.holders)
        return await real_run(*a, **kw)

    aggregator.run = watched_run  # this app's instance only (the plugin's object, collected at startup)
    try:
        results = await asyncio.gather(*(w.call(f"item_id=i{i}") for i in range(n)))
    finally:
        del aggregator.run
    assert [r.status for r, _ in results] == [200] * n
    assert arrived == n and all_in.is_set(), f"only {arrived} overflow attempts were in flight at once with a pool of 2"
    assert boundary == [False] * n, "a task held a DB connection while its aggregator was awaited"
    assert svc.db.peak_in_use <= 2


THIRD_PARTY = '''
"""A third party's aggregator: RelayCo, its own envelope, nothing of treg's core edited."""
from treg import hookimpl
from treg.overflow.aggregator import Aggregator, OverflowResult, NOT_ENVELOPE, usd_to_micro
from treg.overflow.http import NOT_JSON, exchange


class RelayCo(Aggregator):
    name = "relayco"
    default_url = "https://relay.invalid"

    def check_route(self, route):
        return [] if isinstance(route.get("slug"), str) else [("slug", "must name the API at RelayCo")]

    async def run(self, session, *, base_url, key, route, call, poll_max_s):
        ex = await exchange(session, "POST", base_url + "/call", key,
                            {"slug": route.get("slug"), "query": dict(call.query), "path": dict(call.path_params)})
        if ex.status != 200 or ex.data is NOT_JSON:
            return OverflowResult(NOT_ENVELOPE, aggregator_status=ex.status)
        return OverflowResult(vendor_status=ex.data["status"], vendor_body=ex.data["body"],
                              price_micro=usd_to_micro(ex.data["usd"]), aggregator_status=ex.status)


@hookimpl
def treg_register_aggregators():
    return [RelayCo()]


@hookimpl
def treg_register_providers():
    return [{"id": "vendorz", "base_url": "VENDOR_URL", "auth": [{"location": "header", "name": "K"}],
             "endpoints": [{"id": "vendorz.get", "method": "GET", "path": "/get/{thing}",
                            "params": [{"name": "thing", "in": "path", "required": True}],
                            "price": {"per_call_micro": 5},
                            "overflow": [{"aggregator": "relayco", "slug": "vz", "price_micro": 70}]}]}]


@hookimpl
def treg_register_capacity_signatures():
    return [{"provider": "vendorz", "kind": "balance", "status": [402], "body_contains": "top up"}]
'''


async def test_a_third_party_aggregator_plugin_is_used_without_a_core_edit(tmp_path, dsn, fake_dns, aiohttp_server,
                                                                           aiohttp_client):
    from treg import membership
    from treg.app import create_app

    vendor = await serve(aiohttp_server, Fake(reply=(402, {}, {"error": "please top up"})))
    relay = await serve(aiohttp_server, Fake(reply=(200, {}, {"status": 200, "body": {"thing": "via relayco"},
                                                                "usd": "0.00007"})))
    plugdir = tmp_path / "plugins"
    plugdir.mkdir()
    (plugdir / "relayco.py").write_text(THIRD_PARTY.replace("VENDOR_URL", vendor.url))
    settings = make_settings(tmp_path / "home", plugins_dir=plugdir, dns_nameservers=(fake_dns.nameserver,),
                             ssrf_allow=("127.0.0.0/8",), platform={"TREG_PLATFORM_KEY_VENDORZ": SecretStr("pz")},
                             overflow_mode="on", overflow_keys={"RELAYCO": SecretStr("rk-secret")},
                             overflow_urls={"RELAYCO": relay.url})
    client = await aiohttp_client(create_app(settings, dsn=dsn))
    svc = client.app[SERVICES]
    org = await membership.create_org(svc, slug="zed", email="o@zed.test")
    await money.grant(svc, org_id=org["org_id"], amount_micro=1000, actor="test")
    r = await client.get("/catalog/call/vendorz.get?thing=t1", headers={"X-Treg-Token": org["token"]})
    assert r.status == 200 and json.loads(await r.read()) == {"thing": "via relayco"}
    assert r.headers["X-Treg-Served-Via"] == "overflow:relayco" and r.headers["X-Treg-Cost-Micro"] == "70"
    assert relay.seen == [{"method": "POST", "path": "/call", "auth": "Bearer rk-secret",
                           "json": {"slug": "vz", "query": {}, "path": {"thing": "t1"}}}]
    listed = await client.get("/api/v1/catalog/endpoints?provider=vendorz", headers={"X-Treg-Token": org["token"]})
    row = (await listed.json())["endpoints"][0]
    assert (row["overflow_aggregator"], row["overflow_price_micro"]) == ("relayco", 70)
    await client.close()
