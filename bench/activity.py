"""The dashboard's Activity page on a large audit table: ``python -m bench.activity`` from a checkout.

Seeds ``--rows`` calls (default 1,000,000) into one org of a database of its own (plus a tenth as many
in a second org, so the index holds more than the org it serves), serves treg on 127.0.0.1, logs in
through ``/ui/login`` as the owner and as a member, and times whole page answers (HTTP, rendering and
the query) for the first page, a page half a million rows deep, each filter, and the member's view;
then, for contrast, the same deep page fetched with OFFSET as a naive paginator would. Every loop is
bounded by ``--reps``. ``--write`` puts the figures into docs/performance.md between its markers.

The database: ``--dsn`` (a server's maintenance DSN), else the test suite's embedded server of this
checkout (treg.testing.base_dsn); the benchmark's database is created and dropped by the run itself.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import psycopg2
from aiohttp import web

from treg import authentication, membership, testing
from treg.app import create_app
from treg.keys import SERVICES

START, END = "<!-- bench-activity:start -->", "<!-- bench-activity:end -->"
SEED = """
INSERT INTO calls (id, org_id, member_id, created_at, surface, method, target, tool_name, status, outcome,
                   refused_by, credential_tier, cost_micro, duration_ms)
SELECT 'call_' || %(tag)s || lpad(g::text, 10, '0'), %(org)s,
       CASE WHEN g %% 10 = 0 THEN %(member)s ELSE %(owner)s END,
       now() - (g * interval '25 milliseconds'), 'call', 'GET', 'tool' || (g %% 20) || '/v1/items',
       'tool' || (g %% 20), CASE WHEN g %% 100 = 0 THEN 403 ELSE 200 END,
       CASE WHEN g %% 100 = 0 THEN 'refused' ELSE 'ok' END, CASE WHEN g %% 100 = 0 THEN 'deny' END,
       'tool', 0, 20 + g %% 200
FROM generate_series(%(lo)s, %(hi)s) g
"""


def admin(dsn: str) -> Any:
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    return conn


def seed(dsn: str, *, org: str, owner: str, member: str, rows: int, tag: str, chunk: int = 200_000) -> None:
    conn = admin(dsn)
    try:
        with conn.cursor() as cur:
            for lo in range(1, rows + 1, chunk):  # bounded transactions
                cur.execute(SEED, {"tag": tag, "org": org, "owner": owner, "member": member, "lo": lo,
                                   "hi": min(rows, lo + chunk - 1)})
    finally:
        conn.close()


def scalar(dsn: str, sql: str, params: dict[str, Any]) -> Any:
    conn = admin(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchone()
    finally:
        conn.close()


async def timed(session: aiohttp.ClientSession, url: str, reps: int) -> dict[str, float]:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        async with session.get(url) as resp:
            body = await resp.read()
        times.append((time.perf_counter() - t0) * 1000)
        assert resp.status == 200, (url, resp.status, body[:300])
    times.sort()
    return {"median_ms": statistics.median(times), "p95_ms": times[min(len(times) - 1, int(len(times) * 0.95))],
            "rows": body.count(b'href="/ui/activity/call_')}


async def login(base: str, token: str) -> aiohttp.ClientSession:
    session = aiohttp.ClientSession(base_url=base, cookie_jar=aiohttp.CookieJar(unsafe=True))
    # as a browser logs in: the login form's token (and its pre-login cookie), from treg's own origin
    async with session.get("/ui/login") as resp:
        form_token = re.search(r'name="form_token" value="([^"]+)"', await resp.text()).group(1)  # type: ignore[union-attr]
    async with session.post("/ui/login", data={"token": token, "form_token": form_token},
                            headers={"Origin": base.rstrip("/")}, allow_redirects=False) as resp:
        assert resp.status == 303, await resp.text()
    return session


def offset_ms(dsn: str, org: str, offset: int, reps: int) -> float:
    conn = admin(dsn)
    times = []
    try:
        with conn.cursor() as cur:
            for _ in range(reps):
                t0 = time.perf_counter()
                cur.execute("SELECT id FROM calls WHERE org_id = %s ORDER BY created_at DESC, id DESC "
                            "LIMIT 51 OFFSET %s", (org, offset))
                cur.fetchall()
                times.append((time.perf_counter() - t0) * 1000)
    finally:
        conn.close()
    return statistics.median(times)


async def run(opts: argparse.Namespace) -> dict[str, Any]:
    base = opts.dsn or testing.base_dsn()
    name = f"treg_bench_activity_{os.getpid()}"
    conn = admin(base)
    with conn.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()
    dsn = testing.dsn_for(base, name)
    runner = None
    try:
        home = Path(tempfile.mkdtemp(prefix="treg-bench-activity-"))
        app = create_app(testing.make_settings(home), dsn=dsn)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()  # migrates the new database
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        svc = app[SERVICES]
        org = await membership.create_org(svc, slug="bench", email="owner@bench.test")
        ident = await authentication.authenticate(svc, org["token"], None)
        member = await membership.add_member(svc, ident, {"email": "dev@bench.test", "role": "member"})
        other = await membership.create_org(svc, slug="other", email="owner@other.test")
        t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, lambda: seed(dsn, org=org["org_id"], owner=org["member_id"],
                                                      member=member["member_id"], rows=opts.rows, tag="a"))
        await loop.run_in_executor(None, lambda: seed(dsn, org=other["org_id"], owner=other["member_id"],
                                                      member=other["member_id"], rows=opts.rows // 10, tag="b"))
        await loop.run_in_executor(None, scalar, dsn, "ANALYZE calls; SELECT 1", {})
        seed_s = time.perf_counter() - t0
        deep = opts.rows // 2
        stamp, call_id = await loop.run_in_executor(None, scalar, dsn, (
            "SELECT created_at, id FROM calls WHERE org_id = %(o)s ORDER BY created_at DESC, id DESC "
            "OFFSET %(d)s LIMIT 1"), {"o": org["org_id"], "d": deep})
        cursor = f"{stamp.isoformat()}~{call_id}"
        base_url = f"http://127.0.0.1:{port}"
        owner_s = await login(base_url, org["token"])
        member_s = await login(base_url, member["token"])
        q = aiohttp.helpers.quote  # type: ignore[attr-defined]
        cases = {
            "first page (owner, no filter)": (owner_s, "/ui/activity"),
            f"page {deep:,} rows deep (keyset cursor)": (owner_s, f"/ui/activity?before={q(cursor, safe='')}"),
            "filter outcome=refused (1 % of rows)": (owner_s, "/ui/activity?outcome=refused"),
            "filter tool=tool7 (5 %)": (owner_s, "/ui/activity?tool=tool7"),
            "filter member (10 %)": (owner_s, f"/ui/activity?member={member['member_id']}"),
            "member's own view (10 %)": (member_s, "/ui/activity"),
            "member's view, deep (keyset cursor)": (member_s, f"/ui/activity?before={q(cursor, safe='')}"),
            "overview (balance, 10 recent, failing providers)": (owner_s, "/ui/"),
        }
        results = {}
        for label, (session, url) in cases.items():
            await timed(session, url, 2)  # warm: the first plan, the template compile
            results[label] = await timed(session, url, opts.reps)
        await owner_s.close()
        await member_s.close()
        offset = await loop.run_in_executor(None, offset_ms, dsn, org["org_id"], deep, max(3, opts.reps // 5))
        total = (await loop.run_in_executor(None, scalar, dsn, "SELECT count(*) FROM calls", {}))[0]
        return {"rows_in_org": opts.rows, "rows_total": total, "seed_s": seed_s, "pages": results,
                "offset_deep_query_ms": offset, "deep": deep, "reps": opts.reps,
                "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"}
    finally:
        if runner is not None:
            await runner.cleanup()
        conn = admin(base)
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.close()


def report(r: dict[str, Any]) -> str:
    lines = [START, "",
             f"`python -m bench.activity --rows {r['rows_in_org']} --reps {r['reps']}` — {r['rows_in_org']:,} calls "
             f"in the org under test, {r['rows_total']:,} in the table (seeded in {r['seed_s']:.0f} s); "
             f"{r['machine']}; the machine shared with other work. Whole page answers over loopback HTTP "
             "(session lookup, query, rendering), 50 rows a page:", "",
             "| page | median | p95 | rows |", "| --- | ---: | ---: | ---: |"]
    for label, v in r["pages"].items():
        lines.append(f"| {label} | {v['median_ms']:.1f} ms | {v['p95_ms']:.1f} ms | {v['rows']} |")
    lines += ["", f"For contrast, the same page {r['deep']:,} rows deep fetched with `OFFSET` (the query alone, "
              f"no HTTP): {r['offset_deep_query_ms']:.0f} ms.", "", END]
    return "\n".join(lines)


def write(doc: Path, text: str) -> None:
    body = doc.read_text()
    if START in body:
        body = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: text, body, flags=re.S)
    else:
        body = body.rstrip() + "\n\n## Dashboard: Activity on a million calls\n\n" + text + "\n"
    doc.write_text(body)


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.activity", description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--dsn", default=None, help="maintenance DSN of the PostgreSQL server to use")
    ap.add_argument("--write", type=Path, default=None, help="docs/performance.md: put the figures there")
    opts = ap.parse_args()
    r = asyncio.run(run(opts))
    text = report(r)
    print(text)
    if opts.write:
        write(opts.write, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
