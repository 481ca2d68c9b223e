"""``treg doctor``, run as a real subprocess: one ``ok``/``FAIL`` line per check, exit 0 only when all pass."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from treg.infra import crypto, migrate
from treg.testing import free_port, run_treg, treg_env

CHECKS = ["database reachable", "migrations current", "master key", "plugins loaded", "SSRF guard on",
          "DNS resolver answering"]
VALUE = "sk_live_DOCTORCANARY_51c2"


def lines(stdout: str) -> dict[str, str]:
    """check name -> its whole line, asserting the shape of each line and the order of the checks."""
    out, names = {}, []
    for line in stdout.splitlines():
        if line.startswith("ok "):
            name = line[3:]
        else:
            assert line.startswith("FAIL ") and ": " in line, line
            name = line[5:].split(": ", 1)[0]
        names.append(name)
        out[name] = line
    assert names == CHECKS, stdout
    return out


async def doctor(env: dict[str, str], *args: str):
    # in a thread: the fake DNS server answers on this test's loop
    return await asyncio.to_thread(run_treg, env, "doctor", *args)


async def test_fresh_home_says_what_is_missing_and_creates_nothing(tmp_path, fake_dns):
    home = tmp_path / "home"
    env = treg_env(home, TREG_DNS_NAMESERVERS=fake_dns.nameserver)
    proc = await doctor(env)
    assert proc.returncode == 1, proc.stderr
    got = lines(proc.stdout)
    assert got["database reachable"].startswith("FAIL") and "treg db upgrade" in got["database reachable"]
    assert got["migrations current"].startswith("FAIL")
    assert got["master key"].startswith("FAIL") and "secret.key" in got["master key"]
    assert got["plugins loaded"] == "ok plugins loaded"
    assert got["SSRF guard on"] == "ok SSRF guard on"
    assert got["DNS resolver answering"] == "ok DNS resolver answering"
    # read-only: no key generated, no data folder initialised
    assert not (home / "secret.key").exists() and not (home / "pg").exists()

    as_json = await doctor(env, "--json")
    assert as_json.returncode == 1
    rows = json.loads(as_json.stdout)
    assert [r["check"] for r in rows] == CHECKS and all(set(r) == {"check", "ok", "detail"} for r in rows)
    assert [r["ok"] for r in rows] == [False, False, False, True, True, True]


async def test_all_ok_then_a_wrong_or_missing_master_key(gateway, dsn, settings, tmp_path, fake_dns):
    await gateway.secret(VALUE)
    key = settings.secret_key.reveal()
    env = treg_env(tmp_path / "cli", dsn, TREG_SECRET_KEY=key, TREG_DNS_NAMESERVERS=fake_dns.nameserver)
    proc = await doctor(env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.splitlines() == [f"ok {c}" for c in CHECKS]
    assert VALUE not in proc.stdout + proc.stderr and key not in proc.stdout + proc.stderr

    # a secret encrypted under another key: the master key check fails, naming what to do
    other = crypto.new_key_text()
    proc = await doctor({**env, "TREG_SECRET_KEY": other})
    assert proc.returncode == 1
    got = lines(proc.stdout)
    assert got["master key"].startswith("FAIL master key: ") and "cannot decrypt" in got["master key"]
    assert crypto.key_id_of(crypto.decode_key(key)) in got["master key"]  # the key id the blobs need
    assert all(got[c].startswith("ok") for c in CHECKS if c != "master key")

    # no key at all (no TREG_SECRET_KEY, no key file in the home)
    no_key = {k: v for k, v in env.items() if k != "TREG_SECRET_KEY"}
    proc = await doctor(no_key)
    assert proc.returncode == 1 and lines(proc.stdout)["master key"].startswith("FAIL master key: ")
    assert not (tmp_path / "cli" / "secret.key").exists()


async def test_every_check_failing(tmp_path):
    """An unreachable database, a silent resolver, a broken plugin and the SSRF guard off."""
    dead = free_port()  # nothing listens there
    password = "pw-DOCTOR-" + os.urandom(4).hex()
    silent_dns = free_port()
    env = treg_env(tmp_path / "home", f"postgresql://treg:{password}@127.0.0.1:{dead}/treg",
                   TREG_SECRET_KEY=crypto.new_key_text(), TREG_DNS_NAMESERVERS=f"127.0.0.1:{silent_dns}",
                   TREG_PLUGINS_DIR=str(Path(__file__).parent / "plugin_fixtures" / "syntax_error"),
                   TREG_PROXY_SSRF_CHECK="0")
    proc = await doctor(env)
    assert proc.returncode == 1
    got = lines(proc.stdout)
    assert all(line.startswith("FAIL ") for line in got.values()), proc.stdout
    assert got["database reachable"].startswith("FAIL database reachable: cannot connect to TREG_DATABASE_URL")
    assert "bad_syntax" in got["plugins loaded"] and "TREG_PROXY_SSRF_CHECK" in got["SSRF guard on"]
    assert got["DNS resolver answering"].startswith("FAIL DNS resolver answering: ")
    assert password not in proc.stdout + proc.stderr


async def test_database_behind_on_migrations(dsn, tmp_path, fake_dns):
    await asyncio.to_thread(migrate.downgrade, dsn, "-1")
    env = treg_env(tmp_path / "home", dsn, TREG_SECRET_KEY=crypto.new_key_text(),
                   TREG_DNS_NAMESERVERS=fake_dns.nameserver)
    proc = await doctor(env)
    assert proc.returncode == 1
    line = lines(proc.stdout)["migrations current"]
    assert line.startswith("FAIL migrations current: ") and "treg db upgrade" in line
    assert migrate.head_revision() in line

    upgraded = await asyncio.to_thread(run_treg, env, "db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    proc = await doctor(env)
    assert proc.returncode == 0 and proc.stdout.splitlines() == [f"ok {c}" for c in CHECKS]
