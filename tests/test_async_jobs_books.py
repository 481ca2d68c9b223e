"""An async job's money under a real database fault, and what the audit shows of it (spec lifecycle.md
"Async jobs"): a poll whose settlement cannot be written still relays the vendor's answer and the hold
is closed by the next poll or the reaper, exactly once; ``GET /api/v1/calls`` and the call's detail
show the same cost and hold state for a submission whose hold closed after its row was written. Over
real sockets: treg on 127.0.0.1, the fake vendor of treg/testing/vendors/async_jobs.py on another."""

from __future__ import annotations

import asyncio
import json

import pytest

from treg import membership, money
from treg.keys import SERVICES
from treg import reaper
from treg.settings import SecretStr
from treg.testing import Gateway, raw_upstream
from treg.testing import check_books
from treg.testing.vendors.async_jobs import PLATFORM_KEY, Vendor, write_plugin

SUBMIT = "/catalog/call/vidgen.videos.create"


@pytest.fixture
async def gw(make_app, aiohttp_client, tmp_path):
    vendor = Vendor()
    async with raw_upstream(vendor.respond) as up:
        app = make_app(plugins_dir=write_plugin(tmp_path / "plugins", up.url + "/v1"), ssrf_allow=("127.0.0.0/8",),
                       platform={"TREG_PLATFORM_KEY_VIDGEN": SecretStr(PLATFORM_KEY)}, hold_ttl_s=2,
                       reaper_interval_s=0)
        client = await aiohttp_client(app)
        svc = client.app[SERVICES]
        g = Gateway(client, await membership.create_org(svc, slug="org-a", email="a@a.test"))
        await money.grant(svc, org_id=g.org["org_id"], amount_micro=100_000, actor="test")
        g.vendor = vendor
        yield g
        await client.close()


async def _submit(gw) -> tuple[str, str]:
    r = await gw.call("POST", SUBMIT, json={"prompt": "a cat"})
    assert r.status == 200, await r.text()
    return r.headers["X-Treg-Call-Id"], json.loads(r.headers["X-Treg-Async"])["task_id"]


async def _poll(gw, task):
    r = await gw.call("GET", f"/catalog/call/vidgen.tasks.get?id={task}")
    return r, await r.json()


async def _fault_on_jobs(svc, on: bool) -> None:
    """A real database failure: every write of an async job's row raises (a trigger), so a poll's
    settlement transaction (the hold's close, then the job's mark) aborts as a whole."""
    async with svc.db.tx() as tx:
        if on:
            await tx.execute("CREATE FUNCTION treg_test_fault() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                             "RAISE EXCEPTION 'injected fault'; END $$")
            await tx.execute("CREATE TRIGGER treg_test_fault BEFORE UPDATE ON async_jobs "
                             "FOR EACH ROW EXECUTE FUNCTION treg_test_fault()")
        else:
            await tx.execute("DROP TRIGGER treg_test_fault ON async_jobs")
            await tx.execute("DROP FUNCTION treg_test_fault()")


async def _detail(gw, call_id):
    return await gw.api("GET", f"/api/v1/calls/{call_id}", expect=200)


async def _listed(gw, call_id):
    (row,) = [c for c in (await gw.api("GET", "/api/v1/calls", expect=200))["calls"] if c["call_id"] == call_id]
    return row


async def test_a_poll_whose_settlement_faults_relays_the_answer_and_the_next_poll_settles_once(gw, caplog):
    svc = gw.services
    call_id, task = await _submit(gw)
    gw.vendor.job(task).status = "completed"
    await _fault_on_jobs(svc, True)
    r, body = await _poll(gw, task)
    assert r.status == 200 and body["status"] == "completed"  # the vendor's answer, not a 503
    assert r.headers["X-Treg-Cost-Micro"] == "0" and "X-Treg-Error" not in r.headers
    assert "could not be settled from this poll" in caplog.text
    detail = await _detail(gw, call_id)
    assert (detail["hold_state"], detail["async"]["state"]) == ("held", "pending")  # nothing half-written
    assert (await check_books(svc, gw.org["org_id"]))["open"] == 1
    r, body = await _poll(gw, task)  # the fault goes on: still relayed, still open
    assert r.status == 200 and body["status"] == "completed"
    await _fault_on_jobs(svc, False)
    answers = await asyncio.gather(*(_poll(gw, task) for _ in range(4)))  # the next polls: closed once
    assert {r.status for r, _ in answers} == {200}
    detail = await _detail(gw, call_id)
    assert (detail["hold_state"], detail["cost_micro"], detail["async"]["state"]) == ("settled", 5000, "done")
    books = await check_books(svc, gw.org["org_id"])
    assert [(h["id"], h["state"], h["settled_micro"]) for h in books["holds"]] == [(call_id, "settled", 5000)]
    assert books["balance"] == 95_000


async def test_a_poll_that_faults_on_a_pending_job_is_relayed_and_the_reaper_closes_the_hold(gw):
    svc = gw.services
    call_id, task = await _submit(gw)
    await _fault_on_jobs(svc, True)  # the lease renewal of a running job's poll fails too
    r, body = await _poll(gw, task)
    assert r.status == 200 and body["status"] == "running"
    gw.vendor.job(task).status = "completed"
    r, body = await _poll(gw, task)
    assert r.status == 200 and body["status"] == "completed"
    await asyncio.sleep(2.2)  # past TREG_HOLD_TTL_S: nobody could settle it
    await _fault_on_jobs(svc, False)
    await reaper.run_once(svc)
    detail = await _detail(gw, call_id)
    assert (detail["hold_state"], detail["cost_micro"], detail["async"]["state"]) == ("released", 0, "expired")
    r, _ = await _poll(gw, task)  # a later done poll charges nothing: the hold closed once, released
    assert r.status == 200
    books = await check_books(svc, gw.org["org_id"])
    assert [(h["state"], h["settled_micro"]) for h in books["holds"]] == [("released", 0)]
    assert books["balance"] == 100_000 and (await _detail(gw, call_id))["async"]["state"] == "done"


async def test_the_call_list_and_the_detail_show_a_submission_s_cost_alike(gw):
    done_id, done = await _submit(gw)
    failed_id, failed = await _submit(gw)
    pending_id, _ = await _submit(gw)
    gw.vendor.job(done).status = "completed"
    gw.vendor.job(failed).status = "failed"
    await _poll(gw, done)
    await _poll(gw, failed)
    for call_id, cost, hold in ((done_id, 5000, "settled"), (failed_id, 0, "released"), (pending_id, 0, "held")):
        listed, detail = await _listed(gw, call_id), await _detail(gw, call_id)
        assert listed["cost_micro"] == detail["cost_micro"] == cost, (listed, detail)
        assert detail["hold_state"] == hold
        page = await gw.api("GET", "/api/v1/calls?kind=async_submit", expect=200)
        assert [c["cost_micro"] for c in page["calls"] if c["call_id"] == call_id] == [cost]
    listed = (await gw.api("GET", "/api/v1/calls", expect=200))["calls"]
    books = await check_books(gw.services, gw.org["org_id"])
    assert sum(c["cost_micro"] for c in listed) == books["settled"] == 5000  # the list sums to the charges
