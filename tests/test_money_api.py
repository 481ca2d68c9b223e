"""Money over real HTTP (balance, limits, credit ledger), the `treg credits grant` CLI, the reaper component."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest
from sqlalchemy import text, update

from treg import money
from treg.errors import PaymentRequired
from treg.infra.schema import holds
from treg.keys import SERVICES


def run_cli(dsn: str, home, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TREG_")}
    env.update(TREG_DATABASE_URL=dsn, TREG_HOME=str(home), TREG_LOG_LEVEL="WARNING")
    return subprocess.run([sys.executable, "-m", "treg", *args], env=env, capture_output=True, text=True,
                          timeout=120)


async def cli(dsn: str, home, *args: str) -> subprocess.CompletedProcess:
    return await asyncio.get_running_loop().run_in_executor(None, lambda: run_cli(dsn, home, *args))


async def test_credits_grant_cli(client, owner, dsn, tmp_path):
    done = await cli(dsn, tmp_path / "cli", "credits", "grant", "--org", "acme", "--micro", "2500000",
                     "--note", "welcome")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"org": "acme", "granted_micro": 2_500_000, "balance_micro": 2_500_000}
    done = await cli(dsn, tmp_path / "cli", "credits", "grant", "--org", "acme", "--usd", "1.25")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"org": "acme", "granted_micro": 1_250_000, "balance_micro": 3_750_000}

    resp = await client.get("/api/v1/balance", headers=owner["headers"])
    assert resp.status == 200
    assert (await resp.json())["balance_micro"] == 3_750_000
    resp = await client.get("/api/v1/credits", headers=owner["headers"])
    grants = (await resp.json())["grants"]
    assert [g["amount_micro"] for g in grants] == [1_250_000, 2_500_000]
    assert grants[1]["note"] == "welcome" and grants[1]["actor"].startswith("cli:") and grants[1]["kind"] == "grant"

    done = await cli(dsn, tmp_path / "cli", "credits", "grant", "--org", "nope", "--micro", "5")
    assert done.returncode != 0 and done.stdout == ""
    assert json.loads(done.stderr.strip().splitlines()[-1])["error"] == "org_not_found"
    for bad in (["--micro", "0"], ["--usd", "0.0000001"], ["--usd", "lots"]):
        done = await cli(dsn, tmp_path / "cli", "credits", "grant", "--org", "acme", *bad)
        assert done.returncode != 0
        assert json.loads(done.stderr.strip().splitlines()[-1])["error"] == "invalid_amount"
    done = await cli(dsn, tmp_path / "cli", "credits", "grant", "--org", "acme")  # no amount: argparse
    assert done.returncode != 0


async def test_balance_route(client, owner):
    svc = client.app[SERVICES]
    resp = await client.get("/api/v1/balance", headers=owner["headers"])
    assert resp.status == 200
    body = await resp.json()
    assert {k: body[k] for k in ("balance_micro", "held_micro", "available_micro", "daily_cap_micro",
                                 "spent_today_micro")} == {"balance_micro": 0, "held_micro": 0, "available_micro": 0,
                                                           "daily_cap_micro": None, "spent_today_micro": 0}
    await money.grant(svc, org_id=owner["org_id"], amount_micro=10_000, actor="test")
    await money.place_hold(svc, org_id=owner["org_id"], member_id=owner["member_id"], call_id="c1",
                           amount_micro=4_000)
    await money.place_hold(svc, org_id=owner["org_id"], member_id=owner["member_id"], call_id="c2",
                           amount_micro=1_000)
    await money.settle(svc, "c2", 600)
    body = await (await client.get("/api/v1/balance", headers=owner["headers"])).json()
    assert (body["balance_micro"], body["held_micro"], body["available_micro"], body["spent_today_micro"],
            body["held_today_micro"]) == (9_400, 4_000, 5_400, 600, 4_000)
    assert body["member"] == {"member_id": owner["member_id"], "daily_cap_micro": None, "spent_today_micro": 600,
                              "held_today_micro": 4_000}
    resp = await client.get("/api/v1/balance")
    assert resp.status == 401 and (await resp.json())["error"] == "missing_token"


async def test_limits_routes(client, owner):
    svc = client.app[SERVICES]
    h = owner["headers"]
    resp = await client.post("/api/v1/members", json={"email": "dev@acme.test"}, headers=h)
    dev = await resp.json()
    dev_h = {"X-Treg-Token": dev["token"]}

    resp = await client.put("/api/v1/limits/daily-cap", json={"micro": 5_000}, headers=h)
    assert resp.status == 200 and await resp.json() == {"daily_cap_micro": 5_000}
    resp = await client.put("/api/v1/limits/tags/campaign-7", json={"budget_micro": 3_000}, headers=h)
    assert resp.status == 200
    assert await resp.json() == {"tag": "campaign-7", "budget_micro": 3_000, "spent_micro": 0, "held_micro": 0}
    resp = await client.put(f"/api/v1/limits/members/{dev['member_id']}", json={"daily_cap_micro": 1_000}, headers=h)
    assert resp.status == 200 and (await resp.json())["daily_cap_micro"] == 1_000

    resp = await client.get("/api/v1/limits", headers=h)
    body = await resp.json()
    assert body["daily_cap_micro"] == 5_000
    assert body["tags"] == [{"tag": "campaign-7", "budget_micro": 3_000, "spent_micro": 0, "held_micro": 0}]
    assert body["members"] == [{"member_id": dev["member_id"], "daily_cap_micro": 1_000, "spent_today_micro": 0,
                                "held_today_micro": 0}]

    # the limits bite at hold placement
    await money.grant(svc, org_id=owner["org_id"], amount_micro=100_000, actor="test")
    with pytest.raises(PaymentRequired) as exc:
        await money.place_hold(svc, org_id=owner["org_id"], member_id=dev["member_id"], call_id="c1",
                               amount_micro=1_001)
    assert exc.value.code == "member_cap"
    with pytest.raises(PaymentRequired) as exc:
        await money.place_hold(svc, org_id=owner["org_id"], member_id=owner["member_id"], call_id="c2",
                               amount_micro=3_001, tag="campaign-7")
    assert exc.value.code == "tag_budget"
    with pytest.raises(PaymentRequired) as exc:
        await money.place_hold(svc, org_id=owner["org_id"], member_id=owner["member_id"], call_id="c3",
                               amount_micro=5_001)
    assert exc.value.code == "daily_cap"
    body = await (await client.get("/api/v1/balance", headers=dev_h)).json()
    assert body["member"]["daily_cap_micro"] == 1_000 and body["daily_cap_micro"] == 5_000

    # null removes a limit
    for path, key in (("daily-cap", "micro"), ("tags/campaign-7", "budget_micro"),
                      (f"members/{dev['member_id']}", "daily_cap_micro")):
        resp = await client.put(f"/api/v1/limits/{path}", json={key: None}, headers=h)
        assert resp.status == 200, await resp.text()
    body = await (await client.get("/api/v1/limits", headers=h)).json()
    assert body["daily_cap_micro"] is None and body["members"] == []
    assert body["tags"][0]["budget_micro"] is None
    assert await money.place_hold(svc, org_id=owner["org_id"], member_id=dev["member_id"], call_id="c4",
                                  amount_micro=9_000, tag="campaign-7")


async def test_limits_routes_refuse_bad_input_and_plain_members(client, owner):
    h = owner["headers"]
    for body in ({"micro": -1}, {"micro": "5"}, {"micro": True}, {"micro": 1.5}, {}, {"micro": 10 ** 13}):
        resp = await client.put("/api/v1/limits/daily-cap", json=body, headers=h)
        assert resp.status == 400, body
        err = await resp.json()
        assert err["error"] == "invalid_limit" and err["blame"] == "caller" and err["detail"]
    resp = await client.put("/api/v1/limits/daily-cap", json={"cap": 5}, headers=h)  # not a field it takes
    assert resp.status == 400 and (await resp.json())["error"] == "invalid_field"
    resp = await client.put("/api/v1/limits/daily-cap", data=b"{nope", headers=h)
    assert resp.status == 400 and (await resp.json())["error"] == "invalid_json"
    resp = await client.put("/api/v1/limits/tags/" + "x" * 201, json={"budget_micro": 1}, headers=h)
    assert resp.status == 400 and (await resp.json())["error"] == "invalid_tag"
    resp = await client.put("/api/v1/limits/tags/a%20b", json={"budget_micro": 1}, headers=h)
    assert resp.status == 400 and (await resp.json())["error"] == "invalid_tag"
    resp = await client.put("/api/v1/limits/members/mem_nope", json={"daily_cap_micro": 1}, headers=h)
    assert resp.status == 404 and (await resp.json())["error"] == "member_not_found"

    dev = await (await client.post("/api/v1/members", json={"email": "dev@acme.test"}, headers=h)).json()
    dev_h = {"X-Treg-Token": dev["token"]}
    for method, path, body in (("PUT", "/api/v1/limits/daily-cap", {"micro": 1}),
                               ("PUT", "/api/v1/limits/tags/t", {"budget_micro": 1}),
                               ("PUT", f"/api/v1/limits/members/{dev['member_id']}", {"daily_cap_micro": 1}),
                               ("GET", "/api/v1/limits", None), ("GET", "/api/v1/credits", None)):
        resp = await client.request(method, path, json=body, headers=dev_h)
        assert resp.status == 403, path
        assert (await resp.json())["error"] == "forbidden_role"
    assert (await client.get("/api/v1/balance", headers=dev_h)).status == 200


async def test_reaper_component_releases_expired_holds_at_startup(client, owner, make_app, aiohttp_client):
    svc = client.app[SERVICES]
    await money.grant(svc, org_id=owner["org_id"], amount_micro=5_000, actor="test")
    await money.place_hold(svc, org_id=owner["org_id"], member_id=None, call_id="orphan", amount_micro=5_000)
    async with svc.db.tx() as tx:
        await tx.execute(update(holds).where(holds.c.id == "orphan").values(expires_at=text("now() - interval '1 s'")))
    assert (await money.balance(svc, owner["org_id"])).available_micro == 0
    second = await aiohttp_client(make_app())  # another process starting on the same database
    assert await money.hold_state(second.app[SERVICES], "orphan") == "released"
    body = await (await client.get("/api/v1/balance", headers=owner["headers"])).json()
    assert (body["available_micro"], body["held_micro"]) == (5_000, 0)
