"""Hub slots across two real ``treg serve`` processes on one PostgreSQL (docs/sharing.md "Hub"): the fifth
concurrent hub call of one publisher is refused at once, whichever process it reaches, and a tool's own
``max_runs`` binds first; a process killed (-9) between a hub call's answer and its hold's close leaves
both orgs' money as it was once the reaper released the hold, and its slot frees when the lease ends."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import psycopg2

from treg import membership, money, reaper
from treg.testing import (Api, assert_clean_exits, check_books, http_response, open_services, raw_upstream,
                          serve_pair, stop_all, treg_env)
from treg.testing.vendors.hub import SECRET, leaks

PRICE = 700
CREDITS = 100_000


class Gate:
    """An upstream that holds every request until released, counting those waiting."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.waiting = 0

    async def answer(self, ex):
        self.waiting += 1
        try:
            await self.open.wait()
        finally:
            self.waiting -= 1
        return http_response(200, json.dumps({"auth": ex.header("authorization")}).encode(),
                             [("Content-Type", "application/json")])

    async def until(self, n: int, bound: float = 30.0) -> None:
        deadline = time.monotonic() + bound
        while self.waiting < n:
            assert time.monotonic() < deadline, f"{self.waiting} of {n} requests reached the upstream"
            await asyncio.sleep(0.02)


async def _orgs(dsn, settings):
    svc = await open_services(dsn, settings)
    try:
        pub = await membership.create_org(svc, slug="pub", email="o@pub.test")
        callr = await membership.create_org(svc, slug="callr", email="o@callr.test")
        await money.grant(svc, org_id=callr["org_id"], amount_micro=CREDITS, actor="test")
        return pub, callr
    finally:
        await svc.db.close()


async def _publish(api: Api, token: str, upstream_url: str) -> dict[str, dict]:
    _, secret, _ = await api.req("POST", "/api/v1/secrets", token, 201, json={"name": "k", "value": SECRET})
    _, tool, _ = await api.req("POST", "/api/v1/tools", token, 201, json={
        "name": "search", "base_url": upstream_url + "/v1",
        "bindings": [{"location": "header", "name": "Authorization", "format": "Bearer {secret}",
                      "secret_id": secret["id"]}]})
    out = {}
    for name, max_runs in (("search", None), ("slow", 2)):
        _, out[name], _ = await api.req("POST", "/api/v1/hub/tools", token, 201, json={
            "tool_id": tool["id"], "name": name, "description": name, "price_micro": PRICE, "max_runs": max_runs})
    return out


def _env(tmp_path, dsn, settings, **extra):
    return treg_env(tmp_path / "home", dsn, TREG_SECRET_KEY=settings.secret_key.reveal(),
                    TREG_SSRF_ALLOW="127.0.0.0/8", **extra)


async def test_the_fifth_concurrent_hub_call_of_a_publisher_is_refused_at_once_across_two_processes(
        dsn, settings, tmp_path):
    pub, callr = await _orgs(dsn, settings)
    gate = Gate()
    async with raw_upstream(gate.answer) as up:
        a, b = await serve_pair(_env(tmp_path, dsn, settings), tmp_path)
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                A, B = Api(session, a.base), Api(session, b.base)
                await _publish(A, pub["token"], up.url)
                token = callr["token"]

                def call(api: Api, ref: str):
                    return asyncio.create_task(api.req("GET", f"/call/{ref}/q", token))

                running = [call(A, "pub.search"), call(B, "pub.search"), call(A, "pub.search"),
                           call(B, "pub.search")]
                await gate.until(4)
                for api in (A, B):  # one more, through either process: refused at once, not queued
                    t0 = time.monotonic()
                    status, body, headers = await api.req("GET", "/call/pub.search/q", token)
                    assert status == 429 and time.monotonic() - t0 < 10, (status, body)
                    assert body["error"] == "hub_busy" and body["active"] == 4 and body["limit"] == 4
                    assert body["retry_after_s"] >= 1 and headers["Retry-After"] == str(body["retry_after_s"])
                    assert headers["X-Treg-Cost-Micro"] == "0"
                assert gate.waiting == 4 and not any(t.done() for t in running)
                gate.open.set()
                done = await asyncio.gather(*running)
                assert [s for s, _, _ in done] == [200] * 4
                assert all(leaks(json.dumps(body)) == [] for _, body, _ in done)
                gate.open.clear()
                await _until_no_runs(dsn)
                # the tool's own max_runs (2) refuses first; the org's 4 still counts both tools
                running = [call(A, "pub.slow"), call(B, "pub.slow"), call(A, "pub.search"), call(B, "pub.search")]
                await gate.until(4)
                status, body, _ = await B.req("GET", "/call/pub.slow/q", token)
                assert (status, body["limit"], body["active"]) == (429, 2, 2), body
                status, body, _ = await A.req("GET", "/call/pub.search/q", token)
                assert (status, body["limit"], body["active"]) == (429, 4, 4), body
                gate.open.set()
                assert [s for s, _, _ in await asyncio.gather(*running)] == [200] * 4
                await _until_no_runs(dsn)
        finally:
            codes = await stop_all(a, b)
    assert_clean_exits(codes, a, b)
    svc = await open_services(dsn, settings)
    try:
        caller_books = await check_books(svc, callr["org_id"])
        publisher_books = await check_books(svc, pub["org_id"])
        assert caller_books["settled"] == 8 * PRICE and caller_books["open"] == 0
        assert publisher_books["granted"] == 8 * PRICE
    finally:
        await svc.db.close()


async def _until_no_runs(dsn: str, bound: float = 10.0) -> None:
    deadline = time.monotonic() + bound
    while _scalar(dsn, "SELECT count(*) FROM hub_runs") != 0:
        assert time.monotonic() < deadline, "hub slots were not given back"
        await asyncio.sleep(0.05)


#: a database fault at the close: the publisher's earning refused, so the whole closing statement fails
FAULT = """
CREATE OR REPLACE FUNCTION treg_test_fault() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN RAISE EXCEPTION 'injected fault at close'; END $$;
CREATE TRIGGER treg_test_fault BEFORE INSERT ON credit_grants FOR EACH ROW WHEN (NEW.kind = 'earning')
    EXECUTE FUNCTION treg_test_fault();
"""


async def _rows(svc, call_id: str):
    async with svc.db.tx() as tx:
        return await tx.fetch_all("SELECT org_id, hold_state, cost_micro, hub_caller_org FROM calls WHERE id = %(c)s",
                                  {"c": call_id})


def _execute(dsn: str, sql: str) -> None:
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql)
    finally:
        conn.close()


def _scalar(dsn: str, query: str, *args):
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(query, args)
            return cur.fetchone()[0]
    finally:
        conn.close()


async def test_kill_9_between_the_answer_and_the_close_moves_neither_orgs_money(dsn, settings, tmp_path):
    pub, callr = await _orgs(dsn, settings)
    gate = Gate()
    async with raw_upstream(gate.answer) as up:
        a, b = await serve_pair(_env(tmp_path, dsn, settings, TREG_HUB_LEASE_S="2", TREG_REAPER_INTERVAL_S="0"),
                                tmp_path)
        try:
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                A, B = Api(session, a.base), Api(session, b.base)
                refs = await _publish(A, pub["token"], up.url)
                # the close of a hub hold fails at the database (its credit refused), so it cannot be written
                # while the answer leaves: the killed process never closed it
                _execute(dsn, FAULT)
                call = asyncio.create_task(A.req("GET", "/call/pub.slow/q", callr["token"]))
                await gate.until(1)  # the hold is placed, the slot taken: the upstream has the request
                gate.open.set()
                status, body, headers = await call
                assert status == 200 and headers["X-Treg-Cost-Micro"] == str(PRICE)  # the answer left
                killed = headers["X-Treg-Call-Id"]
                await asyncio.sleep(0.5)  # the settler tried (and failed) meanwhile
                assert _scalar(dsn, "SELECT state FROM holds WHERE id = %s", headers["X-Treg-Call-Id"]) == "held"
                # two more calls of the tool (max_runs 2) in flight on the same process when it dies
                gate.open.clear()
                inflight = [asyncio.create_task(A.req("GET", "/call/pub.slow/q", callr["token"])) for _ in range(2)]
                await gate.until(2)
                a.signal(9)  # kill -9: between the first call's answer and its close, the others mid-flight
                a.wait(30)
                await asyncio.gather(*inflight, return_exceptions=True)
                _execute(dsn, "DROP TRIGGER treg_test_fault ON credit_grants")
                # the dead process's slots count until their lease ends (nobody renews them), then free
                assert _scalar(dsn, "SELECT count(*) FROM hub_runs WHERE hub_tool_id = %s", refs["slow"]["id"]) == 2
                status, body, _ = await B.req("GET", "/call/pub.slow/q", callr["token"])
                assert (status, body["error"], body["active"]) == (429, "hub_busy", 2)
                await asyncio.sleep(2.5)
                gate.open.set()
                status, _, headers = await B.req("GET", "/call/pub.slow/q", callr["token"])
                assert status == 200
                second = headers["X-Treg-Call-Id"]
        finally:
            codes = await stop_all(a, b)
    assert codes[1] == 0
    svc = await open_services(dsn, settings)
    try:
        released = await reaper.reap_orphans(svc, older_than_s=0)  # the reaper's run, now
        assert released == 3
        caller_books = await check_books(svc, callr["org_id"])
        publisher_books = await check_books(svc, pub["org_id"])
        # only B's call moved money: the killed process's holds released, its publisher credited nothing
        assert caller_books["settled"] == PRICE and publisher_books["granted"] == PRICE
        assert (await money.balance(svc, callr["org_id"])).balance_micro == CREDITS - PRICE
        # the audit says so: the caller's row of the killed call charged nothing; the publisher's is untouched
        rows = {r["org_id"]: r for r in await _rows(svc, killed)}
        assert (rows[callr["org_id"]]["hold_state"], rows[callr["org_id"]]["cost_micro"]) == ("released", 0)
        assert (rows[pub["org_id"]]["hold_state"], rows[pub["org_id"]]["hub_caller_org"]) == (None, "callr")
        earnings = _scalar(dsn, "SELECT count(*) FROM credit_grants WHERE kind = 'earning'")
        assert earnings == 1 and _scalar(dsn, "SELECT state FROM holds WHERE id = %s", second) == "settled"
    finally:
        await svc.db.close()
