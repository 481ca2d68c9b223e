"""Migration 0002 matches the money tables of treg.infra.schema and downgrades cleanly."""

from __future__ import annotations

import secrets

import psycopg2
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from treg import testing
from treg.infra import migrate
from treg.infra.schema import metadata

MONEY_TABLES = {"org_balances", "credit_grants", "holds", "money_daily", "member_caps", "tag_budgets",
                "idempotency_keys"}


def _table_of(diff: object) -> str | None:
    item = diff[0] if isinstance(diff, list) else diff
    for part in item[1:] if isinstance(item, tuple) else ():
        name = getattr(part, "name", None) if not isinstance(part, str) else part
        table = getattr(part, "table", None)
        if table is not None:
            return table.name
        if isinstance(name, str) and name in MONEY_TABLES:
            return name
    return None


def test_schema_matches_migration(dsn):
    with migrate.engine_for(dsn).connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), metadata)
        assert MONEY_TABLES <= set(inspect(conn).get_table_names())
    mine = [d for d in diffs if _table_of(d) in MONEY_TABLES]
    assert mine == []


def test_0002_up_down_up(pg_base):
    name = f"treg_t_mig_{secrets.token_hex(4)}"
    admin = psycopg2.connect(pg_base)
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        dsn = testing.dsn_for(pg_base, name)
        migrate.upgrade(dsn, "0002")
        migrate.downgrade(dsn, "0001")
        with migrate.engine_for(dsn).connect() as conn:
            assert not MONEY_TABLES & set(inspect(conn).get_table_names())
        migrate.upgrade(dsn, "0002")
        with migrate.engine_for(dsn).connect() as conn:
            assert MONEY_TABLES <= set(inspect(conn).get_table_names())
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()
