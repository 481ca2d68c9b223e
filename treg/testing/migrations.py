"""Migrations under test: a migration's tables against treg/infra/schema.py, and a revision
upgraded, downgraded and upgraded again on a database of its own."""

from __future__ import annotations

import importlib
from typing import Collection, Mapping

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from treg.infra import migrate
from treg.infra.schema import metadata
from treg.testing.databases import empty_database


def table_of(diff: object, tables: Collection[str]) -> str | None:
    """The table an alembic autogenerate diff is about, when it names one of ``tables`` or any table."""
    item = diff[0] if isinstance(diff, list) else diff
    for part in item[1:] if isinstance(item, tuple) else ():
        name = getattr(part, "name", None) if not isinstance(part, str) else part
        table = getattr(part, "table", None)
        if table is not None:
            return table.name
        if isinstance(name, str) and name in tables:
            return name
    return None


def table_names(dsn: str) -> set[str]:
    with migrate.engine_for(dsn).connect() as conn:
        return set(inspect(conn).get_table_names())


def assert_schema_matches(dsn: str, tables: Collection[str]) -> None:
    """The migrated database at ``dsn`` has ``tables`` exactly as treg/infra/schema.py declares them."""
    with migrate.engine_for(dsn).connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), metadata)
    assert set(tables) <= table_names(dsn)
    assert [d for d in diffs if table_of(d, tables) in tables] == []


def column_names(dsn: str, table: str) -> set[str]:
    with migrate.engine_for(dsn).connect() as conn:
        return {c["name"] for c in inspect(conn).get_columns(table)}


def assert_up_down_up(pg_base: str, revision: str, module: str, tables: Collection[str],
                      columns: Mapping[str, Collection[str]] | None = None) -> None:
    """``revision`` (file ``treg_migrations.versions.<module>``) creates ``tables`` (and adds
    ``columns`` to existing tables), its downgrade drops them, and it upgrades again, on an empty
    database of its own."""
    down = importlib.import_module(f"treg_migrations.versions.{module}").down_revision
    columns = columns or {}
    with empty_database(pg_base) as dsn:
        migrate.upgrade(dsn, revision)
        migrate.downgrade(dsn, down)
        assert not set(tables) & table_names(dsn)
        for table, added in columns.items():
            assert not set(added) & column_names(dsn, table)
        migrate.upgrade(dsn, revision)
        assert set(tables) <= table_names(dsn)
        for table, added in columns.items():
            assert set(added) <= column_names(dsn, table)
