"""A job's poll and fetch endpoints, price and task parameter are frozen at submission (spec lifecycle.md
"Async jobs"): a plugin update that drops or changes the ``async`` descriptor changes neither who may
read a pending job nor what it costs. Proven with a second catalog on restart (two served apps in
sequence on one database) and with two catalogs served at once (a rolling deploy), over real sockets:
treg on 127.0.0.1, the fake vendor of treg/testing/vendors/async_jobs.py on another, two orgs on treg's one account."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from sqlalchemy import select, text

from treg import membership, money
from treg.infra import migrate
from treg.infra.schema import async_job_utilities, async_jobs
from treg.keys import SERVICES
from treg.settings import SecretStr
from treg.testing import Gateway, raw_upstream
from treg.testing import assert_schema_matches, assert_up_down_up, check_books, empty_database
from treg.testing.vendors.async_jobs import PLATFORM_KEY, PLUGIN, Vendor

SUBMIT = "/catalog/call/vidgen.videos.create"


def _dropped(archived: bool = False) -> str:
    """The plugin's next version: no async descriptor any more, and the submission dearer (``archived``:
    the former poll endpoint now declares an archive, which startup allows on an ordinary row)."""
    text = re.sub(r',\s*"async": (ASYNC|dict\(ASYNC, price_on="submit"\))', "", PLUGIN)
    text = text.replace('"per_call_micro": 5000', '"per_call_micro": 9000')
    if archived:
        row = '{{"id": "vidgen.tasks.get", '
        text = text.replace(row, row + '"archive": {{"ttl_s": 600}}, ')
        assert '"archive"' in text
    assert '"async"' not in text
    return text


def _changed() -> str:
    """The plugin's next version: other done statuses, no fetch, a dearer submission."""
    text = PLUGIN.replace('"fetch": "vidgen.files.get", ', "").replace('"result_id_path": "result.file_id", ', "")
    text = text.replace('"done": ["completed"]', '"done": ["finished"]')
    text = text.replace('"per_call_micro": 5000', '"per_call_micro": 9000')
    assert "files.get\", \"task_param" not in text and '"finished"' in text
    return text


def _plugin_dir(folder: Path, source: str, base_url: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vidgen.py").write_text(source.format(base_url=base_url))
    return folder


class Boxes:
    """treg apps on one database, each from its own plugin folder, and the orgs A and B."""

    def __init__(self, aiohttp_client, make_app, tmp_path: Path, up) -> None:
        self.aiohttp_client, self.make_app, self.tmp_path, self.up = aiohttp_client, make_app, tmp_path, up
        self.orgs: dict[str, dict] = {}

    async def serve(self, name: str, source: str):
        app = self.make_app(plugins_dir=_plugin_dir(self.tmp_path / name, source, self.up.url + "/v1"),
                            ssrf_allow=("127.0.0.0/8",), platform={"TREG_PLATFORM_KEY_VIDGEN": SecretStr(PLATFORM_KEY)})
        client = await self.aiohttp_client(app)
        svc = client.app[SERVICES]
        if not self.orgs:
            for slug in ("org-a", "org-b"):
                self.orgs[slug] = await membership.create_org(svc, slug=slug, email=f"o@{slug}.test")
                await money.grant(svc, org_id=self.orgs[slug]["org_id"], amount_micro=100_000, actor="test")
        return client, Gateway(client, self.orgs["org-a"]), Gateway(client, self.orgs["org-b"])


async def _poll(gw, task_id):
    return await gw.call("GET", f"/catalog/call/vidgen.tasks.get?id={task_id}")


async def _fetch(gw, file_id):
    return await gw.call("GET", f"/catalog/call/vidgen.files.get?id={file_id}")


async def _submit(gw) -> tuple[str, str]:
    r = await gw.call("POST", SUBMIT, json={"prompt": "a cat"})
    assert r.status == 200, await r.text()
    return r.headers["X-Treg-Call-Id"], json.loads(r.headers["X-Treg-Async"])["task_id"]


async def _refused_without_vendor(up, *calls) -> None:
    seen = len(up.exchanges)
    for make in calls:
        r = await make()
        body = await r.json()
        assert r.status == 403 and body["error"] == "task_not_owned", (r.status, body)
        assert r.headers["X-Treg-Error"] == "1"
    assert len(up.exchanges) == seen  # the vendor heard nothing of them


@pytest.fixture
async def world(make_app, aiohttp_client, tmp_path):
    vendor = Vendor()
    async with raw_upstream(vendor.respond) as up:
        yield Boxes(aiohttp_client, make_app, tmp_path, up), vendor, up


async def test_a_dropped_descriptor_keeps_pending_jobs_owner_only_and_their_price(world):
    boxes, vendor, up = world
    client, a, _ = await boxes.serve("v1", PLUGIN)
    call_id, task = await _submitted_and_polled(a, vendor)
    await client.close()

    client, a, b = await boxes.serve("v2", _dropped(archived=True))  # the plugin update, on restart
    svc = client.app[SERVICES]
    poll_row = svc.catalog.get("vidgen.tasks.get")
    assert poll_row.async_job is None and poll_row.archive is not None  # the catalog no longer knows the job
    await _refused_without_vendor(up, lambda: _poll(b, task), lambda: _fetch(b, "f-" + task),
                                  lambda: _poll(b, "t999"))
    r = await _poll(a, task)  # the owner's poll: free, still pending
    assert r.status == 200 and (await r.json())["status"] == "running" and r.headers["X-Treg-Cost-Micro"] == "0"
    vendor.job(task).status = "completed"
    r = await _poll(a, task)  # the vendor's live status, never an archived one
    assert r.status == 200 and (await r.json())["status"] == "completed" and "X-Treg-Cache" not in r.headers
    detail = await a.api("GET", f"/api/v1/calls/{call_id}", expect=200)
    assert (detail["hold_state"], detail["cost_micro"]) == ("settled", 5000)  # the price frozen at submission
    assert detail["async"]["state"] == "done" and detail["async"]["fetch_ids"] == ["f-" + task]
    r = await _fetch(a, "f-" + task)
    assert r.status == 200 and await r.read() == vendor.job(task).data and r.headers["X-Treg-Cost-Micro"] == "0"
    await _refused_without_vendor(up, lambda: _fetch(b, "f-" + task), lambda: _poll(b, task))
    books_a = await check_books(svc, a.org["org_id"])
    assert [(h["state"], h["settled_micro"]) for h in books_a["holds"]] == [("settled", 5000)]
    assert (await check_books(svc, b.org["org_id"]))["holds"] == []
    assert (await a.api("GET", "/api/v1/balance", expect=200))["balance_micro"] == 95_000
    await client.close()


async def _submitted_and_polled(a, vendor) -> tuple[str, str]:
    call_id, task = await _submit(a)
    r = await _poll(a, task)
    assert r.status == 200 and (await r.json())["status"] == "running"
    return call_id, task


async def test_a_changed_descriptor_changes_neither_the_owner_nor_the_terms(world):
    boxes, vendor, up = world
    client, a, _ = await boxes.serve("v1", PLUGIN)
    call_id, task = await _submitted_and_polled(a, vendor)
    await client.close()

    client, a, b = await boxes.serve("v2", _changed())
    svc = client.app[SERVICES]
    assert svc.catalog.get("vidgen.files.get").async_job is None  # no catalog fetch any more
    vendor.job(task).status = "completed"  # done by the job's own (frozen) statuses, not "finished"
    await _refused_without_vendor(up, lambda: _poll(b, task), lambda: _fetch(b, "f-" + task))
    r = await _poll(a, task)
    assert r.status == 200 and r.headers["X-Treg-Cost-Micro"] == "0"
    detail = await a.api("GET", f"/api/v1/calls/{call_id}", expect=200)
    assert (detail["hold_state"], detail["cost_micro"], detail["async"]["state"]) == ("settled", 5000, "done")
    r = await _fetch(a, "f-" + task)  # the frozen fetch, read by the learned result id
    assert r.status == 200 and await r.read() == vendor.job(task).data
    # a job submitted under the new catalog follows the new terms
    call2, task2 = await _submit(a)
    vendor.job(task2).status = "completed"
    await _poll(a, task2)
    assert (await a.api("GET", f"/api/v1/calls/{call2}", expect=200))["hold_state"] == "held"
    vendor.job(task2).status = "finished"
    await _poll(a, task2)
    assert (await a.api("GET", f"/api/v1/calls/{call2}", expect=200))["cost_micro"] == 9000
    books = await check_books(svc, a.org["org_id"])
    assert sorted(h["settled_micro"] for h in books["holds"]) == [5000, 9000] and books["open"] == 0
    async with svc.db.tx() as tx:
        jobs = await tx.fetch_all(select(async_jobs.c.task_id, async_jobs.c.terms).order_by(async_jobs.c.created_at))
        uses = await tx.fetch_all(select(async_job_utilities.c.endpoint_id, async_job_utilities.c.kind,
                                         async_job_utilities.c.task_param, async_job_utilities.c.by_result_id))
    assert jobs[0]["terms"]["price"] == {"per_call_micro": 5000} and jobs[0]["terms"]["done"] == ["completed"]
    assert jobs[1]["terms"]["price"] == {"per_call_micro": 9000} and jobs[1]["terms"]["result_id_path"] is None
    assert sorted((u["endpoint_id"], u["kind"], u["task_param"], u["by_result_id"]) for u in uses) == [
        ("vidgen.files.get", "fetch", "id", True), ("vidgen.tasks.get", "poll", "id", False)]
    await client.close()


async def test_two_catalogs_at_once_agree_through_the_database(world):
    """A rolling deploy: the box on the new catalog learned no utility at startup, then the box on the
    old one records a job; the new box refuses another org's poll of it (the NOTIFY drops its view)."""
    boxes, vendor, up = world
    new_client, _, new_b = await boxes.serve("v2", _dropped())
    r = await _poll(new_b, "t0")  # no job names it yet: an ordinary free row on the new catalog
    assert r.status == 404 and r.headers["X-Treg-Credential-Tier"] == "platform"
    await r.read()
    old_client, old_a, _ = await boxes.serve("v1", PLUGIN)
    _, task = await _submit(old_a)
    for _ in range(250):  # the other box's NOTIFY reaches this one within moments (bounded: 5 s)
        r = await _poll(new_b, task)
        status = r.status
        await r.read()
        if status == 403:
            break
        await asyncio.sleep(0.02)
    assert status == 403
    await _refused_without_vendor(up, lambda: _poll(new_b, task), lambda: _fetch(new_b, "f-" + task))
    await old_client.close()
    await new_client.close()


async def _as_before_0012(svc) -> None:
    """What migration 0012 leaves of jobs recorded before it: no terms, utilities of unknown parameter."""
    async with svc.db.tx() as tx:
        await tx.execute("UPDATE async_jobs SET terms = NULL")
        await tx.execute("DELETE FROM async_job_utilities")
        await tx.execute("INSERT INTO async_job_utilities (endpoint_id, kind, task_param, by_result_id) VALUES "
                         "('vidgen.tasks.get', 'poll', '', false), ('vidgen.files.get', 'fetch', '', false)")


async def test_a_job_recorded_before_its_terms_were_frozen(world):
    """A job from before migration 0012 (no terms, its utilities with an unknown parameter): while the
    catalog still marks its poll, the owner polls and settles it by the catalog's terms; once a catalog
    no longer does, nobody can name it on treg's key (refused, the reaper's to release)."""
    boxes, vendor, up = world
    client, a, b = await boxes.serve("v1", PLUGIN)
    call_id, task = await _submitted_and_polled(a, vendor)
    await _as_before_0012(client.app[SERVICES])
    await client.close()

    client, a, b = await boxes.serve("v1-again", PLUGIN)  # the same catalog: read as it says
    await _refused_without_vendor(up, lambda: _poll(b, task))
    vendor.job(task).status = "completed"
    r = await _poll(a, task)
    assert r.status == 200
    assert (await a.api("GET", f"/api/v1/calls/{call_id}", expect=200))["cost_micro"] == 5000
    _, task2 = await _submit(a)
    await _as_before_0012(client.app[SERVICES])
    await client.close()

    client, a, b = await boxes.serve("v2", _dropped())
    await _refused_without_vendor(up, lambda: _poll(b, task2), lambda: _poll(a, task2),
                                  lambda: _fetch(a, "f-" + task))
    await client.close()


def test_schema_matches_migration(dsn):
    assert_schema_matches(dsn, {"async_jobs", "async_job_utilities"})


def test_0012_up_down_up_and_existing_jobs_stay_owner_only(pg_base):
    assert_up_down_up(pg_base, "0012", "0012_async_job_terms", {"async_job_utilities"},
                      columns={"async_jobs": {"terms"}})
    with empty_database(pg_base) as dsn:
        migrate.upgrade(dsn, "0011")
        with migrate.engine_for(dsn).begin() as conn:  # a job recorded before its terms were frozen
            conn.execute(text("INSERT INTO orgs (id, slug) VALUES ('org_1', 'one')"))
            conn.execute(text("INSERT INTO async_jobs (id, org_id, provider, endpoint_id, task_id, call_id, "
                              "poll_endpoint, fetch_endpoint) VALUES ('job_1', 'org_1', 'vidgen', "
                              "'vidgen.videos.create', 't1', 'call_1', 'vidgen.tasks.get', 'vidgen.files.get')"))
        migrate.upgrade(dsn, "0012")
        with migrate.engine_for(dsn).connect() as conn:
            rows = conn.execute(text("SELECT endpoint_id, kind, task_param, by_result_id FROM async_job_utilities "
                                     "ORDER BY endpoint_id")).all()
            terms = conn.execute(text("SELECT terms FROM async_jobs")).scalar()
    assert [tuple(r) for r in rows] == [("vidgen.files.get", "fetch", "", False),
                                        ("vidgen.tasks.get", "poll", "", False)]
    assert terms is None
