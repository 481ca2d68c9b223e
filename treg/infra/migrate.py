"""Schema migrations: alembic, driven programmatically with a short synchronous psycopg2 connection."""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any

import psycopg2
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from treg.errors import DatabaseError


def _alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(resources.files("treg_migrations")))
    return cfg


def engine_for(dsn: str) -> Engine:
    return create_engine("postgresql+psycopg2://", creator=lambda: psycopg2.connect(dsn), poolclass=NullPool)


def engine_for_settings() -> Engine:  # pragma: no cover - only for the bare `alembic` CLI
    from treg.infra.database_url import resolve_dsn
    from treg.settings import load

    return engine_for(resolve_dsn(load()))


def _run(dsn: str, fn: Any, *args: Any) -> None:
    cfg = _alembic_config()
    try:
        with engine_for(dsn).begin() as conn:
            cfg.attributes["connection"] = conn
            fn(cfg, *args)
    except psycopg2.OperationalError as exc:
        raise DatabaseError(f"cannot reach the database to migrate it: {exc}".strip(), code="database_unavailable") from exc


@functools.lru_cache(maxsize=1)
def head_revision() -> str | None:
    return ScriptDirectory.from_config(_alembic_config()).get_current_head()


def _current_revision(dsn: str) -> str | None:
    try:
        conn = psycopg2.connect(dsn)
    except psycopg2.OperationalError as exc:
        raise DatabaseError(f"cannot reach the database to migrate it: {exc}".strip(),
                            code="database_unavailable") from exc
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT to_regclass('alembic_version') IS NOT NULL")
            if not cur.fetchone()[0]:
                return None
            cur.execute("SELECT version_num FROM alembic_version")
            row = cur.fetchone()
            return row[0] if row else None
    finally:
        conn.close()


def upgrade(dsn: str, revision: str = "head") -> None:
    # an up-to-date database (every start after the first) skips alembic's environment entirely
    if revision == "head" and _current_revision(dsn) == head_revision():
        return
    _run(dsn, command.upgrade, revision)


def downgrade(dsn: str, revision: str) -> None:
    _run(dsn, command.downgrade, revision)


def revision(dsn: str, message: str) -> None:
    """Autogenerate a migration against the database (developers only)."""
    _run(dsn, lambda cfg: command.revision(cfg, message=message, autogenerate=True))


def current_and_head(dsn: str) -> tuple[str | None, str | None]:
    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    with engine_for(dsn).connect() as conn:
        current = MigrationContext.configure(conn).get_current_revision()
    return current, head
