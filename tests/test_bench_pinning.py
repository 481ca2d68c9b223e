"""The benchmark moves PostgreSQL's processes only when it started that server itself.

``--pin auto`` puts the load generator, the upstream and PostgreSQL on the CPUs the relay under test
does not use. A server handed to the run (``--dsn``, ``TREG_DATABASE_URL``: the test session's own, a
shared ``TREG_TEST_DATABASE_URL``) may serve others meanwhile, and pinning its postmaster would pin
every backend it forks for them too.
"""

from __future__ import annotations

import argparse
import os

import psycopg2
import pytest

from bench.database import BenchDatabase, bench_database
from bench.pinning import _parent, database_pinned

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                                reason="pinning needs two CPUs or more")


def postmaster_of(dsn: str) -> int:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            return _parent(cur.fetchone()[0])
    finally:
        conn.close()


def other_cpus(current: set[int]) -> set[int]:
    """A placement differing from ``current`` (one CPU of it, or all when it holds one)."""
    return {min(current)} if len(current) > 1 else set(os.sched_getaffinity(0))


def test_a_server_given_to_the_run_is_left_where_it_was(dsn: str):
    postmaster = postmaster_of(dsn)
    before = os.sched_getaffinity(postmaster)
    with database_pinned(BenchDatabase(dsn), other_cpus(before)):
        assert os.sched_getaffinity(postmaster) == before
    assert os.sched_getaffinity(postmaster) == before


def test_the_runs_own_server_is_pinned_then_put_back(tmp_path, monkeypatch):
    monkeypatch.delenv("TREG_DATABASE_URL", raising=False)
    with bench_database(argparse.Namespace(dsn=None), tmp_path) as db:
        postmaster = postmaster_of(db.dsn)
        assert db.postmaster == postmaster
        before = os.sched_getaffinity(postmaster)
        target = other_cpus(before)
        assert target != before
        with database_pinned(db, target):
            assert os.sched_getaffinity(postmaster) == target
        assert os.sched_getaffinity(postmaster) == before
