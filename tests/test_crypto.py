"""Secrets at rest: AES-256-GCM bound to (org, secret id), a fresh nonce per write, a key id in the
blob, tamper detection, the key file, and ``treg secrets rotate-key`` (end to end in a subprocess)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from treg import membership, secrets_store, tool_urls
from treg.errors import ConfigError
from treg.infra import crypto
from treg.infra.crypto import DecryptError, SecretBox
from treg.keys import SERVICES
from treg.settings import SecretStr

ORG, SID = "org_a", "sec_1"


def box() -> SecretBox:
    return SecretBox(crypto.decode_key(crypto.new_key_text()))


# -- the box ---------------------------------------------------------------------------------------------

def test_roundtrip_and_key_id_in_blob():
    b = box()
    blob = b.encrypt(b"sk_live_1", org_id=ORG, secret_id=SID)
    assert b.decrypt(blob, org_id=ORG, secret_id=SID) == b"sk_live_1"
    assert blob[:2] == b"t1" and blob[2:10].decode() == b.key_id == b.blob_key_id(blob)
    assert b"sk_live_1" not in blob


def test_bound_to_org_and_secret_id():
    b = box()
    blob = b.encrypt(b"value", org_id=ORG, secret_id=SID)
    for org_id, secret_id in (("org_b", SID), (ORG, "sec_2"), ("org_b", "sec_2"), ("", SID),
                              (ORG + "\0" + SID, "")):  # the separator cannot be abused to shift fields
        with pytest.raises(DecryptError):
            b.decrypt(blob, org_id=org_id, secret_id=secret_id)


def test_fresh_nonce_per_write():
    b = box()
    blobs = [b.encrypt(b"same value", org_id=ORG, secret_id=SID) for _ in range(50)]
    assert len(set(blobs)) == 50
    assert len({blob[10:22] for blob in blobs}) == 50  # the 12-byte nonces differ
    assert all(b.decrypt(x, org_id=ORG, secret_id=SID) == b"same value" for x in blobs)


@pytest.mark.parametrize("where", ["version", "key_id", "nonce", "ciphertext", "tag"])
def test_tampering_fails(where):
    b = box()
    blob = bytearray(b.encrypt(b"a secret value", org_id=ORG, secret_id=SID))
    index = {"version": 0, "key_id": 4, "nonce": 12, "ciphertext": 24, "tag": len(blob) - 1}[where]
    blob[index] ^= 0x01
    with pytest.raises(DecryptError):
        b.decrypt(bytes(blob), org_id=ORG, secret_id=SID)


@pytest.mark.parametrize("blob", [b"", b"t1", b"t1abcdefgh" + b"\0" * 12, b"x" * 64])
def test_short_or_foreign_blobs_fail(blob):
    with pytest.raises(DecryptError):
        box().decrypt(blob, org_id=ORG, secret_id=SID)


def test_other_key_fails_and_previous_key_reads():
    old, new = box(), box()
    blob = old.encrypt(b"v", org_id=ORG, secret_id=SID)
    with pytest.raises(DecryptError) as info:
        new.decrypt(blob, org_id=ORG, secret_id=SID)
    assert old.key_id in info.value.detail  # names the missing key id
    rotated = SecretBox(new.current, previous=(old.current,))
    assert rotated.decrypt(blob, org_id=ORG, secret_id=SID) == b"v"
    assert rotated.blob_key_id(rotated.encrypt(b"v", org_id=ORG, secret_id=SID)) == new.key_id


def test_box_repr_hides_keys():
    b = SecretBox(b"K" * 32, previous=(b"P" * 32,))
    assert "KKKK" not in repr(b) and "PPPP" not in repr(b)


# -- the key file --------------------------------------------------------------------------------------

def test_key_file_created_once_0600(settings, tmp_path):
    s = settings.replace(secret_key=None, home=tmp_path / "keyhome")
    first = crypto.load_box(s)
    path = crypto.key_file(s)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = crypto.load_box(s)
    assert again.current == first.current  # reused, not regenerated


@pytest.mark.parametrize("text", ["not base64!!", "c2hvcnQ=", crypto.new_key_text() + "AAAA"])
def test_bad_master_key_is_config_error(settings, text):
    with pytest.raises(ConfigError):
        crypto.load_box(settings.replace(secret_key=SecretStr(text)))


def test_running_box_follows_a_rotated_key_file(settings, tmp_path):
    s = settings.replace(secret_key=None, home=tmp_path / "keyhome")
    running = crypto.load_box(s)
    old_blob = running.encrypt(b"v1", org_id=ORG, secret_id=SID)
    # what rotate-key does to the files: old key to .previous, a new key file
    path = crypto.key_file(s)
    crypto.previous_file(s).write_text(path.read_text())
    path.write_text(crypto.new_key_text() + "\n")
    rotated = crypto.load_box(s)
    new_blob = rotated.encrypt(b"v2", org_id=ORG, secret_id="sec_2")
    # the running process meets a blob under a key it did not know: it reloads, and reads both
    assert running.decrypt(new_blob, org_id=ORG, secret_id="sec_2") == b"v2"
    assert running.decrypt(old_blob, org_id=ORG, secret_id=SID) == b"v1"
    assert running.key_id == rotated.key_id
    # and writes under the new key from then on
    assert running.blob_key_id(running.encrypt(b"v3", org_id=ORG, secret_id="sec_3")) == rotated.key_id


# -- rows in the database ---------------------------------------------------------------------------------

async def _secret(client: Any, token: str, name: str, value: Any) -> str:
    resp = await client.post("/api/v1/secrets", json={"name": name, "value": value}, headers={"X-Treg-Token": token})
    assert resp.status == 201, await resp.text()
    return (await resp.json())["id"]


async def _row(svc: Any, secret_id: str) -> dict[str, Any]:
    async with svc.db.tx() as tx:
        row = await tx.fetch_one("SELECT * FROM secrets WHERE id = %(id)s", {"id": secret_id})
    assert row is not None
    return row


async def test_row_blob_copied_to_another_org_fails(client, owner):
    svc = client.app[SERVICES]
    other = await membership.create_org(svc, slug="globex", email="owner@globex.test")
    mine = await _secret(client, owner["token"], "stripe", "sk_live_acme")
    theirs = await _secret(client, other["token"], "stripe", "sk_live_globex")
    row = await _row(svc, mine)
    assert secrets_store.decrypt_row(svc.box, row) == "sk_live_acme"
    assert b"sk_live_acme" not in bytes(row["blob"]) and row["key_id"] == svc.box.key_id
    # an attacker with write access to the table copies acme's blob onto globex's row
    async with svc.db.tx() as tx:
        await tx.execute("UPDATE secrets SET blob = %(b)s WHERE id = %(id)s", {"b": bytes(row["blob"]), "id": theirs})
    with pytest.raises(DecryptError):
        secrets_store.decrypt_row(svc.box, await _row(svc, theirs))
    # or moves the whole row to globex
    async with svc.db.tx() as tx:
        await tx.execute("UPDATE secrets SET org_id = %(o)s WHERE id = %(id)s", {"o": other["org_id"], "id": mine})
    with pytest.raises(DecryptError):
        secrets_store.decrypt_row(svc.box, await _row(svc, mine))


async def test_row_blob_copied_to_another_secret_fails(client, owner):
    svc = client.app[SERVICES]
    a = await _secret(client, owner["token"], "a", "value-a")
    b = await _secret(client, owner["token"], "b", "value-b")
    blob = bytes((await _row(svc, a))["blob"])
    async with svc.db.tx() as tx:
        await tx.execute("UPDATE secrets SET blob = %(b)s WHERE id = %(id)s", {"b": blob, "id": b})
    with pytest.raises(DecryptError):
        secrets_store.decrypt_row(svc.box, await _row(svc, b))


async def test_same_value_twice_gives_different_blobs(client, owner):
    svc = client.app[SERVICES]
    ids = [await _secret(client, owner["token"], f"s{i}", "identical") for i in range(2)]
    rows = [await _row(svc, i) for i in ids]
    assert bytes(rows[0]["blob"]) != bytes(rows[1]["blob"])
    assert [secrets_store.decrypt_row(svc.box, r) for r in rows] == ["identical", "identical"]


async def test_json_secret_roundtrip(client, owner):
    svc = client.app[SERVICES]
    sid = await _secret(client, owner["token"], "oauth", {"access_token": "at_1", "refresh_token": "rt_1"})
    row = await _row(svc, sid)
    assert row["is_json"] is True and b"at_1" not in bytes(row["blob"])
    assert secrets_store.decrypt_row(svc.box, row) == {"access_token": "at_1", "refresh_token": "rt_1"}


# -- rotation ----------------------------------------------------------------------------------------------

async def test_rotate_key_function_moves_every_blob(client, owner):
    svc = client.app[SERVICES]
    ids = [await _secret(client, owner["token"], f"s{i}", f"value-{i}") for i in range(5)]
    new_box = SecretBox(crypto.decode_key(crypto.new_key_text()), previous=(svc.box.current,))
    # during rotation the new box reads blobs still under the old key
    assert secrets_store.decrypt_row(new_box, await _row(svc, ids[0])) == "value-0"
    seen: list[tuple[int, int]] = []
    moved = await secrets_store.rotate_key(svc, new_box, progress=lambda d, t: seen.append((d, t)))
    assert moved == 5 and seen[-1] == (5, 5)
    for i, sid in enumerate(ids):
        row = await _row(svc, sid)
        assert row["key_id"] == new_box.key_id and new_box.blob_key_id(bytes(row["blob"])) == new_box.key_id
        assert secrets_store.decrypt_row(SecretBox(new_box.current), row) == f"value-{i}"
    assert await secrets_store.rotate_key(svc, new_box) == 0  # nothing left to move


async def test_rotate_key_moves_the_sealed_base_urls_of_tools(client, owner):
    """A base URL's user-info is sealed under the master key too (treg/tool_urls.py): rotation moves it, so a
    treg that keeps only the new key still dials the tool with its user:password."""
    svc = client.app[SERVICES]
    h = {"X-Treg-Token": owner["token"]}
    made = []
    for i in range(3):
        r = await client.post("/api/v1/tools", json={"name": f"t{i}", "base_url": f"https://u{i}:pw-{i}@api{i}.example/v1",
                                                     "bindings": []}, headers=h)
        assert r.status == 201, await r.text()
        made.append((await r.json())["id"])
    plain = await client.post("/api/v1/tools", json={"name": "plain", "base_url": "https://api.example/v1",
                                                     "bindings": []}, headers=h)
    assert plain.status == 201
    new_box = SecretBox(crypto.decode_key(crypto.new_key_text()), previous=(svc.box.current,))
    assert await secrets_store.rotate_key(svc, new_box) == 3  # what `treg secrets rotate-key` runs
    only_new = SecretBox(new_box.current)
    async with svc.db.tx() as tx:
        rows = await tx.fetch_all("SELECT id, org_id, base_url, base_url_sealed FROM tools ORDER BY name")
    sealed = [r for r in rows if r["base_url_sealed"] is not None]
    assert [r["id"] for r in sealed] == made and all("pw-" not in r["base_url"] for r in rows)
    for i, r in enumerate(sealed):
        assert new_box.blob_key_id(bytes(r["base_url_sealed"])) == new_box.key_id
        assert only_new.decrypt(r["base_url_sealed"], org_id=r["org_id"],
                                secret_id="tool-base-url:" + r["id"]).decode() == f"https://u{i}:pw-{i}@api{i}.example/v1"
    assert await tool_urls.rotate_sealed(svc, new_box) == 0  # nothing left to move


def _cli_env(home: Path, dsn: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TREG_")}
    env.update(TREG_HOME=str(home), TREG_DATABASE_URL=dsn, TREG_LOG_LEVEL="WARNING")
    return env


async def test_rotate_key_cli_end_to_end(make_app, aiohttp_client, dsn, tmp_path):
    # a treg whose master key lives in $TREG_HOME/secret.key (no TREG_SECRET_KEY)
    home = tmp_path / "home"
    client = await aiohttp_client(make_app(secret_key=None))
    svc = client.app[SERVICES]
    assert svc.settings.home == home and crypto.key_file(svc.settings).exists()
    old_key_text = crypto.key_file(svc.settings).read_text().strip()
    old_id = svc.box.key_id
    org = await membership.create_org(svc, slug="acme", email="owner@acme.test")
    values = {await _secret(client, org["token"], f"s{i}", f"value-{i}"): f"value-{i}" for i in range(3)}
    js = await _secret(client, org["token"], "oauth", {"access_token": "at_9"})

    proc = subprocess.run([sys.executable, "-m", "treg", "secrets", "rotate-key"], env=_cli_env(home, dsn),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["reencrypted"] == 4 and out["previous_key_id"] == old_id and out["key_id"] != old_id
    new_key_text = crypto.key_file(svc.settings).read_text().strip()
    assert new_key_text != old_key_text and crypto.key_id_of(crypto.decode_key(new_key_text)) == out["key_id"]
    assert old_key_text in crypto.previous_file(svc.settings).read_text().split()
    for path in (crypto.key_file(svc.settings), crypto.previous_file(svc.settings)):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert old_key_text not in proc.stdout + proc.stderr and new_key_text not in proc.stdout + proc.stderr

    async with svc.db.tx() as tx:
        rows = await tx.fetch_all("SELECT * FROM secrets")
    assert {r["key_id"] for r in rows} == {out["key_id"]}
    fresh = crypto.load_box(svc.settings)  # what a restarted treg loads
    only_new = SecretBox(fresh.current)
    for row in rows:
        expected = values.get(row["id"], {"access_token": "at_9"} if row["id"] == js else None)
        assert secrets_store.decrypt_row(only_new, row) == expected
    # the running server follows the rotated key file without a restart
    assert secrets_store.decrypt_row(svc.box, rows[0]) == values.get(rows[0]["id"], {"access_token": "at_9"})
    new_id = await _secret(client, org["token"], "after", "value-after")
    assert (await _row(svc, new_id))["key_id"] == out["key_id"]

    # running it again moves every blob once more; the first key is still kept as previous
    again = subprocess.run([sys.executable, "-m", "treg", "secrets", "rotate-key"], env=_cli_env(home, dsn),
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["reencrypted"] == 5
    assert crypto.previous_file(svc.settings).read_text().split() == [old_key_text, new_key_text]
