"""Migration 0002 matches the money tables of treg.infra.schema and downgrades cleanly."""

from __future__ import annotations

from treg.testing import assert_schema_matches, assert_up_down_up

MONEY_TABLES = {"org_balances", "credit_grants", "holds", "money_daily", "member_caps", "tag_budgets",
                "idempotency_keys"}


def test_schema_matches_migration(dsn):
    assert_schema_matches(dsn, MONEY_TABLES)


def test_0002_up_down_up(pg_base):
    assert_up_down_up(pg_base, "0002", "0002_money", MONEY_TABLES)
