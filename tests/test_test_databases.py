"""The suite's own databases (treg/testing/databases.py): where the embedded test server keeps its data,
and the clones each test gets, the next one made ahead while a test runs."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import psycopg2
import psycopg2.extensions
import pytest

from treg import testing
from treg.testing import TemplateClones, claim_ram_folder, databases, run_sql, server_dir


def _name(dsn: str) -> str:
    return psycopg2.extensions.parse_dsn(dsn)["dbname"]


def _ours(base: str) -> set[str]:
    """The databases of this process's session (the template aside)."""
    rows = run_sql(base, "SELECT datname FROM pg_database WHERE datname LIKE %s", f"treg\\_t\\_{os.getpid()}\\_%")
    return {name for (name,) in rows}


def test_the_server_keeps_its_data_in_ram_where_there_is_room(tmp_path, monkeypatch):
    monkeypatch.delenv("TREG_TEST_HOME", raising=False)
    ram = tmp_path / "shm"
    ram.mkdir()
    there = server_dir(ram, room=1)
    assert there.parent.parent == ram and there.name == "pg"
    assert there.parent.name.startswith(f"treg-test-{os.getuid()}-")
    assert server_dir(ram, room=1) == there  # the same home: the same folder, session after session
    # no room, or no such folder: the home's own
    assert server_dir(ram, room=1 << 62) == testing.test_home() / "pg"
    assert server_dir(tmp_path / "none", room=1) == testing.test_home() / "pg"
    # TREG_TEST_HOME keeps it where it says, room or not; another home is another folder
    monkeypatch.setenv("TREG_TEST_HOME", str(tmp_path / "mine"))
    assert server_dir(ram, room=1) == tmp_path / "mine" / "pg"


def test_another_home_has_another_folder_in_ram(tmp_path, monkeypatch):
    ram = tmp_path / "shm"
    ram.mkdir()
    monkeypatch.delenv("TREG_TEST_HOME", raising=False)
    monkeypatch.setattr(databases, "test_home", lambda: tmp_path / "a")
    a = server_dir(ram, room=1)
    monkeypatch.setattr(databases, "test_home", lambda: tmp_path / "b")
    assert server_dir(ram, room=1) != a


def test_a_deleted_checkouts_data_in_ram_is_removed_and_no_other(tmp_path):
    ram = tmp_path / "shm"
    uid = os.getuid()

    def folder(name: str, home: Path | None, pid: int | None = None) -> Path:
        f = ram / name
        (f / "pg").mkdir(parents=True)
        f.chmod(0o755)  # whatever the umask: a folder only its owner writes in
        if home is not None:
            (f / "home").write_text(str(home))
        if pid is not None:
            (f / "pg" / "postmaster.pid").write_text(f"{pid}\n/data\n")
        return f

    kept_checkout = tmp_path / "checkout"
    (kept_checkout / ".test-home").mkdir(parents=True)
    gone = tmp_path / "deleted-checkout" / ".test-home"  # its checkout never existed (deleted)
    live = folder(f"treg-test-{uid}-live", kept_checkout / ".test-home")
    dead = folder(f"treg-test-{uid}-dead", gone)
    running = folder(f"treg-test-{uid}-running", gone, pid=os.getpid())  # a server still up: left alone
    stale_pid = folder(f"treg-test-{uid}-stale", gone, pid=2 ** 22 + 1)  # above pid_max: long gone
    unnoted = folder(f"treg-test-{uid}-unnoted", None)
    someone_elses = folder(f"treg-test-{uid + 1}-x", gone)
    open_to_all = folder(f"treg-test-{uid}-open", gone)  # named like ours, but anyone could have made it
    open_to_all.chmod(0o777)
    mine = ram / f"treg-test-{uid}-mine"
    claim_ram_folder(mine, kept_checkout / ".test-home")
    assert (mine / "home").read_text() == str((kept_checkout / ".test-home").resolve())
    assert {p.name for p in ram.iterdir()} == {p.name for p in (live, running, unnoted, someone_elses, open_to_all,
                                                               mine)}
    assert not dead.exists() and not stale_pid.exists()


def test_each_test_gets_a_fresh_clone_and_the_next_is_made_ahead(pg_base):
    before = _ours(pg_base)  # the session's own clones may be dropped meanwhile: only ours are compared
    clones = TemplateClones(pg_base)
    try:
        with clones.database() as first:
            run_sql(first, "CREATE TABLE left_behind (x int)")
            ahead = clones._ahead
            assert ahead is not None
            made = ahead.result(timeout=60)  # cloned while this "test" runs, before it is asked for
            assert made in _ours(pg_base) and _name(first) != made
        with clones.database() as second:
            assert _name(second) == made  # the one made ahead
            assert run_sql(second, "SELECT to_regclass('left_behind')") == [(None,)]  # nothing of the first
            assert run_sql(second, "SELECT count(*) FROM alembic_version") == [(1,)]  # migrated, as the template
    finally:
        clones.close()
    assert not _ours(pg_base) - before  # the finished ones and the one made ahead: all dropped


def test_a_clone_made_ahead_that_failed_is_made_again_when_wanted(pg_base, monkeypatch):
    real = databases._create
    failed = []

    def failing_ahead(base: str, name: str, options: str) -> None:
        if threading.current_thread().name.startswith("treg-test-clones") and not failed:
            failed.append(name)
            raise psycopg2.OperationalError("the server is restarting (test fault)")
        real(base, name, options)

    monkeypatch.setattr(databases, "_create", failing_ahead)
    clones = TemplateClones(pg_base)
    try:
        with clones.database():
            with pytest.raises(psycopg2.OperationalError):
                clones._ahead.result(timeout=60)  # type: ignore[union-attr]
        with clones.database() as again:  # made now instead
            assert run_sql(again, "SELECT count(*) FROM alembic_version") == [(1,)]
        assert len(failed) == 1
    finally:
        clones.close()


@pytest.mark.parametrize("kept", [False, True])
def test_close_drops_every_database_of_the_session(pg_base, kept):
    before = _ours(pg_base)
    clones = TemplateClones(pg_base)
    if kept:  # a test still holding its database when the session ends (interrupted)
        held = clones.database()
        name = _name(held.__enter__())
    else:
        with clones.database() as dsn:
            name = _name(dsn)
    clones.close()
    assert name not in _ours(pg_base) and not _ours(pg_base) - before
    if kept:
        held.__exit__(None, None, None)  # the test ends after the session: nothing left to drop, no error


def test_a_folder_in_ram_is_used_only_when_it_is_this_users_own(tmp_path):
    """/dev/shm is shared by every user of the machine, and the folder's name can be worked out: one made
    first by someone else, or one anyone may write in, or a link, is not where the test server starts."""
    fresh = tmp_path / "fresh"
    assert databases._ours(fresh) and fresh.is_dir()
    assert databases._ours(fresh)  # again: it is there, and ours
    open_to_all = tmp_path / "open"
    open_to_all.mkdir()
    open_to_all.chmod(0o777)
    assert not databases._ours(open_to_all)
    link = tmp_path / "link"
    link.symlink_to(fresh)
    assert not databases._ours(link)
    if os.getuid() == 0:  # only root can give a folder away
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        os.chown(theirs, 65534, 65534)
        assert not databases._ours(theirs)
