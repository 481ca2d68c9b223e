"""The dashboard's pages over HTTP: CSRF on every state change, Activity's keyset pages and filters,
what a member sees, refusals rendered beside their field, and no 5xx on any page."""

from __future__ import annotations

import datetime as dt
import re

from aiohttp import web
from sqlalchemy import insert, text

from treg.infra.schema import calls
from treg.testing import login
from treg.web.dashboard import pages


def post_routes() -> list[str]:
    """Every POST route of the dashboard, with placeholder ids."""
    out = []
    for route in pages.routes:
        if isinstance(route, web.RouteDef) and route.method == "POST":
            out.append(re.sub(r"\{[a-z_]+\}", "x", route.path))
    return out


async def test_every_state_change_of_the_dashboard_needs_the_csrf_token(gateway):
    await login(gateway.client, gateway.org["token"])
    routes = [r for r in post_routes() if r not in ("/ui/login", "/ui/logout")]
    assert len(routes) >= 10, routes
    for path in routes:
        resp = await gateway.client.post(path, data={"name": "x", "email": "a@b.test", "host": "h"})
        assert resp.status == 403, (path, resp.status)
        assert "CSRF" in await resp.text()


async def seed_calls(gateway, n: int, member_id: str | None = None, **values) -> None:
    base = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    rows = [{"id": f"call_{i:06d}", "org_id": gateway.org["org_id"], "member_id": member_id or gateway.org["member_id"],
             "surface": "call", "method": "GET", "target": f"up/{i}", "outcome": values.get("outcome", "ok"),
             "status": 200, "tool_name": values.get("tool_name", "up"),
             # pairs of calls in the same microsecond: the keyset must break ties by id
             "created_at": base + dt.timedelta(seconds=i // 2)} for i in range(n)]
    async with gateway.services.db.tx() as tx:
        await tx.execute(insert(calls).values(rows))


async def test_activity_pages_by_keyset_newest_first_without_gaps_or_repeats(gateway):
    await seed_calls(gateway, 125)
    await login(gateway.client, gateway.org["token"])
    seen, url = [], "/ui/activity?tool=up"
    for _ in range(10):
        resp = await gateway.client.get(url)
        assert resp.status == 200
        body = await resp.text()
        seen += re.findall(r'href="/ui/activity/(call_\d+)"', body)
        nxt = re.search(r'href="(/ui/activity\?[^"]+)" rel="next"', body)
        if not nxt:
            break
        url = nxt.group(1).replace("&amp;", "&")
        assert "tool=up" in url  # the filter stays in the link
    assert seen == [f"call_{i:06d}" for i in reversed(range(125))]


async def test_activity_filters_and_a_bad_cursor(gateway):
    await seed_calls(gateway, 4)
    async with gateway.services.db.tx() as tx:
        await tx.execute(text("UPDATE calls SET outcome = 'refused', refused_by = 'deny', status = 403 "
                              "WHERE id = 'call_000001'"))
    await login(gateway.client, gateway.org["token"])
    body = await (await gateway.client.get("/ui/activity?outcome=refused")).text()
    assert re.findall(r'href="/ui/activity/(call_\d+)"', body) == ["call_000001"]
    assert "refused by deny" in body
    resp = await gateway.client.get("/ui/activity?before=garbage")
    assert resp.status == 400 and "cursor" in await resp.text()
    resp = await gateway.client.get("/ui/activity?outcome=%00")
    assert resp.status == 400


async def test_the_activity_query_walks_an_index(gateway):
    """The plan of a deep page on each filter uses an index scan (no sort of the whole org)."""
    await seed_calls(gateway, 50)
    async with gateway.services.db.tx() as tx:
        await tx.execute(text("ANALYZE calls"))
        await tx.execute(text("SET LOCAL enable_seqscan = off"))
        for extra in ("", " AND outcome = 'ok'", " AND tool_name = 'up'", " AND member_id = 'm'"):
            plan = await tx.fetch_all(text(
                "EXPLAIN SELECT id FROM calls WHERE org_id = :o" + extra + " AND created_at <= now() AND "
                "(created_at < now() OR id < 'x') ORDER BY created_at DESC, id DESC LIMIT 51"), {"o": "org"})
            lines = " ".join(r["QUERY PLAN"] for r in plan)
            assert "Index" in lines and "Seq Scan" not in lines, lines


async def test_a_member_sees_only_their_calls_and_no_management(gateway):
    member = await gateway.member("dev@acme.test")
    await seed_calls(gateway, 3)
    async with gateway.services.db.tx() as tx:
        await tx.execute(text("UPDATE calls SET member_id = :m WHERE id = 'call_000002'"), {"m": member["member_id"]})
    await login(gateway.client, member["token"])
    body = await (await gateway.client.get(f"/ui/activity?member={gateway.org['member_id']}")).text()
    assert re.findall(r'href="/ui/activity/(call_\d+)"', body) == ["call_000002"]  # a filter cannot widen it
    assert (await gateway.client.get("/ui/activity/call_000001")).status == 404
    for path in ("/ui/", "/ui/tools", "/ui/secrets", "/ui/members", "/ui/deny-rules", "/ui/activity", "/ui/catalog",
                 "/ui/capacity", "/ui/try", "/ui/activity/call_000002"):
        resp = await gateway.client.get(path)
        assert resp.status == 200, path
        assert "Content-Security-Policy" in resp.headers
    body = await (await gateway.client.get("/ui/members")).text()
    assert "Add a member" not in body and "owner@acme.test" not in body


async def test_tool_refusals_show_beside_their_field(gateway):
    csrf = await login(gateway.client, gateway.org["token"])
    cases = [({"name": "t", "base_url": "http://127.0.0.1.nip.invalid.local/x"}, "base_url-error"),
             ({"name": "t", "base_url": "ftp://x.example/"}, "base_url-error"),
             ({"name": "bad name!", "base_url": "https://api.example.com"}, "name-error"),
             ({"name": "t", "base_url": "https://api.example.com", "b0_name": "Authorization",
               "b0_secret": "sec_nope"}, "bindings-error"),
             ({"name": "t", "base_url": "https://api.example.com", "b0_name": "X", "b0_format": "{nope}"},
              "bindings-error")]
    for form, field in cases:
        resp = await gateway.client.post("/ui/tools", data={**form, "csrf": csrf})
        body = await resp.text()
        assert resp.status in (400, 422), (form, resp.status)
        assert f'id="{field}"' in body, (form, body[:2000])
        assert form["name"] in body  # the form keeps what was typed
    assert (await gateway.api("GET", "/api/v1/tools"))["tools"] == []


async def test_a_new_member_token_is_shown_once_and_a_secret_never(gateway):
    csrf = await login(gateway.client, gateway.org["token"])
    resp = await gateway.client.post("/ui/members", data={"email": "new@acme.test", "role": "member", "csrf": csrf})
    body = await resp.text()
    token = re.search(r'id="new-token" readonly value="(treg_[^"]+)"', body).group(1)
    assert (await gateway.api("GET", "/api/v1/me", as_={"X-Treg-Token": token}))["email"] == "new@acme.test"
    assert token not in await (await gateway.client.get("/ui/members")).text()
    await gateway.client.post("/ui/secrets", data={"name": "k", "value": "hunter2-secret", "csrf": csrf})
    for path in ("/ui/secrets", "/ui/tools", "/ui/"):
        assert "hunter2-secret" not in await (await gateway.client.get(path)).text()
    # a refused secret form does not echo the value back either
    resp = await gateway.client.post("/ui/secrets", data={"name": "", "value": "hunter2-secret", "csrf": csrf})
    assert resp.status == 400 and "hunter2-secret" not in await resp.text()


async def test_static_files_are_served_by_treg(gateway):
    for name, ctype in (("treg.css", "text/css"), ("tryit.js", "application/javascript")):
        resp = await gateway.client.get(f"/ui/static/{name}")
        assert resp.status == 200 and resp.content_type == ctype
    assert (await gateway.client.get("/ui/static/../../setup.py")).status == 404


async def test_the_activity_benchmark_runs_and_reports(pg_base, tmp_path):
    """bench/activity.py, tiny: it seeds, logs in, times every page and writes its section."""
    import argparse

    from bench import activity

    result = await activity.run(argparse.Namespace(rows=300, reps=2, dsn=pg_base))
    assert result["rows_total"] == 330
    assert all(v["rows"] > 0 for v in result["pages"].values()) and len(result["pages"]) == 8
    assert result["pages"]["first page (owner, no filter)"]["rows"] == 50
    doc = tmp_path / "performance.md"
    doc.write_text("# Performance\n")
    activity.write(doc, activity.report(result))
    activity.write(doc, activity.report(result))  # replaced between its markers, not appended twice
    assert doc.read_text().count(activity.START) == 1


def test_the_templates_ship_in_the_wheel():
    import runpy
    from pathlib import Path

    import setuptools

    root = Path(__file__).resolve().parent.parent
    seen: dict = {}
    orig = setuptools.setup
    setuptools.setup = lambda **kw: seen.update(kw)
    try:
        runpy.run_path(str(root / "setup.py"), run_name="__main__")
    finally:
        setuptools.setup = orig
    assert "treg.templates" in seen["packages"]
    pyproject = (root / "pyproject.toml").read_text()
    assert '"treg.templates" = "templates"' in pyproject and '"treg.templates" = ["*.html", "static/*"]' in pyproject


async def test_an_unknown_dashboard_path_is_a_404_page(gateway):
    resp = await gateway.client.get("/ui/nope/deeper")
    assert resp.status == 404 and resp.content_type == "text/html" and "no such dashboard page" in await resp.text()
    assert (await gateway.client.get("/ui/static/treg.css")).status == 200


async def test_a_tool_is_edited_and_deleted_through_the_same_validation(gateway):
    csrf = await login(gateway.client, gateway.org["token"])
    tool = await gateway.tool("svc", "https://api.example.com/v1")
    page = await (await gateway.client.get(f"/ui/tools/{tool['id']}")).text()
    assert 'value="https://api.example.com/v1"' in page and "Save tool" in page
    resp = await gateway.client.post(f"/ui/tools/{tool['id']}", data={"csrf": csrf, "name": "svc",
                                                                     "base_url": "http://192.168.1.1/"})
    assert resp.status == 422 and 'id="base_url-error"' in await resp.text()
    resp = await gateway.client.post(f"/ui/tools/{tool['id']}", data={"csrf": csrf, "name": "svc2",
                                                                     "base_url": "https://api.example.com/v2"})
    assert resp.status == 200 and "Tool svc2 saved" in await resp.text()
    got = await gateway.api("GET", f"/api/v1/tools/{tool['id']}")
    assert (got["name"], got["base_url"]) == ("svc2", "https://api.example.com/v2")
    resp = await gateway.client.post(f"/ui/tools/{tool['id']}/delete", data={"csrf": csrf})
    assert resp.status == 200 and "Tool deleted" in await resp.text()
    assert (await gateway.api("GET", "/api/v1/tools"))["tools"] == []
    resp = await gateway.client.post(f"/ui/tools/{tool['id']}/delete", data={"csrf": csrf})
    assert resp.status == 404 and "no such tool" in await resp.text()


async def test_capacity_page_lists_the_platform_locks_to_managers_only(gateway):
    from treg.testing.vendors.capacity import strike_lock

    await strike_lock(gateway.services, "quota", "acme", "acme.items-get")
    await login(gateway.client, gateway.org["token"])
    body = await (await gateway.client.get("/ui/capacity")).text()
    assert "acme.items-get" in body and "quota" in body
    member = await gateway.member("member@acme.test")
    gateway.client.session.cookie_jar.clear()
    await login(gateway.client, member["token"])
    body = await (await gateway.client.get("/ui/capacity")).text()
    assert "acme.items-get" not in body and "Only owners and admins" in body
