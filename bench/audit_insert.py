"""``python -m bench.audit_insert``: what one audit batch costs PostgreSQL, as shipped and with variants.

The c=1 tail of the own tool is the audit INSERT's work on PostgreSQL's side (docs/performance.md,
rounds 9 and 10); the benchmark sees it only through the noise of a shared machine. This instrument
measures the statement alone: a server of its own (embedded, under a temporary folder, stopped at the
end), treg's schema at head, ``--fill`` rows already in ``calls`` (indexes of a realistic size), then
``--reps`` batches of ``--rows`` records sent with the audit writer's own statement
(treg/call/audit.py ``insert_sql``). For each it prints the wall time of the statement and the CPU the
backend spent on it (``/proc/<backend>/stat``, so the server must run on this machine, as it does here),
and the WAL it wrote.

``--variant`` (repeatable, applied in order, each measured after it is applied) changes the server or the
schema for the experiment only: ``syncoff`` (``synchronous_commit = off`` on the connection), ``nofk``
(the foreign key to ``orgs`` dropped), ``drop:<index>``, ``truncate``, ``randomids`` (``calls`` emptied,
then filled and sent batches with call ids of 128 random bits, as before round 17, instead of treg's
time-ordered ones: ``treg.ids.new_call_id``). Nothing of treg's runs; every connection is to
127.0.0.1's own server; the work is a fixed number of batches.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


def _records(n: int, make_id: Callable[[], str]) -> list[Any]:
    """``n`` records shaped like the benchmark's own-tool call (one org, one member, one tool)."""
    from treg.call_record import CallRecord

    return [CallRecord(id=make_id(), org_id="org_bench", member_id="mem_bench", surface="call",
                       method="GET", target="bench/small", outcome="success", status=200,
                       upstream_url="http://127.0.0.1:1/small", tool_id="tool_bench", tool_name="bench",
                       request_bytes=0, response_bytes=20, duration_ms=1, ttfb_ms=1, credential_kind="secret")
            for _ in range(n)]


def _cpu_ms(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) * TICK_MS  # utime + stime


def _measure(cur: Any, backend: int, rows: int, reps: int, make_id: Callable[[], str]) -> dict[str, float]:
    from treg.call.audit import insert_sql

    walls = []
    cur.execute("SELECT pg_current_wal_lsn()")
    wal0 = cur.fetchone()[0]
    cpu0 = _cpu_ms(backend)
    for _ in range(reps):
        sql, params = insert_sql(_records(rows, make_id))
        t = time.perf_counter()
        cur.execute(sql, params)
        walls.append((time.perf_counter() - t) * 1000)
    cpu = _cpu_ms(backend) - cpu0
    cur.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (wal0,))
    wal = float(cur.fetchone()[0])
    walls.sort()
    return {"wall_median_ms": round(statistics.median(walls), 2), "wall_p90_ms": round(walls[int(len(walls) * 0.9)], 2),
            "backend_cpu_ms_per_batch": round(cpu / reps, 2), "wal_kib_per_batch": round(wal / 1024 / reps, 1)}


def _fill(cur: Any, rows: int, make_id: Callable[[], str]) -> None:
    """``rows`` records in ``calls`` (the indexes of a realistic size), then a checkpoint: the batches
    measured after it pay what the first write of a page after a checkpoint costs, as a server does."""
    from treg.call.audit import insert_sql

    for _ in range(rows // 500):
        sql, params = insert_sql(_records(500, make_id))
        cur.execute(sql, params)
    cur.execute("CHECKPOINT")


def _apply(cur: Any, variant: str) -> None:
    if variant == "syncoff":
        cur.execute("SET synchronous_commit = off")
    elif variant == "nofk":
        cur.execute("ALTER TABLE calls DROP CONSTRAINT IF EXISTS calls_org_id_fkey")
    elif variant == "truncate":
        cur.execute("TRUNCATE calls")
    elif variant.startswith("drop:"):
        cur.execute(f"DROP INDEX {variant[5:]}")
    else:  # main() refused anything else before the server started
        raise AssertionError(variant)


def main(argv: list[str] | None = None) -> list[tuple[str, dict[str, float]]]:
    ap = argparse.ArgumentParser(prog="python -m bench.audit_insert", description=__doc__.split("\n\n")[0])
    ap.add_argument("--fill", type=int, default=100_000, help="rows in calls before measuring")
    ap.add_argument("--rows", type=int, default=200, help="records per batch (the benchmark's c=1 batches: ~200)")
    ap.add_argument("--reps", type=int, default=60, help="batches measured per line")
    ap.add_argument("--variant", action="append", default=[], help="applied in order, each then measured")
    opts = ap.parse_args(argv)
    for v in opts.variant:  # refuse a bad one before a server is started
        if v not in ("syncoff", "nofk", "truncate", "randomids") and not (v.startswith("drop:") and v[5:].replace("_", "").isalnum()):
            ap.error(f"unknown variant {v!r} (syncoff, nofk, truncate, randomids, drop:<index>)")

    import psycopg2

    from treg.ids import new_call_id, new_id
    from treg.infra import embedded_pg, migrate

    make_id: Callable[[], str] = new_call_id

    results: list[tuple[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory(prefix="treg-audit-insert-") as tmp:
        server = embedded_pg.start(Path(tmp) / "pg")
        try:
            dsn = server.ensure_database()
            migrate.upgrade(dsn)
            conn = psycopg2.connect(dsn)
            conn.autocommit = True  # as the audit writer's: each batch its own transaction
            try:
                cur = conn.cursor()
                cur.execute("INSERT INTO orgs (id, slug) VALUES ('org_bench', 'bench')")
                cur.execute("SELECT pg_backend_pid()")
                backend = cur.fetchone()[0]
                _fill(cur, opts.fill, make_id)
                for label, variant in [("as shipped", None), *((f"+ {v}", v) for v in opts.variant)]:
                    if variant == "randomids":
                        make_id = lambda: new_id("call")  # noqa: E731
                        cur.execute("TRUNCATE calls")
                        _fill(cur, opts.fill, make_id)
                    elif variant:
                        _apply(cur, variant)
                    figures = _measure(cur, backend, opts.rows, opts.reps, make_id)
                    results.append((label, figures))
                    print(f"{label:48s} wall median {figures['wall_median_ms']:6.2f} ms  p90 "
                          f"{figures['wall_p90_ms']:6.2f} ms  backend CPU {figures['backend_cpu_ms_per_batch']:6.2f} ms  "
                          f"WAL {figures['wal_kib_per_batch']:7.1f} KiB",
                          flush=True)
            finally:
                conn.close()
        finally:
            server.stop()
    return results


if __name__ == "__main__":
    main()
