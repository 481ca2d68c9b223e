"""``treg db backup FILE`` / ``treg db restore FILE``: real subprocesses, pg_dump's own format, a
restore into an empty database that serves the same org, tool and secret with the same master key."""

from __future__ import annotations

import asyncio
import json

import psycopg2

from treg.infra import crypto
from treg.testing import Served, empty_database, http, run_treg, treg_env

VALUE = "sk_live_BACKUPCANARY_7f0e"


async def test_backup_restore_round_trip(gateway, up, dsn, pg_base, settings, tmp_path):
    secret_id = await gateway.secret(VALUE)
    await gateway.tool("up", up.url + "/v1", bindings=[
        {"location": "header", "name": "Authorization", "format": "Bearer {secret}", "secret_id": secret_id}])
    key = settings.secret_key.reveal()
    dump = tmp_path / "treg.dump"
    env = treg_env(tmp_path / "cli", dsn, TREG_SECRET_KEY=key)
    proc = await asyncio.to_thread(run_treg, env, "db", "backup", str(dump))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"file": str(dump), "bytes": dump.stat().st_size}
    assert "treg: " in proc.stderr  # progress on stderr
    assert dump.read_bytes()[:5] == b"PGDMP"  # pg_dump's custom format
    assert VALUE.encode() not in dump.read_bytes()  # secrets stay encrypted in the dump

    with empty_database(pg_base) as target:
        renv = treg_env(tmp_path / "home2", target, TREG_SECRET_KEY=key, TREG_SSRF_ALLOW="127.0.0.0/8")
        proc = await asyncio.to_thread(run_treg, renv, "db", "restore", str(dump))
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["revision"] == out["head"] is not None

        # the secret decrypts with the same key, and with no other
        conn = psycopg2.connect(target)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT id, org_id, blob FROM secrets")
                (sid, org_id, blob), = cur.fetchall()
        finally:
            conn.close()
        box = crypto.SecretBox(crypto.decode_key(key))
        assert box.decrypt(bytes(blob), org_id=org_id, secret_id=sid) == VALUE.encode()

        # a treg on the restored database calls through the restored tool with the restored secret
        served = await asyncio.to_thread(Served, renv, tmp_path / "serve.log")
        try:
            status, body, _ = await asyncio.to_thread(http, "GET", served.base + "/call/up/ping", gateway.org["token"])
            assert status == 200, body
            assert up.last.header("Authorization") == f"Bearer {VALUE}"
        finally:
            code = await asyncio.to_thread(served.stop)
        assert code == 0

        # a second restore into the now non-empty database is refused, with the contract's error shape
        proc = await asyncio.to_thread(run_treg, renv, "db", "restore", str(dump))
        assert proc.returncode == 2 and proc.stdout == ""
        err = json.loads(proc.stderr.strip().splitlines()[-1])
        assert err["error"] == "restore_target_not_empty" and "empty" in err["detail"]


async def test_backup_of_a_missing_file_and_unreachable_database(tmp_path):
    env = treg_env(tmp_path / "home", "postgresql://treg@127.0.0.1:1/treg")
    proc = await asyncio.to_thread(run_treg, env, "db", "restore", str(tmp_path / "nope.dump"))
    assert proc.returncode == 2
    assert json.loads(proc.stderr.strip().splitlines()[-1])["error"] == "backup_missing"
    proc = await asyncio.to_thread(run_treg, env, "db", "backup", str(tmp_path / "x.dump"))
    assert proc.returncode == 2
    err = json.loads(proc.stderr.strip().splitlines()[-1])
    assert err["error"] == "backup_failed" and not (tmp_path / "x.dump").exists()
    assert not (tmp_path / "x.dump.partial").exists()
