"""Async jobs on the platform tier (spec lifecycle.md "Async jobs"), over real HTTP hops: treg on a
127.0.0.1 socket, the fake vendor of treg/testing/vendors/async_jobs.py on another, declared by a
third-party plugin file in TREG_PLUGINS_DIR, two orgs sharing treg's one vendor account."""

from __future__ import annotations

import asyncio
import json

import pytest
from sqlalchemy import select

from treg import membership, money
from treg.infra.schema import async_jobs, holds
from treg.keys import SERVICES
from treg import reaper
from treg.settings import SecretStr
from treg.testing import Events, Gateway, check_books, open_org, raw_upstream
from treg.testing.vendors.async_jobs import PLATFORM_KEY, Vendor, write_plugin

SUBMIT = "/catalog/call/vidgen.videos.create"
RENDER = "/catalog/call/vidgen.render"


class World:
    def __init__(self, a: Gateway, b: Gateway, vendor: Vendor, up, events: Events | None = None) -> None:
        self.a, self.b, self.vendor, self.up, self.events = a, b, vendor, up, events

    @property
    def svc(self):
        return self.a.services

    async def submit(self, gw: Gateway | None = None, path: str = SUBMIT, body: dict | None = None, **kw):
        return await (gw or self.a).call("POST", path, json=body or {"prompt": "a cat"}, **kw)

    async def poll(self, task_id: str, gw: Gateway | None = None, **kw):
        return await (gw or self.a).call("GET", f"/catalog/call/vidgen.tasks.get?id={task_id}", **kw)

    async def fetch(self, file_id: str, gw: Gateway | None = None, **kw):
        return await (gw or self.a).call("GET", f"/catalog/call/vidgen.files.get?id={file_id}", **kw)

    async def balance(self, gw: Gateway | None = None):
        return await (gw or self.a).api("GET", "/api/v1/balance", expect=200)

    async def detail(self, call_id: str, gw: Gateway | None = None):
        return await (gw or self.a).api("GET", f"/api/v1/calls/{call_id}", expect=200)

    async def holds_of(self, gw: Gateway | None = None):
        async with self.svc.db.tx() as tx:
            return await tx.fetch_all(select(holds).where(holds.c.org_id == (gw or self.a).org["org_id"]))

    async def job_rows(self):
        async with self.svc.db.tx() as tx:
            return await tx.fetch_all(select(async_jobs).order_by(async_jobs.c.created_at))


@pytest.fixture
async def world(aiohttp_client, make_app, tmp_path):
    vendor, events = Vendor(), Events()
    async with raw_upstream(vendor.respond) as up:
        app = make_app((events,), plugins_dir=write_plugin(tmp_path / "plugins", up.url + "/v1"),
                       ssrf_allow=("127.0.0.0/8",), platform={"TREG_PLATFORM_KEY_VIDGEN": SecretStr(PLATFORM_KEY)})
        client = await aiohttp_client(app)
        a = await open_org(client, "org-a", "a@a.test", credits=100_000)
        b = await open_org(client, "org-b", "b@b.test", credits=100_000)
        yield World(a, b, vendor, up, events)
        await client.close()


async def _submitted(w: World, path: str = SUBMIT, gw: Gateway | None = None) -> tuple[str, str]:
    r = await w.submit(gw, path)
    assert r.status == 200, await r.text()
    return r.headers["X-Treg-Call-Id"], json.loads(r.headers["X-Treg-Async"])["task_id"]


async def test_the_provider_comes_from_a_plugin_file(world):
    ep = world.svc.catalog.get("vidgen.videos.create")
    assert ep.plugin.startswith("dir:") and ep.async_job.poll == "vidgen.tasks.get"
    assert world.svc.catalog.get("vidgen.tasks.get").async_job.kind == "poll"
    listed = await world.a.api("GET", "/api/v1/catalog/endpoints/vidgen.videos.create", expect=200)
    assert listed["async"]["price_on"] == "done"


async def test_submission_leaves_the_hold_open_then_a_done_poll_settles_it_once(world):
    w = world
    r = await w.submit()
    body = await r.json()
    assert r.status == 200 and body == {"data": {"task_id": "t1"}}
    assert json.loads(r.headers["X-Treg-Async"]) == {"task_id": "t1", "poll": "vidgen.tasks.get",
                                                     "fetch": "vidgen.files.get"}
    assert "X-Treg-Cost-Micro" not in r.headers and r.headers["X-Treg-Credential-Tier"] == "platform"
    assert w.up.last.header("Authorization") == f"Bearer {PLATFORM_KEY}"
    call_id = r.headers["X-Treg-Call-Id"]
    bal = await w.balance()
    assert bal["held_micro"] == 5000 and bal["balance_micro"] == 100_000
    detail = await w.detail(call_id)
    assert detail["hold_state"] == "held" and detail["async"]["task_id"] == "t1"
    assert detail["async"]["state"] == "pending" and detail["kind"] == "async_submit"

    p = await w.poll("t1")  # still running: free, the hold stays
    assert p.status == 200 and (await p.json())["status"] == "running" and p.headers["X-Treg-Cost-Micro"] == "0"
    assert (await w.balance())["held_micro"] == 5000
    w.vendor.job("t1").status = "completed"
    for _ in range(3):
        p = await w.poll("t1")
        assert p.status == 200 and p.headers["X-Treg-Cost-Micro"] == "0"
    bal = await w.balance()
    assert bal["balance_micro"] == 95_000 and bal["held_micro"] == 0
    detail = await w.detail(call_id)
    assert detail["hold_state"] == "settled" and detail["cost_micro"] == 5000
    assert detail["async"]["state"] == "done" and detail["async"]["fetch_ids"] == ["f-t1"]
    # polls are diagnostic rows: out of the list unless asked for, cost 0, no hold of their own
    listed = await w.a.api("GET", "/api/v1/calls", expect=200)
    assert [c["call_id"] for c in listed["calls"]] == [call_id]
    polls = (await w.a.api("GET", "/api/v1/calls?kind=async_poll", expect=200))["calls"]
    assert len(polls) == 4 and {c["kind"] for c in polls} == {"async_poll"} and {c["cost_micro"] for c in polls} == {0}
    assert (await w.a.api("GET", "/api/v1/calls?kind=bogus", expect=400))["error"] == "invalid_filter"
    books = await check_books(w.svc, w.a.org["org_id"])
    assert [(h["id"], h["state"], h["settled_micro"]) for h in books["holds"]] == [(call_id, "settled", 5000)]
    assert [e["kind"] for e in w.events.tool_called] == ["async_submit"] + ["async_poll"] * 4


async def test_a_failed_job_releases_the_hold(world):
    w = world
    call_id, task = await _submitted(w)
    w.vendor.job(task).status = "cancelled"
    assert (await w.poll(task)).status == 200
    bal = await w.balance()
    assert bal["balance_micro"] == 100_000 and bal["held_micro"] == 0
    detail = await w.detail(call_id)
    assert detail["hold_state"] == "released" and detail["cost_micro"] == 0 and detail["async"]["state"] == "failed"
    w.vendor.job(task).status = "completed"  # a vendor changing its mind later charges nothing
    await w.poll(task)
    assert (await w.balance())["balance_micro"] == 100_000
    books = await check_books(w.svc, w.a.org["org_id"])
    assert [(h["state"], h["settled_micro"]) for h in books["holds"]] == [("released", 0)]


async def test_a_usage_price_reads_the_done_poll(world):
    w = world
    call_id, task = await _submitted(w, RENDER)
    assert (await w.balance())["held_micro"] == 9000  # the estimate
    w.vendor.job(task).status = "completed"
    await w.poll(task)  # done but no meter yet: the hold stays open for a poll that has it
    assert (await w.balance())["held_micro"] == 9000 and (await w.detail(call_id))["hold_state"] == "held"
    w.vendor.job(task).seconds = 42
    await w.poll(task)
    bal = await w.balance()
    assert bal["balance_micro"] == 100_000 - 4200 and bal["held_micro"] == 0
    assert (await w.detail(call_id))["cost_micro"] == 4200
    books = await check_books(w.svc, w.a.org["org_id"])
    assert [(h["state"], h["settled_micro"]) for h in books["holds"]] == [("settled", 4200)]


async def test_price_on_submit_charges_at_once_and_the_job_is_still_owned(world):
    w = world
    r = await w.submit(path="/catalog/call/vidgen.thumbs.create")
    assert r.status == 200 and r.headers["X-Treg-Cost-Micro"] == "700"
    task = json.loads(r.headers["X-Treg-Async"])["task_id"]
    assert (await w.detail(r.headers["X-Treg-Call-Id"]))["hold_state"] == "settled"
    assert (await w.poll(task, w.b)).status == 403  # still org A's job
    w.vendor.job(task).status = "completed"
    assert (await w.poll(task)).status == 200
    assert (await w.detail(r.headers["X-Treg-Call-Id"]))["async"]["state"] == "done"
    bal = await w.balance()
    assert bal["balance_micro"] == 100_000 - 700 and bal["held_micro"] == 0


async def test_concurrent_done_polls_settle_exactly_once(world):
    w = world
    call_id, task = await _submitted(w)
    w.vendor.job(task).status = "completed"
    answers = await asyncio.gather(*(w.poll(task) for _ in range(8)))
    assert {r.status for r in answers} == {200}
    bal = await w.balance()
    assert bal["balance_micro"] == 95_000 and bal["held_micro"] == 0
    books = await check_books(w.svc, w.a.org["org_id"])
    assert [(h["state"], h["settled_micro"]) for h in books["holds"]] == [("settled", 5000)]


async def test_a_job_nobody_polls_is_released_by_the_reaper_and_marked(aiohttp_client, make_app, tmp_path):
    vendor = Vendor()
    async with raw_upstream(vendor.respond) as up:
        app = make_app(plugins_dir=write_plugin(tmp_path / "plugins", up.url + "/v1"), ssrf_allow=("127.0.0.0/8",),
                       platform={"TREG_PLATFORM_KEY_VIDGEN": SecretStr(PLATFORM_KEY)}, hold_ttl_s=1,
                       reaper_interval_s=0)
        client = await aiohttp_client(app)
        svc = client.app[SERVICES]
        gw = Gateway(client, await membership.create_org(svc, slug="org-a", email="a@a.test"))
        await money.grant(svc, org_id=gw.org["org_id"], amount_micro=100_000, actor="test")
        w = World(gw, gw, vendor, up)
        polled_id, polled = await _submitted(w)
        idle_id, _ = await _submitted(w)
        await asyncio.sleep(0.7)
        assert (await w.poll(polled)).status == 200  # a pending poll renews its job's lease
        await asyncio.sleep(0.6)
        await reaper.run_once(svc)
        assert (await w.detail(idle_id))["hold_state"] == "released"
        assert (await w.detail(idle_id))["async"]["state"] == "expired"
        assert (await w.detail(polled_id))["hold_state"] == "held"
        await asyncio.sleep(1.1)
        await reaper.run_once(svc)  # now nobody polled it for the TTL either
        detail = await w.detail(polled_id)
        assert detail["hold_state"] == "released" and detail["async"]["state"] == "expired"
        vendor.job(polled).status = "completed"  # finishing after its release charges nothing
        await w.poll(polled)
        assert (await w.detail(polled_id))["async"]["state"] == "done"
        bal = await w.balance()
        assert bal["balance_micro"] == 100_000 and bal["held_micro"] == 0
        books = await check_books(svc, gw.org["org_id"])
        assert sorted(h["state"] for h in books["holds"]) == ["released", "released"]
        await client.close()


async def test_polls_and_fetches_of_ids_not_owned_are_refused_without_vendor_io(world):
    w = world
    _, task = await _submitted(w)  # org A's job
    w.vendor.job(task).status = "completed"
    await w.poll(task)  # org A learns f-t1
    seen = len(w.up.exchanges)
    bodies = []
    for r in (await w.poll(task, w.b), await w.poll("t999", w.b), await w.poll("t999"),
              await w.fetch("f-" + task, w.b), await w.fetch("f-nope"), await w.fetch(task)):
        assert r.status == 403 and r.headers["X-Treg-Error"] == "1"
        bodies.append(await r.json())
    assert {b["error"] for b in bodies} == {"task_not_owned"} and {b["blame"] for b in bodies} == {"caller"}
    assert bodies[0] == bodies[1] == bodies[2]  # another org's id and an unknown one: the same answer
    assert bodies[3] == bodies[4] == bodies[5]
    assert len(w.up.exchanges) == seen  # the vendor heard nothing
    rows = (await w.b.api("GET", "/api/v1/calls?kind=async_poll", expect=200))["calls"]
    assert rows == []  # a refused read is no poll: it is an ordinary refused row
    refused = (await w.b.api("GET", "/api/v1/calls", expect=200))["calls"]
    assert {c["refused_by"] for c in refused} == {"ownership"} and {c["status"] for c in refused} == {403}
    # an id given twice could reach the vendor as the other one: refused before any lookup
    r = await w.a.call("GET", f"/catalog/call/vidgen.tasks.get?id={task}&id=t999")
    assert r.status == 400 and len(w.up.exchanges) == seen
    assert (await w.balance(w.b))["held_micro"] == 0


async def test_an_owned_fetch_is_free_streamed_whole_with_range_and_never_replayed(world):
    w = world
    w.vendor.file_size = 9 * 1024 * 1024 + 7  # more than treg ever buffers (8 MiB): it can only stream
    _, task = await _submitted(w)
    w.vendor.job(task).status = "completed"
    await w.poll(task)
    r = await w.fetch("f-" + task, headers={"Idempotency-Key": "dl-1"})
    data = await r.read()
    assert r.status == 200 and data == w.vendor.job(task).data and r.headers["X-Treg-Cost-Micro"] == "0"
    r = await w.fetch("f-" + task, headers={"Range": "bytes=10-19", "Idempotency-Key": "dl-1"})
    assert r.status == 206 and await r.read() == w.vendor.job(task).data[10:20]
    assert r.headers["Content-Range"] == f"bytes 10-19/{w.vendor.file_size}"
    assert "X-Treg-Idempotent-Replay" not in r.headers
    assert w.up.last.header("Range") == "bytes=10-19"
    fetches = (await w.a.api("GET", "/api/v1/calls?kind=async_fetch", expect=200))["calls"]
    assert len(fetches) == 2 and {c["cost_micro"] for c in fetches} == {0}
    books = await check_books(w.svc, w.a.org["org_id"])
    assert len(books["holds"]) == 1 and books["open"] == 0  # the submission's, settled; fetches hold nothing


async def test_a_poll_is_never_replayed_from_an_idempotency_key(world):
    w = world
    _, task = await _submitted(w)
    first = await w.poll(task, headers={"Idempotency-Key": "poll-1"})
    w.vendor.job(task).status = "completed"
    second = await w.poll(task, headers={"Idempotency-Key": "poll-1"})
    assert (await first.json())["status"] == "running" and (await second.json())["status"] == "completed"
    assert "X-Treg-Idempotent-Replay" not in second.headers
    assert sum(1 for ex in w.up.exchanges if ex.target.startswith("/v1/tasks/")) == 2
    assert (await w.balance())["balance_micro"] == 95_000


async def test_an_idempotent_replay_of_a_submission_carries_x_treg_async(world):
    w = world
    r1 = await w.submit(headers={"Idempotency-Key": "sub-1"})
    r2 = await w.submit(headers={"Idempotency-Key": "sub-1"})
    assert r2.headers["X-Treg-Idempotent-Replay"] == "true"
    assert json.loads(r2.headers["X-Treg-Async"]) == json.loads(r1.headers["X-Treg-Async"])
    assert w.vendor.submissions == 1 and (await w.balance())["held_micro"] == 5000
    assert len(await w.job_rows()) == 1


async def test_a_2xx_that_is_no_accepted_submission_settles_at_zero(world):
    w = world
    r = await w.submit(body={"reject": True})
    assert r.status == 200 and "X-Treg-Async" not in r.headers and r.headers["X-Treg-Cost-Micro"] == "0"
    detail = await w.detail(r.headers["X-Treg-Call-Id"])
    assert detail["hold_state"] == "settled" and detail["cost_micro"] == 0 and "async" not in detail
    assert await w.job_rows() == []
    bal = await w.balance()
    assert bal["balance_micro"] == 100_000 and bal["held_micro"] == 0


async def test_a_job_that_cannot_be_recorded_releases_its_hold(world, monkeypatch):
    from treg.errors import DatabaseError
    from treg.jobs import store

    async def broken(*args, **kw):
        raise DatabaseError("the database went away", code="database_unavailable")

    monkeypatch.setattr(store, "record", broken)
    r = await world.submit()
    assert r.status == 200 and "X-Treg-Async" not in r.headers and r.headers["X-Treg-Cost-Micro"] == "0"
    bal = await world.balance()
    assert bal["balance_micro"] == 100_000 and bal["held_micro"] == 0


async def test_own_and_team_tiers_relay_faithfully(world):
    w = world
    await w.b.secret("org-b-own-vidgen-key", name="vidgen", provider="vidgen")
    _, task = await _submitted(w)  # org A's job on treg's key
    seen = len(w.up.exchanges)
    r = await w.poll(task, w.b)  # org B polls on its own account: its business, relayed as is
    assert r.status == 200 and r.headers["X-Treg-Credential-Tier"] == "team"
    assert len(w.up.exchanges) == seen + 1 and w.up.last.header("Authorization") == "Bearer org-b-own-vidgen-key"
    r = await w.submit(w.b)
    assert r.status == 200 and "X-Treg-Async" not in r.headers and r.headers["X-Treg-Cost-Micro"] == "0"
    assert len(await w.job_rows()) == 1  # only org A's platform-tier job
    w.vendor.job(task).status = "completed"
    await w.poll(task, w.b)  # a team-tier poll settles nothing of treg's
    assert (await w.balance())["held_micro"] == 5000


async def test_a_pinned_poll_reads_only_jobs_submitted_with_its_tag(world):
    """The seed's pinned predicates: a poll carrying an ``X-Treg-Tag`` must match the submission's tag;
    an unknown, another org's or another tag's id is one 404 ``task_not_found``, and the vendor hears
    nothing. An unpinned poll still reads the org's job."""
    w = world
    r = await w.submit(headers={"X-Treg-Tag": "customer-1"})
    assert r.status == 200, await r.text()
    task = json.loads(r.headers["X-Treg-Async"])["task_id"]
    _, other = await _submitted(w)  # the same org, no tag
    _, foreign = await _submitted(w, gw=w.b)
    seen = len(w.up.exchanges)
    bodies = []
    for tid, gw in ((other, None), (foreign, w.b), (foreign, None), ("t999", None)):
        r = await w.poll(tid, gw, headers={"X-Treg-Tag": "customer-1" if gw is None else "customer-9"})
        assert r.status == 404 and r.headers["X-Treg-Error"] == "1"
        bodies.append(await r.json())
    assert {b["error"] for b in bodies} == {"task_not_found"}
    assert len(w.up.exchanges) == seen
    r = await w.poll(task, headers={"X-Treg-Tag": "customer-2"})
    assert r.status == 404
    assert (await w.poll(task, headers={"X-Treg-Tag": "customer-1"})).status == 200
    assert (await w.poll(task)).status == 200  # unpinned: the org's job
    assert len(w.up.exchanges) == seen + 2
