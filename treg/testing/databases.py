"""Test databases: one migrated template per test session, a private clone per test (:class:`TemplateClones`).

The server is ``TREG_TEST_DATABASE_URL``, else an embedded PostgreSQL in :func:`server_dir`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets as pysecrets
import shutil
import stat
from concurrent.futures import Future, ThreadPoolExecutor
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
    """The embedded test server's home: ``TREG_TEST_HOME``, else ``.test-home`` in a checkout, else a
    per-user cache folder (``$XDG_CACHE_HOME/treg-test``, ``~/.cache/treg-test``): an installed treg must
    not write beside site-packages. Its data is in the home's ``pg`` folder, or in RAM (:func:`server_dir`)."""
    if os.environ.get("TREG_TEST_HOME"):
        return Path(os.environ["TREG_TEST_HOME"]).expanduser()
    root = checkout_root()
    if root is not None:
        return root / ".test-home"
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path("~/.cache").expanduser())
    return Path(cache).expanduser() / "treg-test"


#: where a machine keeps files in RAM (Linux's tmpfs), and the room it must have for the test server
#: (its template, a few clones and up to PostgreSQL's max_wal_size of WAL, 1 GiB): a container's default
#: /dev/shm of 64 MiB would fill, so the server stays on disk there
_RAM_ROOT = Path("/dev/shm")
_RAM_ROOM = 2 << 30


def server_dir(ram_root: Path = _RAM_ROOT, room: int = _RAM_ROOM) -> Path:
    """The embedded test server's data folder: ``<test_home()>/pg``, except that the default home (no
    ``TREG_TEST_HOME``) on a machine with room in RAM (``ram_root`` writable, ``room`` bytes free) keeps it
    there, in a folder of this user's named for the home.

    Why: every test clones a database from the template and drops it, some 430 files made and deleted
    each time. On ext4 the inode allocator, passing over the inodes just freed, made one ``CREATE
    DATABASE`` cost 170–420 ms of kernel CPU, against 11–18 ms in RAM: most of the suite's time
    (docs/performance.md, "The test suite's time"). A server in RAM is gone after a reboot; the next
    session makes it again in a few seconds. ``TREG_TEST_HOME`` keeps it where it says."""
    home = test_home()
    if os.environ.get("TREG_TEST_HOME") or not _has_room(ram_root, room):
        return home / "pg"
    named = hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:12]
    return ram_root / f"treg-test-{os.getuid()}-{named}" / "pg"


def _has_room(root: Path, room: int) -> bool:
    try:
        fs = os.statvfs(root)
    except OSError:  # no such folder (macOS, Windows): the disk it is
        return False
    return os.access(root, os.W_OK) and fs.f_bavail * fs.f_frsize >= room


def claim_ram_folder(folder: Path, home: Path) -> None:
    """Note in ``folder`` (a :func:`server_dir` in RAM, without its ``pg``) the home it serves, and remove
    this user's other such folders whose checkout is gone and whose server is not running: a deleted
    checkout's test data would otherwise hold RAM until the next reboot."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "home").write_text(str(home.resolve()))
    for other in folder.parent.glob(f"treg-test-{os.getuid()}-*"):
        if other == folder or not _owned(other):  # only this user's own folders are judged
            continue
        try:
            served = Path((other / "home").read_text())
        except OSError:
            continue  # not noted: not ours to judge
        if served.parent.exists() or _running(other / "pg"):
            continue
        shutil.rmtree(other, ignore_errors=True)


def _running(pg_dir: Path) -> bool:
    try:
        pid = int((pg_dir / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    return embedded_pg.process_alive(pid)


def base_dsn() -> str:
    """The maintenance DSN of the test server: TREG_TEST_DATABASE_URL, else the embedded server
    (:func:`server_dir`)."""
    url = os.environ.get("TREG_TEST_DATABASE_URL")
    if url:
        return url
    pg_dir = server_dir()
    if pg_dir.parent.parent == _RAM_ROOT:
        if _ours(pg_dir.parent):
            claim_ram_folder(pg_dir.parent, test_home())
        else:  # another user made it first (a shared /dev/shm): never start a server in their folder
            pg_dir = test_home() / "pg"
    return embedded_pg.start(pg_dir).base_dsn


def _ours(folder: Path) -> bool:
    """``folder`` exists now as a real folder of this user's that no one else may write in (made here when
    missing; the server's own user must still pass through it, so it is not private)."""
    try:
        folder.mkdir(mode=0o755)
    except FileExistsError:
        pass
    except OSError:
        return False
    return _owned(folder)


def _owned(folder: Path) -> bool:
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


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
    """A private database cloned from the template (each test isolated), dropped afterwards. Cloned when
    asked; the ``dsn`` fixture's :class:`TemplateClones` has the next one ready instead."""
    with _private_database(base, _from_template()) as dsn:
        yield dsn


@contextlib.contextmanager
def empty_database(base: str) -> Iterator[str]:
    """A database with nothing in it (a migration test upgrades it itself), dropped afterwards."""
    with _private_database(base, "") as dsn:
        yield dsn


def _from_template() -> str:
    """``CREATE DATABASE``'s options for a clone of this session's template."""
    return f' TEMPLATE "{template_db()}"'


def _private_name() -> str:
    return f"treg_t_{os.getpid()}_{pysecrets.token_hex(6)}"  # the pid lets a later session drop orphans


def _create(base: str, name: str, create_options: str) -> None:
    conn = _admin(base)
    try:
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"{create_options}')
    finally:
        conn.close()


def _drop(base: str, name: str) -> None:
    conn = _admin(base)
    try:
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        conn.close()


@contextlib.contextmanager
def _private_database(base: str, create_options: str) -> Iterator[str]:
    name = _private_name()
    _create(base, name, create_options)
    try:
        yield dsn_for(base, name)
    finally:
        _drop(base, name)


class TemplateClones:
    """A session's test databases, each a clone of its migrated template, with the next one made ahead.

    Cloning and dropping are most of a short test's setup and teardown (in RAM 15–25 ms; on ext4 ten times
    that, see :func:`server_dir`), a test's own run often less. So while one test runs, a thread of its own
    clones the next test's database, and drops the finished one's. Each clone is made from the same
    unchanging template, exactly as :func:`fresh_database` makes one; a clone made ahead that failed (the
    server busy or restarting) is made again when it is wanted, so a lasting failure shows with its error.
    :meth:`close` waits for the thread and drops every database this made that is left (a killed session's
    are dropped by the next one's :func:`prepare_template`)."""

    def __init__(self, base: str) -> None:
        self.base = base
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="treg-test-clones")
        self._ahead: Future[str] | None = None
        self._made: set[str] = set()  # not yet dropped (set.add and set.discard hold the GIL: thread-safe)

    def _clone(self) -> str:
        name = _private_name()
        self._made.add(name)  # first: a CREATE that fails after its database exists still leaves it to close()
        _create(self.base, name, _from_template())
        return name

    def _drop(self, name: str) -> None:
        _drop(self.base, name)
        self._made.discard(name)

    def _take(self) -> str:
        ahead, self._ahead = self._ahead, None
        name = None
        if ahead is not None:
            try:
                name = ahead.result()
            except psycopg2.Error:
                name = None
        if name is None:
            name = self._clone()
        self._ahead = self._thread.submit(self._clone)
        return name

    @contextlib.contextmanager
    def database(self) -> Iterator[str]:
        """A database of the test's own (the one made ahead, else a new clone), dropped after it."""
        name = self._take()
        try:
            yield dsn_for(self.base, name)
        finally:
            # dropped on the thread, before it clones the next one (its one worker keeps the order);
            # FORCE ends whatever the test left connected
            try:
                self._thread.submit(self._drop, name)
            except RuntimeError:  # closed meanwhile (the session ended during the test): dropped here
                self._drop(name)

    def close(self) -> None:
        self._ahead = None
        self._thread.shutdown(wait=True)
        for name in sorted(self._made):
            self._drop(name)
