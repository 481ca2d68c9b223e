"""GET /metrics: Prometheus text a real client scrapes and parses; the figures move as calls are made;
guarded by TREG_METRICS_TOKEN (401) or, unset, by the loopback address (403)."""

from __future__ import annotations

import socket
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from treg import money
from treg.call_record import CallRecord
from treg.metrics import LABEL_VALUES_MAX, Metrics
from treg.settings import SecretStr


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(figures, name: str, **labels: str) -> float:
    return figures.get((name, tuple(sorted(labels.items()))), 0.0)


async def scrape(gateway) -> dict:
    # a plain aiohttp client session on the server's real socket, as Prometheus would connect
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{gateway.client.port}/metrics") as resp:
            assert resp.status == 200, await resp.text()
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            return samples(await resp.text())


async def test_call_counts_and_upstream_latency_move_with_calls(gateway, up, tool):
    before = await scrape(gateway)
    ok = dict(surface="call", outcome="ok", credential_tier="tool", refused_by="")
    for _ in range(3):
        resp = await gateway.call("GET", "/call/up/thing")
        assert resp.status == 200
    resp = await gateway.call("GET", "/call/nosuchtool/x")  # refused: an audited call too
    assert resp.status == 404
    await gateway.api("POST", "/api/v1/deny-rules", json={"host": f"127.0.0.1:{up.port}"}, expect=201)
    resp = await gateway.call("GET", "/call/up/thing")
    assert resp.status == 403
    after = await scrape(gateway)
    assert value(after, "treg_calls_total", **ok) - value(before, "treg_calls_total", **ok) == 3
    denied = dict(surface="call", outcome="refused", credential_tier="tool", refused_by="deny")
    assert value(after, "treg_calls_total", **denied) - value(before, "treg_calls_total", **denied) == 1
    assert value(after, "treg_upstream_seconds_count", surface="call") - \
        value(before, "treg_upstream_seconds_count", surface="call") == 3
    assert value(after, "treg_upstream_seconds_bucket", surface="call", le="+Inf") >= 3
    # nothing unbounded in any label: no org, token, tool name or path
    text_labels = {v for (_, labels) in after for _, v in labels}
    assert not text_labels & {gateway.org["org_slug"], gateway.org["org_id"], "up", "/call/up/thing", "thing"}
    # declared before the capacity feature exists
    assert value(after, "treg_capacity_locks") == 0
    assert value(after, "treg_db_pool_connections", state="idle") + \
        value(after, "treg_db_pool_connections", state="in_use") >= 1


async def test_money_figures_move_with_holds(gateway):
    svc, org_id = gateway.services, gateway.org["org_id"]
    await money.grant(svc, org_id=org_id, amount_micro=100_000, actor="test")
    before = await scrape(gateway)
    assert value(before, "treg_metrics_money_ok") == 1
    await money.place_hold(svc, org_id=org_id, member_id=None, call_id="call_m1", amount_micro=700)
    await money.place_hold(svc, org_id=org_id, member_id=None, call_id="call_m2", amount_micro=500)
    mid = await scrape(gateway)
    assert value(mid, "treg_holds_open") - value(before, "treg_holds_open") == 2
    assert value(mid, "treg_holds_open_micro") - value(before, "treg_holds_open_micro") == 1200
    assert await money.settle(svc, "call_m1", 300)  # 300 charged, 400 of its estimate given back
    assert await money.release(svc, "call_m2")
    after = await scrape(gateway)
    assert value(after, "treg_holds_open") == value(before, "treg_holds_open")
    assert value(after, "treg_charged_micro_total") - value(before, "treg_charged_micro_total") == 300
    assert value(after, "treg_released_micro_total") - value(before, "treg_released_micro_total") == 900


async def test_the_token_setting_guards_the_scrape(make_app, aiohttp_client):
    client = await aiohttp_client(make_app(metrics_token=SecretStr("scrape-me")))
    resp = await client.get("/metrics")
    assert resp.status == 401 and resp.headers["X-Treg-Error"] == "1"
    assert (await resp.json())["error"] == "metrics_unauthorized"
    resp = await client.get("/metrics", headers={"Authorization": "Bearer wrong"})
    assert resp.status == 401
    resp = await client.get("/metrics", headers={"Authorization": "Bearer scrape-me"})
    assert resp.status == 200
    assert "treg_calls" in {f.name for f in text_string_to_metric_families(await resp.text())}


def _non_loopback_address() -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks the outgoing interface
            addr = s.getsockname()[0]
    except OSError:
        return None
    return None if addr.startswith("127.") else addr


async def test_without_a_token_only_loopback_is_answered(make_app, aiohttp_server):
    addr = _non_loopback_address()
    if addr is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    server = await aiohttp_server(make_app(), host="0.0.0.0")
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://{addr}:{server.port}/metrics") as resp:
            assert resp.status == 403 and resp.headers["X-Treg-Error"] == "1"
            assert (await resp.json())["error"] == "metrics_forbidden"
        async with session.get(f"http://127.0.0.1:{server.port}/metrics") as resp:
            assert resp.status == 200


def test_label_values_stay_bounded():
    m = Metrics()
    for i in range(LABEL_VALUES_MAX * 3):
        m.observe_call(CallRecord(f"call_{i}", "org_x", None, "call", "GET", "/x", "refused",
                                  refused_by=f"gate_{i}"))
    m.observe_call(CallRecord("call_y", "org_x", None, "call", "GET", "/x", "refused", refused_by="Org Slug/42"))
    refused_by = {s.labels["refused_by"] for f in text_string_to_metric_families(m.exposition().decode())
                  if f.name == "treg_calls" for s in f.samples}
    assert len(refused_by) <= LABEL_VALUES_MAX + 1 and "other" in refused_by and "Org Slug/42" not in refused_by


def test_upstream_buckets_are_cumulative_and_le_inclusive():
    m = Metrics()
    for ms in (3, 5, 700, 200_000):
        m.observe_call(CallRecord("c", "org_x", None, "catalog", "GET", "/x", "ok", 200, ttfb_ms=ms))
    figures = samples(m.exposition().decode())
    assert value(figures, "treg_upstream_seconds_bucket", surface="catalog", le="0.005") == 2  # 5 ms <= 0.005
    assert value(figures, "treg_upstream_seconds_bucket", surface="catalog", le="0.5") == 2
    assert value(figures, "treg_upstream_seconds_bucket", surface="catalog", le="1.0") == 3
    assert value(figures, "treg_upstream_seconds_bucket", surface="catalog", le="120.0") == 3
    assert value(figures, "treg_upstream_seconds_bucket", surface="catalog", le="+Inf") == 4
    assert value(figures, "treg_upstream_seconds_count", surface="catalog") == 4
    assert abs(value(figures, "treg_upstream_seconds_sum", surface="catalog") - 200.708) < 1e-9


class _DownDatabase:
    """A database that refuses every transaction (the server went away), its pool still countable."""

    round_trips = 7
    round_trips_of = {"money": 2}

    def tx(self):
        from treg.errors import DatabaseError

        raise DatabaseError("the database failed the request", code="database_error")

    def pool_use(self):
        return 3, 1


async def test_a_scrape_answers_without_money_when_the_database_does_not():
    m = Metrics()
    m.bind(_DownDatabase())
    await m.refresh()
    figures = samples(m.exposition().decode())
    assert value(figures, "treg_metrics_money_ok") == 0
    assert ("treg_holds_open", ()) not in figures
    assert value(figures, "treg_db_pool_connections", state="in_use") == 3


def _documented_series() -> set[str]:
    """The metric names of docs/operations.md's "Series" table (a counter's without ``_total``, as the
    exposition's family names are)."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    table = doc.split("**Series.**", 1)[1].split("\n\n", 2)[1]
    names = set()
    for line in table.splitlines()[2:]:
        name = line.split("|")[1].strip().strip("`")
        names.add(name[:-len("_total")] if name.endswith("_total") else name)
    return names


async def test_the_series_table_and_the_exposition_name_the_same_metrics(gateway):
    """docs/operations.md's table of series against what a scrape exposes, both ways."""
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{gateway.client.port}/metrics") as resp:
            assert resp.status == 200
            exposed = {f.name for f in text_string_to_metric_families(await resp.text())
                       if f.name.startswith("treg_")}
    documented = _documented_series()
    # prometheus-client's counters add their creation time as a series of its own (the table says so)
    exposed = {n for n in exposed if not (n.endswith("_created") and n[:-len("_created")] in documented)}
    assert exposed - documented == set(), "exposed but not in docs/operations.md"
    assert documented - exposed == set(), "documented but not exposed"
