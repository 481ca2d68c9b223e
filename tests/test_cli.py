"""The ``treg`` command line, run as real subprocesses against this test's database."""

from __future__ import annotations

import json

import pytest

from treg import __version__, settings as settings_mod
from treg.infra import migrate
from treg.testing import run_cli as treg


def one_json_object(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert len(lines) == 1, stdout
    out = json.loads(lines[0])
    assert isinstance(out, dict)
    return out


async def test_init_prints_org_member_token_and_the_token_works(client, dsn, tmp_path):
    proc = treg(tmp_path / "home", dsn, "init", "--org", "acme", "--email", "Owner@Acme.test")
    assert proc.returncode == 0, proc.stderr
    out = one_json_object(proc.stdout)
    assert {"org_id", "member_id", "token"} <= set(out)
    assert out["token"].startswith("treg_") and out["token"] not in proc.stderr
    # the running server (same database) accepts the new owner's token at once
    me = await (await client.get("/api/v1/me", headers={"X-Treg-Token": out["token"]})).json()
    assert me == {**me, "org_id": out["org_id"], "member_id": out["member_id"], "org_slug": "acme", "role": "owner"}

    again = treg(tmp_path / "home", dsn, "init", "--org", "globex", "--email", "owner@globex.test")
    assert again.returncode == 0, again.stderr
    other = one_json_object(again.stdout)
    assert other["org_id"] != out["org_id"] and other["token"] != out["token"]
    me = await (await client.get("/api/v1/me", headers={"X-Treg-Token": other["token"]})).json()
    assert me["org_slug"] == "globex"

    # the same person may own a second org: a second membership with its own token
    third = treg(tmp_path / "home", dsn, "init", "--org", "initech", "--email", "owner@acme.test")
    assert third.returncode == 0, third.stderr
    assert one_json_object(third.stdout)["member_id"] != out["member_id"]


def test_init_duplicate_slug_fails_with_error_json(dsn, tmp_path):
    assert treg(tmp_path / "home", dsn, "init", "--org", "acme", "--email", "a@acme.test").returncode == 0
    proc = treg(tmp_path / "home", dsn, "init", "--org", "acme", "--email", "b@acme.test")
    assert proc.returncode != 0
    assert proc.stdout == ""
    err = json.loads(proc.stderr.strip().splitlines()[-1])
    assert err["error"] == "org_exists" and "acme" in err["detail"] and err["blame"] == "caller"


@pytest.mark.parametrize("slug,email,code", [("Not A Slug", "a@b.test", "invalid_slug"), ("x_y", "a@b.test", "invalid_slug"),
                                              ("ok", "not-an-email", "invalid_email")])
def test_init_bad_input(dsn, tmp_path, slug, email, code):
    proc = treg(tmp_path / "home", dsn, "init", "--org", slug, "--email", email)
    assert proc.returncode != 0 and proc.stdout == ""
    assert json.loads(proc.stderr.strip().splitlines()[-1])["error"] == code


def test_db_upgrade(pg_base, tmp_path):
    import psycopg2

    from treg.testing import empty_database

    # an empty database: `treg db upgrade` brings it to head, and again is a no-op
    with empty_database(pg_base) as dsn:
        for _ in range(2):
            proc = treg(tmp_path / "home", dsn, "db", "upgrade")
            assert proc.returncode == 0, proc.stderr
            out = one_json_object(proc.stdout)
            assert out["revision"] == out["head"] and out["head"] is not None
        assert migrate.current_and_head(dsn) == (out["head"], out["head"])
        with psycopg2.connect(dsn) as c, c.cursor() as cur:
            cur.execute("SELECT to_regclass('tools'), to_regclass('secrets'), to_regclass('tokens')")
            assert all(cur.fetchone())


def test_unreachable_database_is_an_error_json(tmp_path):
    proc = treg(tmp_path / "home", "host=/nonexistent-socket-dir dbname=x connect_timeout=2", "db", "upgrade")
    assert proc.returncode != 0 and proc.stdout == ""
    err = json.loads(proc.stderr.strip().splitlines()[-1])
    assert err["error"] == "database_unavailable" and err["blame"] == "treg"


def test_bad_setting_is_an_error_json(tmp_path):
    proc = treg(tmp_path / "home", None, "settings", TREG_PORT="eighty")
    assert proc.returncode != 0
    err = json.loads(proc.stderr.strip().splitlines()[-1])
    assert err["error"] == "bad_setting" and "TREG_PORT" in err["detail"]


def test_settings_command_prints_the_table(tmp_path):
    proc = treg(tmp_path / "home", None, "settings")
    assert proc.returncode == 0, proc.stderr
    for env, *_ in settings_mod.table():
        assert env in proc.stdout


def test_version_and_usage(tmp_path):
    proc = treg(tmp_path / "home", None, "--version")
    assert proc.returncode == 0 and __version__ in proc.stdout
    proc = treg(tmp_path / "home", None)
    assert proc.returncode == 2 and "usage" in proc.stderr
    proc = treg(tmp_path / "home", None, "init", "--org", "x")
    assert proc.returncode == 2 and "--email" in proc.stderr
