"""Migration 0005 creates exactly the capacity/overflow tables of treg/infra/schema.py, and reverses."""

from __future__ import annotations

import importlib
import secrets

import psycopg2
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from test_money_migration import _table_of
from treg import testing
from treg.infra import migrate
from treg.infra.schema import metadata

TABLES = {"capacity_keys", "overflow_spend", "overflow_health"}


def test_schema_matches_migration(dsn, monkeypatch):
    monkeypatch.setattr("test_money_migration.MONEY_TABLES", TABLES)  # _table_of recognises these names
    with migrate.engine_for(dsn).connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), metadata)
        assert TABLES <= set(inspect(conn).get_table_names())
    assert [d for d in diffs if _table_of(d) in TABLES] == []


def test_0005_up_down_up(pg_base):
    name = f"treg_t_mig_{secrets.token_hex(4)}"
    admin = psycopg2.connect(pg_base)
    admin.autocommit = True
    try:
        with admin.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        dsn = testing.dsn_for(pg_base, name)
        migrate.upgrade(dsn, "0005")
        down = importlib.import_module("treg_migrations.versions.0005_capacity").down_revision
        migrate.downgrade(dsn, down)
        with migrate.engine_for(dsn).connect() as conn:
            assert not TABLES & set(inspect(conn).get_table_names())
        migrate.upgrade(dsn, "0005")
        with migrate.engine_for(dsn).connect() as conn:
            assert TABLES <= set(inspect(conn).get_table_names())
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()
