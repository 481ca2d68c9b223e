"""``treg db backup`` / ``treg db restore``: PostgreSQL's own ``pg_dump`` and ``pg_restore``.

A dump is pg_dump's custom format, taken in one snapshot (pg_dump's own guarantee: consistent while
treg keeps serving). Secrets are in it as the encrypted blobs they are at rest: a restore is readable
with the same master key, and only with it (the key is not in the dump; back it up separately).
Ownership and grants are left out, so a dump restores into a database of another user.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import psycopg2
import psycopg2.extensions

from treg.errors import ConfigError, DatabaseError

#: a restore refuses a database holding any relation outside PostgreSQL's own schemas
_USER_RELATIONS = ("SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                   "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%%'")


class RestoreTargetNotEmpty(ConfigError):
    code = "restore_target_not_empty"


def _major(binary: str) -> int:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30).stdout
    found = re.search(r"(\d+)(?:\.\d+)?", out)
    return int(found.group(1)) if found else 0


def find_binary(name: str) -> str:
    """The newest ``name`` (pg_dump / pg_restore) of the system's and the ``pgserver`` wheel's: a dump
    needs a pg_dump at least as new as the server."""
    candidates = []
    if shutil.which(name):
        candidates.append(shutil.which(name))
    for base in sorted(Path("/usr/lib/postgresql").glob("*/bin")):
        if (base / name).exists():
            candidates.append(str(base / name))
    try:
        from pgserver._commands import POSTGRES_BIN_PATH  # type: ignore[import-not-found]
    except ImportError:
        pass
    else:
        if (POSTGRES_BIN_PATH / name).exists():
            candidates.append(str(POSTGRES_BIN_PATH / name))
    if not candidates:
        raise ConfigError(f"no {name} found: install PostgreSQL's client tools (e.g. apt-get install "
                          "postgresql-client) or the `pgserver` wheel", code="pg_tools_missing")
    return max(dict.fromkeys(candidates), key=_major)


def _conninfo(dsn: str) -> tuple[str, dict[str, str]]:
    """``dsn`` without its password, and an environment carrying it: a password on a command line is
    visible to every user of the machine (``ps``)."""
    try:
        params = psycopg2.extensions.parse_dsn(dsn)
    except psycopg2.ProgrammingError as exc:
        raise ConfigError("TREG_DATABASE_URL is not a PostgreSQL URL or DSN", code="bad_setting") from exc
    env = {k: v for k, v in os.environ.items() if not k.startswith("TREG_")}
    password = params.pop("password", None)
    if password:
        env["PGPASSWORD"] = password
    return psycopg2.extensions.make_dsn(**params), env


def _run(argv: list[str], env: dict[str, str], what: str) -> None:
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = proc.stderr.strip()[-1500:]
        raise DatabaseError(f"{what} failed (exit {proc.returncode}): {tail}", code="backup_failed")


def backup(dsn: str, file: Path, progress: Callable[[str], None]) -> int:
    """Dump the database at ``dsn`` into ``file`` (written beside it, then renamed); returns its size."""
    conninfo, env = _conninfo(dsn)
    pg_dump = find_binary("pg_dump")
    file = file.expanduser()
    tmp = file.with_name(file.name + ".partial")
    progress(f"dumping the database with {pg_dump}")
    try:
        _run([pg_dump, "--format=custom", "--no-owner", "--no-privileges", f"--file={tmp}", f"--dbname={conninfo}"],
             env, "pg_dump")
        os.replace(tmp, file)  # a dump cut short never takes the name of a good one
    finally:
        tmp.unlink(missing_ok=True)
    size = file.stat().st_size
    progress(f"wrote {file} ({size} bytes)")
    return size


def relation_count(dsn: str) -> int:
    try:
        conn = psycopg2.connect(dsn)
    except psycopg2.OperationalError as exc:
        raise DatabaseError(f"cannot reach the database to restore into: {str(exc).strip()}",
                            code="database_unavailable") from exc
    try:
        with conn.cursor() as cur:
            cur.execute(_USER_RELATIONS)
            return int(cur.fetchone()[0])
    finally:
        conn.close()


def restore(dsn: str, file: Path, progress: Callable[[str], None]) -> None:
    """Restore ``file`` (a ``treg db backup``) into the empty database at ``dsn``, in one transaction."""
    file = file.expanduser()
    if not file.is_file():
        raise ConfigError(f"no backup file {file}", code="backup_missing")
    found = relation_count(dsn)
    if found:
        raise RestoreTargetNotEmpty(
            f"the database to restore into is not empty ({found} tables, sequences or other relations): restore "
            "only into an empty database (create a new one, point TREG_DATABASE_URL or TREG_HOME at it)")
    conninfo, env = _conninfo(dsn)
    pg_restore = find_binary("pg_restore")
    progress(f"restoring {file} with {pg_restore}")
    _run([pg_restore, "--no-owner", "--no-privileges", "--exit-on-error", "--single-transaction",
          f"--dbname={conninfo}", str(file)], env, "pg_restore")
    progress(f"restored {relation_count(dsn)} relations")
