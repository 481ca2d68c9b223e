"""The operator's view of the breaker: ``treg capacity list|clear`` and ``GET /api/v1/capacity``."""

from __future__ import annotations

import json
from datetime import timedelta

from treg.keys import SERVICES
from treg.testing import add_member, run_cli as treg
from treg.testing.vendors.capacity import strike_lock


async def test_api_lists_locks_to_the_owner(client, owner):
    svc = client.app[SERVICES]
    lock = await strike_lock(svc, "quota", "acme", "acme.items-get")
    resp = await client.get("/api/v1/capacity", headers=owner["headers"])
    assert resp.status == 200
    body = await resp.json()
    assert body == {"locks": [{"key": "acme.items-get", "provider": "acme", "endpoint": "acme.items-get",
                               "kind": "quota", "since": lock.since.isoformat().replace("+00:00", "Z"),
                               "until": (lock.since + timedelta(seconds=3600)).isoformat().replace("+00:00", "Z"),
                               "strikes": 2}]}
    anon = await client.get("/api/v1/capacity")
    assert anon.status == 401 and anon.headers.get("X-Treg-Error") == "1"


async def test_cli_lists_and_clears(client, dsn, tmp_path):
    svc = client.app[SERVICES]
    await strike_lock(svc, "balance", "acme", None)
    await strike_lock(svc, "quota", "beta", "beta.search")
    home = tmp_path / "cli-home"
    listed = treg(home, dsn, "capacity", "list")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["key"], r["kind"], r["strikes"]) for r in rows] == [("acme", "balance", 2), ("beta.search", "quota", 2)]
    assert set(rows[0]) == {"key", "provider", "endpoint", "kind", "since", "until", "strikes"}
    cleared = treg(home, dsn, "capacity", "clear", "beta/search")
    assert cleared.returncode == 0 and json.loads(cleared.stdout) == {"key": "beta.search", "cleared": True}
    assert treg(home, dsn, "capacity", "clear", "beta/search").returncode == 1
    assert [r["key"] for r in json.loads(treg(home, dsn, "capacity", "list").stdout)] == ["acme"]


async def test_api_is_for_owner_and_admin_only(client, owner):
    member = await add_member(client, owner["headers"], "m@acme.test")
    admin = await add_member(client, owner["headers"], "a@acme.test", role="admin")
    refused = await client.get("/api/v1/capacity", headers={"X-Treg-Token": member["token"]})
    assert refused.status == 403 and (await refused.json())["error"] == "forbidden_role"
    assert refused.headers.get("X-Treg-Error") == "1"
    allowed = await client.get("/api/v1/capacity", headers={"X-Treg-Token": admin["token"]})
    assert allowed.status == 200 and await allowed.json() == {"locks": []}
