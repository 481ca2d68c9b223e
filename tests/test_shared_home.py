"""Several ``treg serve`` processes on one ``TREG_HOME``: they share its one embedded PostgreSQL, which
stops with the last of them, also when another user of it was killed outright. A backup of the
embedded database is taken while they run."""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from treg.infra import embedded_pg
from treg.testing import Served, http, run_treg, treg_env


def _postgres_running(home: Path) -> bool:
    pid_file = home / "pg" / "postmaster.pid"
    if not pid_file.exists():
        return False
    try:
        pid = int(pid_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return False
    return embedded_pg.process_alive(pid)


def _wait_stopped(home: Path, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _postgres_running(home):
            return True
        time.sleep(0.1)
    return False


def _force_stop(home: Path) -> None:
    """Last resort of the finally block: a fast shutdown of the test's own embedded server, by the
    postmaster's pid (pg_ctl refuses to run as root; pgserver runs the server as another user)."""
    if _postgres_running(home):
        pid = int((home / "pg" / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGINT)
        _wait_stopped(home, 20)


def test_processes_share_one_home_and_its_postgres_stops_with_the_last(tmp_path):
    home = tmp_path / "home"
    env = treg_env(home)
    served: list[Served] = []
    try:
        # both start at once on a fresh home: one data folder, one server, one database, one key
        with ThreadPoolExecutor(2) as pool:
            a, b = pool.map(lambda name: Served(env, tmp_path / f"{name}.log", wait_s=120), ["a", "b"])
        served += [a, b]
        init = run_treg(env, "init", "--org", "acme", "--email", "o@acme.test")
        assert init.returncode == 0, init.stderr
        token = json.loads(init.stdout)["token"]
        status, secret, _ = http("POST", a.base + "/api/v1/secrets", token, {"name": "k", "value": "v-SHARED"})
        assert status == 201, secret
        status, listed, _ = http("GET", b.base + "/api/v1/secrets", token)
        assert status == 200 and [s["id"] for s in listed["secrets"]] == [secret["id"]]

        # a backup of the embedded database while both serve (a third user of the server, leaving again)
        backup = run_treg(env, "db", "backup", str(tmp_path / "home.dump"))
        assert backup.returncode == 0, backup.stderr
        assert (tmp_path / "home.dump").read_bytes()[:5] == b"PGDMP"

        assert a.stop() == 0, a.log.read_text()
        assert _postgres_running(home), "the server stopped while b still uses it"
        status, me, _ = http("GET", b.base + "/api/v1/me", token)
        assert status == 200 and me["org_slug"] == "acme"

        # a user killed outright never removes itself from pgserver's list of users
        c = Served(env, tmp_path / "c.log", wait_s=120)
        served.append(c)
        os.kill(c.proc.pid, signal.SIGKILL)
        c.proc.wait(timeout=10)
        assert c.proc.pid in json.loads((home / "pg" / embedded_pg.HANDLES).read_text())

        status, _, _ = http("GET", b.base + "/api/v1/me", token)
        assert status == 200
        assert b.stop() == 0, b.log.read_text()
        assert _wait_stopped(home), "the embedded PostgreSQL outlived its last user"
        assert json.loads((home / "pg" / embedded_pg.HANDLES).read_text()) == []

        # and the next start finds everything where it was
        d = Served(env, tmp_path / "d.log", wait_s=120)
        served.append(d)
        status, me, _ = http("GET", d.base + "/api/v1/me", token)
        assert status == 200 and me["org_slug"] == "acme"
        assert d.stop() == 0
        assert _wait_stopped(home)
    finally:
        for s in served:
            s.kill()
        _force_stop(home)
