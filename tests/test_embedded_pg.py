"""The embedded PostgreSQL: ``treg serve`` with no TREG_DATABASE_URL starts one under $TREG_HOME/pg,
stops it on SIGTERM and reuses it on the next start. One end-to-end run of the real command (it
initialises a fresh data folder: a few seconds), plus unit tests of the starter's edges.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from treg.errors import ConfigError
from treg.infra import embedded_pg
from treg.testing import Served, http, run_treg, treg_env

VALUE = "sk_live_EMBEDDEDCANARY_93e1"


def _files_containing(root: Path, needle: bytes) -> list[str]:
    hits = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath) / name
            if not path.is_file():  # a socket PostgreSQL left behind (a stop under load) has no bytes
                continue
            try:
                if needle in path.read_bytes():
                    hits.append(str(path))
            except (PermissionError, FileNotFoundError, IsADirectoryError):
                continue
    return hits


def test_serve_end_to_end_on_embedded_postgres(tmp_path):
    home = tmp_path / "home"
    server = Served(treg_env(home), tmp_path / "serve.log", stdout=True)
    try:
        assert (home / "pg" / "PG_VERSION").exists() and (home / "pg" / "postmaster.pid").exists()
        assert (home / "secret.key").exists()
        # `treg init` while the server runs, on the same embedded database
        init = run_treg(treg_env(home), "init", "--org", "acme", "--email", "me@acme.test")
        assert init.returncode == 0, init.stderr
        org = json.loads(init.stdout)
        token = org["token"]
        status, me, _ = http("GET", server.base + "/api/v1/me", token)
        assert status == 200 and me["org_id"] == org["org_id"] and me["role"] == "owner"
        status, secret, _ = http("POST", server.base + "/api/v1/secrets", token, {"name": "stripe", "value": VALUE})
        assert status == 201, secret
        status, tool, _ = http("POST", server.base + "/api/v1/tools", token, {
            "name": "stripe", "base_url": "https://api.stripe.com",
            "bindings": [{"location": "header", "name": "Authorization", "format": "Bearer {secret}",
                          "secret_id": secret["id"]}]})
        assert status == 201, tool
        status, err, _ = http("GET", server.base + "/api/v1/me", "treg_wrong")
        assert status == 401 and set(err) >= {"error", "detail", "blame"}
    finally:
        code = server.stop()
    log = server.log.read_text()
    assert code == 0, log
    assert "Traceback" not in log, log
    assert token not in log and VALUE not in log
    # the embedded server stopped with treg (no one else uses this data folder)
    assert not (home / "pg" / "postmaster.pid").exists(), log
    # nothing under TREG_HOME holds the secret in plain text, the database's own files included
    # (PostgreSQL flushed its buffers at shutdown, so the rows are on disk by now)
    assert _files_containing(home, VALUE.encode()) == []
    assert _files_containing(home, b"api.stripe.com"), "the search sees the database's files"

    # the next start reuses the data folder: the org, token and tool are still there
    again = Served(treg_env(home), tmp_path / "serve2.log", stdout=True)
    try:
        status, me, _ = http("GET", again.base + "/api/v1/me", token)
        assert status == 200 and me["org_id"] == org["org_id"]
        status, tools, _ = http("GET", again.base + "/api/v1/tools", token)
        assert status == 200 and [t["name"] for t in tools["tools"]] == ["stripe"]
    finally:
        assert again.stop() == 0, again.log.read_text()


def test_no_postgres_available_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setattr(embedded_pg, "_start_pgserver", lambda pg_dir: None)
    monkeypatch.setattr(embedded_pg, "_start_system", lambda pg_dir: None)
    with pytest.raises(ConfigError) as info:
        embedded_pg.start(tmp_path / "pg")
    assert info.value.code == "embedded_db_missing"
    assert "TREG_DATABASE_URL" in info.value.detail and "pgserver" in info.value.detail


def test_a_failing_start_is_a_config_error(monkeypatch, tmp_path):
    def boom(pg_dir: Path) -> None:
        raise subprocess.CalledProcessError(1, ["initdb"], stderr=b"initdb: could not create directory")

    monkeypatch.setattr(embedded_pg, "_start_pgserver", boom)
    with pytest.raises(ConfigError) as info:
        embedded_pg.start(tmp_path / "pg")
    assert info.value.code == "embedded_db_failed" and "could not create directory" in info.value.detail


def test_the_data_folder_exists_before_pgserver_looks(monkeypatch, tmp_path):
    """pgserver makes a missing data folder with ``exist_ok=False`` after testing that it is missing: of
    two ``treg serve`` starting at once on a fresh home, one failed "File exists" (seen in
    tests/test_shared_home.py). treg makes the folder first, so pgserver never does."""
    import pgserver

    seen = []

    def get_server(pgdata: Path, cleanup_mode: str) -> None:
        seen.append(Path(pgdata).is_dir())
        raise OSError("stop here")

    monkeypatch.setattr(pgserver, "get_server", get_server)
    with pytest.raises(ConfigError):
        embedded_pg.start(tmp_path / "home" / "pg")
    assert seen == [True]


def test_uri_to_dsn():
    assert embedded_pg._uri_to_dsn("postgresql://postgres:@/postgres?host=/data/pg") == \
        "host=/data/pg user=postgres dbname=postgres"
    server = embedded_pg.EmbeddedPostgres("host=/x user=postgres dbname=postgres", lambda: None, "test")
    assert server.dsn("treg") == "host=/x user=postgres dbname=treg"
