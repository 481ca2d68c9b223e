"""Migration 0005 creates exactly the capacity/overflow tables of treg/infra/schema.py, and reverses."""

from __future__ import annotations

from treg.testing import assert_schema_matches, assert_up_down_up

TABLES = {"capacity_keys", "overflow_spend", "overflow_health"}


def test_schema_matches_migration(dsn):
    assert_schema_matches(dsn, TABLES)


def test_0005_up_down_up(pg_base):
    assert_up_down_up(pg_base, "0005", "0005_capacity", TABLES)
