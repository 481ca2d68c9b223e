"""The evidence pruner never stops treg from serving or from shutting down cleanly (issue 20 item 12): a
run that raises anything (not only a TregError) is logged and retried next period, and at shutdown the
audit queue is flushed whatever the pruner did: once a non-TregError ended its task, and shutdown
re-raised it before the audit writer's last flush, losing every row still queued."""

from __future__ import annotations

import asyncio
import logging

import psycopg2
from aiohttp.test_utils import TestClient, TestServer

from treg import membership
from treg.call import runtime
from treg.keys import SERVICES
from treg.testing import Gateway, raw_upstream


def _broken(runs: list[float]):
    async def prune(svc) -> int:
        runs.append(asyncio.get_running_loop().time())
        raise RuntimeError("a bug in the pruner")
    return prune


async def _started(make_app, **settings) -> tuple[TestClient, Gateway]:
    client = TestClient(TestServer(make_app(ssrf_allow=("127.0.0.0/8",), **settings)))
    await client.start_server()
    org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
    return client, Gateway(client, org)


def _stored_ids(dsn: str) -> set[str]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT id FROM calls")
            return {r[0] for r in cur.fetchall()}
    finally:
        conn.close()


async def test_a_failing_run_is_logged_and_retried_next_period(make_app, monkeypatch, caplog):
    caplog.set_level(logging.ERROR, logger="treg.call.runtime")
    runs: list[float] = []
    monkeypatch.setattr(runtime, "prune_evidence", _broken(runs))
    monkeypatch.setattr(runtime, "PRUNE_INTERVAL_S", 0.05)
    client, gw = await _started(make_app)
    try:
        for _ in range(200):  # bounded: 10 s
            if len(runs) >= 3:
                break
            await asyncio.sleep(0.05)
        assert len(runs) >= 3, runs  # the first run at startup, then again each period
        assert "treg-evidence-pruner: run failed" in caplog.text
        assert (await gw.api("GET", "/api/v1/me", expect=200))["org_slug"] == "acme"  # still serving
    finally:
        await client.close()


async def test_an_audit_row_queued_before_shutdown_is_written_though_the_pruner_failed(make_app, dsn,
                                                                                      monkeypatch):
    runs: list[float] = []
    monkeypatch.setattr(runtime, "prune_evidence", _broken(runs))
    # a minute between flushes: only shutdown's flush can write the row
    client, gw = await _started(make_app, audit_flush_ms=60_000)
    async with raw_upstream() as up:
        await gw.tool("t", up.url)
        for _ in range(100):  # the pruner's first run (at startup) has failed
            if runs:
                break
            await asyncio.sleep(0.02)
        assert runs
        call_id = (await gw.call("GET", "/call/t/x")).headers["X-Treg-Call-Id"]
    assert call_id not in _stored_ids(dsn)  # still queued
    await client.close()  # must not raise the pruner's error
    assert call_id in _stored_ids(dsn)
