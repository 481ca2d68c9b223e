"""An embedded PostgreSQL under ``$TREG_HOME/pg`` for a treg with no ``TREG_DATABASE_URL``.

The ``pgserver`` wheel ships PostgreSQL binaries; it initialises the data folder on first use, reuses
it afterwards, talks over a unix socket inside the folder (no port to collide with) and stops the
server when the last process using it exits: several treg processes may share one ``TREG_HOME``.
pgserver counts its users in ``.handle_pids.json`` in the folder; a user killed outright (SIGKILL,
OOM) never removes itself, so treg drops dead pids from that list when it joins and when it leaves,
or the server would outlive its last real user. Without the wheel, ``initdb``/``pg_ctl`` found on the
system do the same job. Neither available: a clear error says what to install.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from treg.errors import ConfigError

log = logging.getLogger(__name__)

DATABASE = "treg"


@dataclass
class EmbeddedPostgres:
    """A running embedded server: ``dsn`` for a database on it, ``stop()`` to shut it down."""

    base_dsn: str  # libpq DSN of the maintenance database
    _stop: Callable[[], None]
    kind: str

    def dsn(self, database: str = DATABASE) -> str:
        return self.base_dsn.replace("dbname=postgres", f"dbname={database}")

    def stop(self) -> None:
        self._stop()

    def ensure_database(self, name: str = DATABASE) -> str:
        import psycopg2
        import psycopg2.errors

        conn = psycopg2.connect(self.base_dsn)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                if cur.fetchone() is None:
                    try:
                        cur.execute(f'CREATE DATABASE "{name}"')
                    except (psycopg2.errors.DuplicateDatabase, psycopg2.errors.UniqueViolation):
                        pass  # another treg process sharing this home created it first
        finally:
            conn.close()
        return self.dsn(name)


def _uri_to_dsn(uri: str) -> str:
    # pgserver hands back postgresql://postgres:@/postgres?host=/path; libpq keyword form is clearer.
    from urllib.parse import parse_qs, urlsplit

    parts = urlsplit(uri)
    host = parse_qs(parts.query).get("host", [parts.hostname or "127.0.0.1"])[0]
    user = parts.username or "postgres"
    port = f" port={parts.port}" if parts.port else ""
    return f"host={host}{port} user={user} dbname=postgres"


#: pgserver's list of the processes using a data folder
HANDLES = ".handle_pids.json"


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def drop_dead_handles(pg_dir: Path, lock: Any) -> list[int]:
    """Remove pids of processes that are gone from pgserver's user list (under pgserver's own
    inter-process lock); returns the pids left."""
    path = pg_dir / HANDLES
    with lock:
        try:
            pids = [int(p) for p in json.loads(path.read_text())]
        except (OSError, ValueError, TypeError):
            return []  # no list yet (or unreadable: pgserver rewrites it)
        alive = [p for p in pids if p == os.getpid() or process_alive(p)]
        if alive != pids:
            log.info("embedded PostgreSQL: dropped %d dead user(s) from %s", len(pids) - len(alive), path)
            path.write_text(json.dumps(alive))
    return alive


def _start_pgserver(pg_dir: Path) -> EmbeddedPostgres | None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        try:
            import pgserver  # type: ignore[import-not-found]
            from pgserver.postgres_server import PostgresServer  # type: ignore[import-not-found]
        except ImportError:
            return None
        lock = PostgresServer._lock
        # made here, idempotently: pgserver makes a missing folder with exist_ok=False after testing that
        # it is missing, so of two processes starting at once on a fresh home, one failed "File exists"
        pg_dir.mkdir(exist_ok=True, mode=0o700)
        drop_dead_handles(pg_dir.resolve(), lock)
        server: Any = pgserver.get_server(pg_dir, cleanup_mode="stop")
    # atexit runs last-in first-out: this runs before pgserver's own exit hook (registered by
    # get_server), so a user killed outright does not keep the server up after the last live one
    atexit.register(drop_dead_handles, server.pgdata, lock)
    return EmbeddedPostgres(_uri_to_dsn(server.get_uri()), server.cleanup, "pgserver")


def _start_system(pg_dir: Path) -> EmbeddedPostgres | None:
    initdb, pg_ctl = shutil.which("initdb"), shutil.which("pg_ctl")
    if not (initdb and pg_ctl):
        for candidate in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
            if (candidate / "initdb").exists():
                initdb, pg_ctl = str(candidate / "initdb"), str(candidate / "pg_ctl")
                break
    if not (initdb and pg_ctl):
        return None
    prefix: list[str] = []
    if os.geteuid() == 0:
        # PostgreSQL refuses to run as root; run it as the distribution's postgres user.
        if shutil.which("runuser") is None:
            return None
        prefix = ["runuser", "-u", "postgres", "--"]
        pg_dir.mkdir(parents=True, exist_ok=True)
        shutil.chown(pg_dir, "postgres")
    pg_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not (pg_dir / "PG_VERSION").exists():
        subprocess.run(prefix + [initdb, "-D", str(pg_dir), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
                       check=True, capture_output=True)
    running = subprocess.run(prefix + [pg_ctl, "-D", str(pg_dir), "status"], capture_output=True).returncode == 0
    if not running:
        subprocess.run(prefix + [pg_ctl, "-D", str(pg_dir), "-w", "-l", str(pg_dir / "log"), "-o",
                                 f"-k {pg_dir} -c listen_addresses=''", "start"], check=True, capture_output=True)

    def stop() -> None:
        subprocess.run(prefix + [pg_ctl, "-D", str(pg_dir), "-m", "fast", "-w", "stop"], capture_output=True)

    return EmbeddedPostgres(f"host={pg_dir} user=postgres dbname=postgres", stop, "system")


def start(pg_dir: Path) -> EmbeddedPostgres:
    """Start (or reuse) the embedded server in ``pg_dir``."""
    pg_dir = pg_dir.expanduser()
    pg_dir.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    for starter in (_start_pgserver, _start_system):
        try:
            server = starter(pg_dir)
        except (OSError, subprocess.CalledProcessError) as exc:
            stderr = getattr(exc, "stderr", b"") or b""
            raise ConfigError(f"could not start the embedded PostgreSQL in {pg_dir}: {exc} "
                              f"{stderr.decode(errors='replace')[-500:]}", code="embedded_db_failed") from exc
        if server is not None:
            log.info("embedded PostgreSQL (%s) ready in %.1fs at %s", server.kind, time.monotonic() - started, pg_dir)
            return server
    raise ConfigError(
        "no PostgreSQL available: set TREG_DATABASE_URL, or install the `pgserver` wheel "
        "(pip install pgserver) or PostgreSQL's server binaries (initdb, pg_ctl; e.g. apt-get install postgresql)",
        code="embedded_db_missing")
