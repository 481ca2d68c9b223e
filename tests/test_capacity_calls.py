"""The breaker and burst smoothing on real calls (docs/resilience.md), over real HTTP hops: treg on a
127.0.0.1 socket, the fake vendor (treg/testing/vendors/capacity.py, a plugin file in TREG_PLUGINS_DIR
with its own signature rows) on a raw-socket upstream."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pytest
from sqlalchemy import select

from treg import membership, money
from treg.capacity.breaker import BreakerStore
from treg.capacity.classify import UNRECORDED_LOG
from treg.infra.schema import holds, idempotency_keys
from treg.keys import SERVICES
from treg.settings import SecretStr
from treg.testing import Events, Gateway, check_books, raw_upstream
from treg.testing.vendors.capacity import PLATFORM_KEYS, Vendor, answer, ok, out_of_credits, write_plugin

GAP = 0.2  # TREG_CAPACITY_STRIKE_GAP_S here: a second strike counts this long after the first
CREDITS = 100_000
ITEMS = "/catalog/call/vend.items.get?item_id=1"


@dataclass
class Env:
    gw: Gateway
    vendor: Vendor
    events: Events

    @property
    def svc(self) -> Any:
        return self.gw.services

    async def get(self, path: str = ITEMS, **kw: Any) -> Any:
        r = await self.gw.call("GET", path, **kw)
        await r.read()
        return r

    async def rows(self) -> dict[str, dict[str, Any]]:
        return {r["key"]: r for r in await self.svc.breaker.rows()}


@pytest.fixture
async def start(aiohttp_client, make_app, tmp_path):
    """``await start(**settings)`` → an :class:`Env`: treg with the vendor plugin file, platform keys and
    an org with credits."""
    vendor = Vendor()
    clients = []
    async with raw_upstream(vendor) as up:
        plugdir = tmp_path / "plugins"
        write_plugin(plugdir, up.url)

        async def go(**over: Any) -> Env:
            events = Events()
            settings: dict[str, Any] = dict(plugins_dir=plugdir, ssrf_allow=("127.0.0.0/8",),
                                            platform={k: SecretStr(v) for k, v in PLATFORM_KEYS.items()},
                                            capacity_strike_gap_s=GAP)
            settings.update(over)
            client = await aiohttp_client(make_app(extra_plugins=(events,), **settings))
            clients.append(client)
            org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
            await money.grant(client.app[SERVICES], org_id=org["org_id"], amount_micro=CREDITS, actor="test")
            return Env(Gateway(client, org), vendor, events)

        yield go
        for client in clients:
            await client.close()


async def strike_twice(env: Env, first: bytes, second: bytes | None = None, path: str = ITEMS) -> list[Any]:
    """Two platform-tier answers the gap apart (the second locks when both strike)."""
    env.vendor.then(first, second if second is not None else first)
    r1 = await env.get(path)
    await asyncio.sleep(GAP + 0.05)
    return [r1, await env.get(path)]


def quota_429(reset: int, retry_after: str | None = None) -> bytes:
    headers = [("X-Quota", "daily"), ("X-Quota-Reset", str(reset))]
    if retry_after is not None:
        headers.append(("Retry-After", retry_after))
    return answer(429, b'{"error": "daily allowance used"}', headers)


async def hold_of(svc: Any, call_id: str) -> dict[str, Any] | None:
    async with svc.db.tx() as tx:
        return await tx.fetch_one(select(holds).where(holds.c.id == call_id))


# -- refuse before reserve ------------------------------------------------------------------------

async def test_a_locked_provider_is_refused_before_the_claim_and_the_hold(start):
    env = await start()
    struck = await strike_twice(env, out_of_credits())
    for r in struck:  # the vendor's own answer on the striking calls, unchanged
        assert r.status == 402 and await r.read() == b'{"error": "Insufficient credits on this account"}'
        assert "X-Treg-Error" not in r.headers
        assert env.events.called(r.headers["X-Treg-Call-Id"])["capacity_signal"] == "balance"
    assert (await env.rows())["vend"]["until"] is not None
    env.vendor.then(out_of_credits())
    probe = await env.get()  # this process's one probe of the interval
    assert probe.status == 402 and probe.headers["X-Treg-Capacity-Probe"] == "1"
    # the event says so too (issue 20 item 13); the striking calls were no probes
    assert env.events.called(probe.headers["X-Treg-Call-Id"])["probe"] is True
    assert [env.events.called(r.headers["X-Treg-Call-Id"])["probe"] for r in struck] == [False, False]
    sent = len(env.vendor.seen)

    r = await env.get("/catalog/call/vend.items.get?item_id=2", headers={"Idempotency-Key": "label-1"})
    body = await r.json()
    assert r.status == 503 and r.headers["X-Treg-Error"] == "1"
    assert (body["error"], body["blame"]) == ("provider_capacity", "treg")
    assert (body["provider"], body["endpoint"], body["kind"], body["resets_at"]) == (
        "vend", "vend.items.get", "balance", None)  # a guessed hold: no reset is known
    assert "Retry-After" not in r.headers
    # the same-capability options: the locked provider's sibling is not one of them
    options = [(a["id"], a["tier"], a["callable"]) for a in body["alternatives"]]
    assert options == [("other.items.get", "platform", True)]
    assert len(env.vendor.seen) == sent  # nothing reached the vendor
    # every endpoint of the provider is covered by a balance lock
    assert (await env.get("/catalog/call/vend.items.alt?item_id=1")).status == 503

    call_id = r.headers["X-Treg-Call-Id"]
    row = await env.gw.api("GET", f"/api/v1/calls/{call_id}", expect=200)
    assert (row["refused_by"], row["error_code"], row["cost_micro"], row["hold_state"]) == (
        "capacity", "provider_capacity", 0, None)
    assert await hold_of(env.svc, call_id) is None
    async with env.svc.db.tx() as tx:
        assert await tx.fetch_all(select(idempotency_keys)) == []  # no claim was made
    assert env.events.called(call_id)["refused_by"] == "capacity"
    balance = await env.gw.api("GET", "/api/v1/balance", expect=200)
    assert balance["balance_micro"] == CREDITS and balance["held_micro"] == 0


async def test_a_quota_lock_covers_only_its_endpoint_until_the_stated_reset(start):
    env = await start()
    reset = int(time.time()) + 120
    struck = await strike_twice(env, quota_429(reset))
    assert [r.status for r in struck] == [429, 429] and len(env.vendor.seen) == 2  # a quota 429 is not re-sent
    env.vendor.then(quota_429(reset))
    assert (await env.get()).headers.get("X-Treg-Capacity-Probe") == "1"
    r = await env.get()
    body = await r.json()
    assert r.status == 503 and (body["kind"], body["endpoint"]) == ("quota", "vend.items.get")
    assert body["resets_at"] == datetime.fromtimestamp(reset, timezone.utc).isoformat().replace("+00:00", "Z")
    assert 110 <= int(r.headers["Retry-After"]) <= 120
    assert [a["id"] for a in body["alternatives"]] == ["vend.items.alt", "other.items.get"]
    alt = await env.get("/catalog/call/vend.items.alt?item_id=1")
    assert alt.status == 200 and "X-Treg-Capacity-Probe" not in alt.headers


async def test_own_and_team_tiers_never_consult_the_breaker(start):
    env = await start()
    await strike_twice(env, out_of_credits())
    env.vendor.then(out_of_credits())
    assert (await env.get()).headers.get("X-Treg-Capacity-Probe") == "1"
    assert (await env.get()).status == 503
    # another org with its own vendor key: the lock on treg's account is none of its business
    team = await membership.create_org(env.svc, slug="team", email="t@team.test")
    gw = Gateway(env.gw.client, team)
    await gw.secret("team-key", provider="vend")
    sent = len(env.vendor.seen)
    r = await gw.call("GET", ITEMS)
    assert r.status == 200 and r.headers["X-Treg-Credential-Tier"] == "team"
    assert "X-Treg-Capacity-Probe" not in r.headers and len(env.vendor.seen) == sent + 1
    # and its own key running dry is its own answer: relayed, no strike, no signal
    await env.svc.breaker.clear("vend")
    env.vendor.then(out_of_credits(), out_of_credits())
    first = await gw.call("GET", ITEMS)
    await asyncio.sleep(GAP + 0.05)
    second = await gw.call("GET", ITEMS)
    assert [first.status, second.status] == [402, 402]
    assert await env.rows() == {}
    assert env.events.called(second.headers["X-Treg-Call-Id"])["capacity_signal"] is None


async def test_a_check_on_an_unlocked_provider_adds_no_query(start):
    env = await start(cache_ttl_s=0.01)  # not even the view's TTL reload: its listener keeps it exact
    view = env.svc.lock_view
    assert view.connected.is_set()  # the app started its listener
    loads = view.loads
    for i in range(10):
        assert (await env.get(f"/catalog/call/vend.items.get?item_id={i}")).status == 200
        await asyncio.sleep(0.02)
    assert view.loads == loads
    # and a lock written meanwhile (as by another process: only its NOTIFY tells) is honoured at once
    other = BreakerStore(env.svc.db, env.svc.settings)
    await other.strike("balance", "vend", None)
    await asyncio.sleep(GAP + 0.05)
    await other.strike("balance", "vend", None)
    for _ in range(40):  # bounded: 2 s
        if view.cached("vend", None) is not None:
            break
        await asyncio.sleep(0.05)
    env.vendor.then(out_of_credits())
    assert (await env.get()).headers.get("X-Treg-Capacity-Probe") == "1"
    assert (await env.get()).status == 503


# -- the probe ------------------------------------------------------------------------------------

async def test_a_probe_2xx_clears_exactly_its_lock_and_failures_never_extend(start):
    env = await start(capacity_probe_interval_s=0.3)
    alt = "/catalog/call/vend.items.alt?item_id=1"
    await strike_twice(env, quota_429(int(time.time()) + 600), path=alt)
    await strike_twice(env, out_of_credits())
    until = (await env.rows())["vend"]["until"]
    assert set(await env.rows()) == {"vend", "vend.items.alt"}

    env.vendor.then(out_of_credits())
    first = await env.get()
    assert first.status == 402 and first.headers["X-Treg-Capacity-Probe"] == "1"
    assert (await env.get()).status == 503  # the interval's probe is spent
    assert (await env.rows())["vend"]["until"] == until  # a failure while locked never extends it
    await asyncio.sleep(0.35)
    env.vendor.then(answer(500, b'{"error": "boom"}'))
    second = await env.get()
    assert second.status == 500 and second.headers["X-Treg-Capacity-Probe"] == "1"
    assert "vend" in await env.rows()  # any other answer leaves it
    await asyncio.sleep(0.35)
    third = await env.get()
    assert third.status == 200 and third.headers["X-Treg-Capacity-Probe"] == "1"
    rows = await env.rows()
    assert set(rows) == {"vend.items.alt"} and rows["vend.items.alt"]["until"] is not None
    after = await env.get()
    assert after.status == 200 and "X-Treg-Capacity-Probe" not in after.headers


# -- classification -------------------------------------------------------------------------------

@pytest.mark.parametrize("reply,signal", [
    (answer(429, b'{"error": "slow down"}', [("Retry-After", "30")]), "burst"),
    (answer(403, b"<html>Just a moment</html>", [("cf-mitigated", "challenge")]), "edge_block"),
    (answer(400, b'{"message": "Your monthly quota is exhausted"}'), "unrecorded"),
])
async def test_burst_edge_block_and_unrecorded_never_strike(start, caplog, reply, signal):
    env = await start()
    caplog.set_level(logging.WARNING, logger="treg")
    struck = await strike_twice(env, reply)
    assert [r.status for r in struck] == [int(reply[9:12])] * 2 and len(env.vendor.seen) == 2
    for r in struck:
        assert env.events.called(r.headers["X-Treg-Call-Id"])["capacity_signal"] == signal
    assert await env.rows() == {}
    unrecorded = [rec for rec in caplog.records if UNRECORDED_LOG in rec.getMessage()]
    if signal == "unrecorded":
        assert len(unrecorded) == 2 and unrecorded[0].levelno == logging.WARNING
        assert unrecorded[0].getMessage() == ("unrecorded capacity-looking answer (provider vend, endpoint "
                                              "vend.items.get, status 400, word 'quota')")
    else:
        assert unrecorded == []


async def test_a_2xx_between_two_strikes_forgets_the_first(start):
    env = await start()
    env.vendor.then(out_of_credits(), ok(), out_of_credits())
    assert (await env.get()).status == 402
    assert (await env.rows())["vend"]["strikes"] == 1
    assert (await env.get()).status == 200
    assert await env.rows() == {}
    await asyncio.sleep(GAP + 0.05)
    assert (await env.get()).status == 402
    assert (await env.rows())["vend"]["strikes"] == 1 and (await env.rows())["vend"]["until"] is None


async def test_a_streamed_platform_answer_strikes_from_its_peeked_head(start):
    env = await start()
    free = "/catalog/call/vend.free"
    struck = await strike_twice(env, out_of_credits(), path=free)
    for r in struck:
        assert r.status == 402 and await r.read() == b'{"error": "Insufficient credits on this account"}'
        assert r.headers["X-Treg-Cost-Micro"] == "0"
        assert await hold_of(env.svc, r.headers["X-Treg-Call-Id"]) is None  # no hold: the streamed path
    assert (await env.rows())["vend"]["until"] is not None
    assert env.events.called(struck[1].headers["X-Treg-Call-Id"])["capacity_signal"] == "balance"


# -- the one re-send ------------------------------------------------------------------------------

def burst(retry_after: str = "1") -> bytes:
    return answer(429, b'{"error": "too many requests"}', [("Retry-After", retry_after)])


async def test_a_short_burst_429_on_a_get_is_re_sent_once_on_the_same_hold(start):
    env = await start()
    env.vendor.then(burst("1"), ok({"item": 1}))
    t0 = time.monotonic()
    r = await env.get()
    assert time.monotonic() - t0 >= 1.0
    assert r.status == 200 and await r.json() == {"item": 1}
    assert r.headers["X-Treg-Smoothed"] == "retry=1" and r.headers["X-Treg-Cost-Micro"] == "1000"
    assert env.events.called(r.headers["X-Treg-Call-Id"])["smoothed"] == "retry=1"  # the event's signal
    first, second = env.vendor.seen
    assert first.raw == second.raw  # identical, byte for byte
    hold = await hold_of(env.svc, r.headers["X-Treg-Call-Id"])
    assert (hold["state"], hold["settled_micro"]) == ("settled", 1000)


async def test_a_second_429_is_relayed_as_it_is(start):
    env = await start()
    env.vendor.then(burst("1"), burst("1"))
    r = await env.get()
    assert r.status == 429 and await r.read() == b'{"error": "too many requests"}'
    assert r.headers["X-Treg-Smoothed"] == "retry=1" and r.headers["Retry-After"] == "1"
    assert len(env.vendor.seen) == 2 and r.headers["X-Treg-Cost-Micro"] == "0"
    assert (await hold_of(env.svc, r.headers["X-Treg-Call-Id"]))["state"] == "released"


@pytest.mark.parametrize("method,path,reply", [
    ("POST", "/catalog/call/vend.items.create", burst("1")),
    ("GET", ITEMS, quota_429(int(time.time()) + 3600, retry_after="1")),
    ("GET", ITEMS, burst("6")),
    ("GET", ITEMS, answer(402, b'{"error": "payment"}', [("Retry-After", "1")])),
    ("GET", ITEMS, answer(401, b'{"error": "key"}', [("Retry-After", "1")])),
    ("GET", ITEMS, answer(503, b'{"error": "down"}', [("Retry-After", "1")])),
], ids=["post", "quota", "long-retry-after", "402", "401", "5xx"])
async def test_what_is_never_re_sent(start, method, path, reply):
    env = await start()
    env.vendor.then(reply)
    r = await env.gw.call(method, path)
    assert r.status == int(reply[9:12]) and await r.read() == reply.partition(b"\r\n\r\n")[2]
    assert len(env.vendor.seen) == 1 and "X-Treg-Smoothed" not in r.headers


# -- the spacer -----------------------------------------------------------------------------------

async def test_the_spacer_spaces_a_providers_calls_and_says_so(start):
    env = await start()  # spaced: 5 calls per second, one start every 200 ms
    replies = await asyncio.gather(*(env.get("/catalog/call/spaced.get") for _ in range(4)))
    assert [r.status for r in replies] == [200] * 4
    waits = [int(r.headers["X-Treg-Smoothed"].removeprefix("wait=")) for r in replies
             if "X-Treg-Smoothed" in r.headers]
    assert len(waits) == 3 and all(w > 0 for w in waits), waits
    gaps = [b - a for a, b in zip(env.vendor.arrived, env.vendor.arrived[1:])]
    # the vendor saw one call start per 200 ms (less the jitter between a start and its arrival)
    assert min(gaps) >= 0.15 and sum(gaps) >= 0.55, gaps
    # the one re-send after a wait: both parts on the answer (the call that waited is answered 429)
    await asyncio.sleep(0.25)
    env.vendor.then(ok(), burst("1"), path="/s/")
    pair = await asyncio.gather(env.get("/catalog/call/spaced.get"), env.get("/catalog/call/spaced.get"))
    assert [r.status for r in pair] == [200, 200]
    smoothed = sorted(r.headers.get("X-Treg-Smoothed", "") for r in pair)
    assert smoothed[0] == "" and re.fullmatch(r"wait=\d+, retry=1", smoothed[1]), smoothed
    # the tool_called event carries what the header says, null when nothing was smoothed
    for r in (*replies, *pair):
        assert env.events.called(r.headers["X-Treg-Call-Id"])["smoothed"] == r.headers.get("X-Treg-Smoothed")


async def test_own_tier_calls_are_never_spaced(start):
    env = await start()
    await env.gw.secret("team-key", provider="spaced")
    replies = await asyncio.gather(*(env.get("/catalog/call/spaced.get") for _ in range(4)))
    assert all(r.headers["X-Treg-Credential-Tier"] == "team" and "X-Treg-Smoothed" not in r.headers
               for r in replies)


# -- what an operator sees ------------------------------------------------------------------------

async def test_the_locks_gauge_reads_the_real_locks(start):
    env = await start()

    async def gauge() -> float:
        text = await (await env.gw.client.get("/metrics")).text()
        [line] = [ln for ln in text.splitlines() if ln.startswith("treg_capacity_locks ")]
        return float(line.split()[1])

    assert await gauge() == 0
    await strike_twice(env, quota_429(int(time.time()) + 600), path="/catalog/call/vend.items.alt?item_id=1")
    assert await gauge() == 1
    await strike_twice(env, out_of_credits())
    assert await gauge() == 2
    await env.svc.breaker.clear("vend")
    assert await gauge() == 1


# -- money ----------------------------------------------------------------------------------------

async def test_money_is_exact_over_a_mixed_run(start):
    env = await start(capacity_probe_interval_s=0.3)
    replies = []
    replies += await strike_twice(env, out_of_credits(), ok())  # a strike, then a 2xx
    env.vendor.then(burst("1"), ok())
    replies.append(await env.get())  # re-sent once, charged once
    replies += [await env.get(f"/catalog/call/vend.items.alt?item_id={i}") for i in range(2)]
    replies += await asyncio.gather(*(env.get("/catalog/call/spaced.get") for _ in range(3)))
    replies.append(await env.get("/catalog/call/vend.free"))  # platform tier, free: no hold
    replies += await strike_twice(env, out_of_credits())  # locks vend
    replies += [await env.get() for _ in range(3)]  # the probe (a 2xx: clears), then ordinary calls
    replies += await strike_twice(env, out_of_credits())  # locks again
    env.vendor.then(out_of_credits())
    replies += [await env.get() for _ in range(3)]  # the probe (402), then two refusals

    statuses = [r.status for r in replies]
    assert statuses.count(503) == 2 and statuses.count(402) == 6, statuses
    charged = sum(int(r.headers["X-Treg-Cost-Micro"]) for r in replies)
    assert charged == 1000 + 1000 + 2 * 700 + 3 * 100 + 3 * 1000
    books = await check_books(env.svc, env.gw.org["org_id"])
    assert books["open"] == 0 and books["settled"] == charged and books["balance"] == CREDITS - charged
    by_id = {h["id"]: h for h in books["holds"]}
    held = [r for r in replies if r.status != 503 and r.url.path != "/catalog/call/vend.free"]
    assert sorted(by_id) == sorted(r.headers["X-Treg-Call-Id"] for r in held)  # one hold per held call
    for r in held:
        hold = by_id[r.headers["X-Treg-Call-Id"]]
        assert hold["state"] == ("settled" if r.status == 200 else "released")
        assert hold["settled_micro"] == int(r.headers["X-Treg-Cost-Micro"])
    balance = await env.gw.api("GET", "/api/v1/balance", expect=200)
    assert balance["balance_micro"] == CREDITS - charged and balance["held_micro"] == 0
