"""Test databases: one migrated template per test session, a private clone per test.

The server is ``TREG_TEST_DATABASE_URL``, else an embedded PostgreSQL under :func:`test_home`.
"""

from __future__ import annotations

import contextlib
import os
import secrets as pysecrets
from pathlib import Path
from typing import Any, Iterator

import psycopg2
import psycopg2.extensions

from treg.infra import embedded_pg, migrate


def template_db() -> str:
    # one template per test session: parallel sessions on one server must not drop each other's
    return f"treg_test_template_{os.getpid()}"


def checkout_root() -> Path | None:
    """The source checkout this treg runs from, or None when it is installed (from a wheel)."""
    root = Path(__file__).resolve().parents[2]
    # an installed treg sits in site-packages, which has neither file: a checkout has both
    if (root / "pyproject.toml").is_file() and (root / "tests" / "conftest.py").is_file():
        return root
    return None


def test_home() -> Path:
    """Where the embedded test server lives: ``TREG_TEST_HOME``, else ``.test-home`` in a checkout,
    else a per-user cache folder (``$XDG_CACHE_HOME/treg-test``, ``~/.cache/treg-test``): an installed
    treg must not write beside site-packages."""
    if os.environ.get("TREG_TEST_HOME"):
        return Path(os.environ["TREG_TEST_HOME"]).expanduser()
    root = checkout_root()
    if root is not None:
        return root / ".test-home"
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(cache).expanduser() / "treg-test"


def base_dsn() -> str:
    """The maintenance DSN of the test server: TREG_TEST_DATABASE_URL, else the embedded server."""
    url = os.environ.get("TREG_TEST_DATABASE_URL")
    if url:
        return url
    return embedded_pg.start(test_home() / "pg").base_dsn


def dsn_for(base: str, dbname: str) -> str:
    return psycopg2.extensions.make_dsn(base, dbname=dbname)


def run_sql(dsn: str, query: str, *args: Any) -> list[tuple[Any, ...]]:
    """One statement on its own connection, committed (a test moving the database's state from outside
    treg, as an operator or another process would: a counter's day moved back, a row aged); its rows, if
    it returns any."""
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(query, args)
            return cur.fetchall() if cur.description else []
    finally:
        conn.close()


#: a fault put in a test's database: every close of a hold fails with the given SQLSTATE while the flag
#: row exists, as a database that is down, or a statement timeout, fails it — an UPDATE of a hold's state
#: (``treg_close_holds``) and the INSERT of a leased call's closed row (``treg_close_leased``) alike
_CLOSE_FAULT = """
CREATE TABLE IF NOT EXISTS test_close_fault (code text NOT NULL, hold_id text);
CREATE OR REPLACE FUNCTION test_close_fault() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE c text;
BEGIN
    SELECT code INTO c FROM test_close_fault WHERE hold_id IS NULL OR hold_id = NEW.id LIMIT 1;
    IF c IS NOT NULL AND NEW.state <> 'held' THEN
        RAISE EXCEPTION 'the close of %% fails (test fault)', NEW.id USING ERRCODE = c;
    END IF;
    RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS test_close_fault ON holds;
CREATE TRIGGER test_close_fault BEFORE INSERT OR UPDATE ON holds FOR EACH ROW EXECUTE FUNCTION test_close_fault();
"""


def hold_close_fault(dsn: str, code: str | None, *hold_ids: str) -> None:
    """Closes of holds (of ``hold_ids`` only, when given) fail with SQLSTATE ``code`` from now on (None:
    they work again)."""
    run_sql(dsn, _CLOSE_FAULT)
    run_sql(dsn, "DELETE FROM test_close_fault")
    for hold_id in hold_ids or (None,):
        if code is not None:
            run_sql(dsn, "INSERT INTO test_close_fault VALUES (%s, %s)", code, hold_id)


def _admin(base: str) -> Any:
    conn = psycopg2.connect(base)
    conn.autocommit = True
    return conn


def _drop_orphans(cur: Any) -> None:
    """Drop test databases whose session's process is gone (a killed run leaves them behind)."""
    cur.execute("SELECT datname FROM pg_database WHERE datname LIKE 'treg\\_test\\_template\\_%%' "
                "OR datname LIKE 'treg\\_t\\_%%'")
    for (name,) in cur.fetchall():
        pid = name.rsplit("_", 1)[-1] if name.startswith("treg_test_template_") else name.split("_")[2]
        if pid.isdigit() and int(pid) != os.getpid() and not Path(f"/proc/{pid}").exists():
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def prepare_template(base: str) -> None:
    """(Re)create the migrated template database every test database is cloned from."""
    conn = _admin(base)
    try:
        with conn.cursor() as cur:
            _drop_orphans(cur)
            cur.execute(f'DROP DATABASE IF EXISTS "{template_db()}" WITH (FORCE)')
            cur.execute(f'CREATE DATABASE "{template_db()}"')
    finally:
        conn.close()
    migrate.upgrade(dsn_for(base, template_db()))


def drop_template(base: str) -> None:
    conn = _admin(base)
    try:
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{template_db()}" WITH (FORCE)')
    finally:
        conn.close()


@contextlib.contextmanager
def fresh_database(base: str) -> Iterator[str]:
    """A private database cloned from the template (each test isolated), dropped afterwards."""
    with _private_database(base, f' TEMPLATE "{template_db()}"') as dsn:
        yield dsn


@contextlib.contextmanager
def empty_database(base: str) -> Iterator[str]:
    """A database with nothing in it (a migration test upgrades it itself), dropped afterwards."""
    with _private_database(base, "") as dsn:
        yield dsn


@contextlib.contextmanager
def _private_database(base: str, create_options: str) -> Iterator[str]:
    name = f"treg_t_{os.getpid()}_{pysecrets.token_hex(6)}"  # the pid lets a later session drop orphans
    conn = _admin(base)
    try:
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"{create_options}')
        yield dsn_for(base, name)
    finally:
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.close()
