"""treg's database for the run, and the few figures read from it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator


def db_scalar(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> int | None:
    """One integer from treg's database on a short connection of its own; None when it cannot be read."""
    import psycopg2

    try:
        conn = psycopg2.connect(dsn)
    except psycopg2.Error:
        return None
    try:
        with conn.cursor() as cur:
            cur.execute(sql, params)
            row = cur.fetchone()
            return int(row[0]) if row else None
    except psycopg2.Error:
        return None
    finally:
        conn.close()


async def db_xacts(dsn: str) -> int | None:
    """Transactions committed or rolled back in treg's database so far (pg_stat_database)."""
    sql = "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
    return await asyncio.get_running_loop().run_in_executor(None, db_scalar, dsn, sql)


def count_calls(dsn: str, org_id: str) -> int | None:
    return db_scalar(dsn, "SELECT count(*) FROM calls WHERE org_id = %s", (org_id,))


@dataclass(frozen=True)
class BenchDatabase:
    dsn: str
    #: the postmaster's pid when the benchmark started the server itself (its own embedded one), else
    #: None: only a server of its own may have its processes moved
    postmaster: int | None = None

    @property
    def owned(self) -> bool:
        return self.postmaster is not None


@contextlib.contextmanager
def bench_database(opts: argparse.Namespace, workdir: Path) -> Iterator[BenchDatabase]:
    """``--dsn``, else ``TREG_DATABASE_URL`` (neither is ours), else an embedded server of the run's own
    under ``workdir``, stopped afterwards.

    Not the test suite's embedded server: pinning PostgreSQL moves every process of the server, and a
    test session (or another checkout's) using that server would run pinned meanwhile."""
    if opts.dsn:
        yield BenchDatabase(opts.dsn)
        return
    if os.environ.get("TREG_DATABASE_URL"):
        yield BenchDatabase(os.environ["TREG_DATABASE_URL"])
        return
    from treg.infra import embedded_pg

    server = embedded_pg.start(workdir / "pg")
    try:
        dsn = server.ensure_database()
        # the data folder names its postmaster (first line of postmaster.pid): no guessing from a
        # backend's pid, whose process is gone once the connection that asked for it closed
        postmaster = int((workdir / "pg" / "postmaster.pid").read_text().split("\n", 1)[0])
        yield BenchDatabase(dsn, postmaster)
    finally:
        server.stop()
