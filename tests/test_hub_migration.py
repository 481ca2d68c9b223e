"""Migration 0019 matches the hub's tables and the calls table's key (id, org_id) in treg.infra.schema,
installs treg_hub_take, and downgrades cleanly: a hub call's second row (the publisher's) is dropped,
the caller's kept, so the key can be the id alone again."""

from __future__ import annotations

import importlib

import psycopg2

from treg.infra import migrate
from treg.testing import assert_schema_matches, assert_up_down_up, empty_database

HUB_TABLES = {"hub_tools", "hub_runs"}
#: the revision before the hub's (the downgrade's target)
BEFORE_HUB = importlib.import_module("treg_migrations.versions.0019_hub").down_revision


def test_schema_matches_migration(dsn):
    assert_schema_matches(dsn, HUB_TABLES | {"calls"})


def test_0019_up_down_up(pg_base):
    assert_up_down_up(pg_base, "0019", "0019_hub", HUB_TABLES, columns={"calls": ("hub_ref", "hub_caller_org")})


def _run(dsn, sql, *args):
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall() if cur.description else None
    finally:
        conn.close()


def test_a_hub_calls_two_rows_share_an_id_and_the_downgrade_keeps_the_callers(pg_base):
    with empty_database(pg_base) as dsn:
        migrate.upgrade(dsn, "0019")
        _run(dsn, "INSERT INTO orgs (id, slug) VALUES ('org_a', 'a'), ('org_b', 'b')")
        insert = ("INSERT INTO calls (id, org_id, surface, method, target, outcome, hub_ref, hub_caller_org) "
                  "VALUES (%s, %s, 'hub', 'GET', 'b.t/x', 'ok', 'b.t', %s)")
        _run(dsn, insert, "call_1", "org_a", None)  # the caller's row
        _run(dsn, insert, "call_1", "org_b", "a")  # the publisher's, same id
        _run(dsn, insert, "call_2", "org_b", "b")  # an org calling its own ref: one row
        assert _run(dsn, "SELECT count(*) FROM calls")[0][0] == 3
        assert _run(dsn, "SELECT treg_hub_take('call_3', 'org_b', 'hub_1', 'org_a', 'p', 1, NULL, 30)") is not None
        assert _run(dsn, "SELECT refused, active, limit_runs FROM treg_hub_take('call_4', 'org_b', 'hub_1', "
                         "'org_a', 'p', 1, NULL, 30)") == [("team", 1, 1)]
        migrate.downgrade(dsn, BEFORE_HUB)
        assert sorted(_run(dsn, "SELECT id, org_id FROM calls")) == [("call_1", "org_a"), ("call_2", "org_b")]
