"""Money at the domain level, against the real PostgreSQL: holds, limits, the reaper, the books."""

from __future__ import annotations

from decimal import Decimal

import asyncio
import random

import pytest
from sqlalchemy import text, update

from treg import authentication, membership, money, reaper
from treg.errors import BadRequest, Conflict, DatabaseError, NotFound, PaymentRequired
from treg.infra.schema import holds
from treg.hold import RELEASED, SETTLED, Close
from treg.money import holds as holds_module, limits
from treg.testing import check_books, hold_close_fault, open_services


@pytest.fixture
async def org(svc):
    o = await membership.create_org(svc, slug="acme", email="owner@acme.test")
    ident = await authentication.authenticate(svc, o["token"], None)
    o["ident"] = ident
    return o


async def test_new_org_has_an_empty_account(svc, org):
    b = await money.balance(svc, org["org_id"])
    assert (b.balance_micro, b.held_micro, b.available_micro, b.trial_micro) == (0, 0, 0, 0)
    with pytest.raises(PaymentRequired) as exc:
        await money.place_hold(svc, org_id=org["org_id"], member_id=org["member_id"], call_id="c1", amount_micro=1)
    assert exc.value.code == "insufficient_balance"
    assert exc.value.body()["limit"] == "balance"


async def test_hold_settle_release_and_the_books(svc, org):
    oid, mid = org["org_id"], org["member_id"]
    after = await money.grant(svc, org_id=oid, amount_micro=10_000, actor="test", note="start")
    assert after.balance_micro == 10_000
    h = await money.place_hold(svc, org_id=oid, member_id=mid, call_id="c1", amount_micro=3_000, tag="batch-7")
    assert h is not None and h.amount_micro == 3_000 and h.tag == "batch-7"
    b = await money.balance(svc, oid)
    assert (b.balance_micro, b.held_micro, b.available_micro, b.held_today_micro) == (10_000, 3_000, 7_000, 3_000)
    assert await money.hold_state(svc, "c1") == "held"

    assert h.charge_for(1_200) == 1_200
    assert await money.settle(svc, "c1", 1_200) is True
    assert await money.settle(svc, "c1", 1_200) is False  # closed exactly once
    assert await money.release(svc, "c1") is False
    assert await money.hold_state(svc, "c1") == "settled"
    b = await money.balance(svc, oid)
    assert (b.balance_micro, b.held_micro, b.available_micro, b.spent_today_micro) == (8_800, 0, 8_800, 1_200)

    await money.place_hold(svc, org_id=oid, member_id=mid, call_id="c2", amount_micro=500)
    assert await money.release(svc, "c2") is True
    assert await money.release(svc, "c2") is False
    assert await money.settle(svc, "c2", 500) is False
    assert (await money.get_hold(svc, "c2"))["settled_micro"] == 0
    books = await check_books(svc, oid)
    assert books["balance"] == 10_000 - 1_200 and books["open"] == 0


async def test_an_observed_price_beyond_any_amount_settles_at_the_hold_beside_the_others(svc, org):
    """A vendor's usage figure times its rate can be any number (1e300 tokens): the close settles the
    hold's amount, and the other closes in the same statement are written too. Sent as it was, the
    figure failed bigint's cast and the whole batch with it, left to the reaper uncharged."""
    from treg.money.holds import SETTLED, Close, close_on

    oid = org["org_id"]
    await money.grant(svc, org_id=oid, amount_micro=10_000, actor="test")
    await money.place_hold(svc, org_id=oid, member_id=None, call_id="c1", amount_micro=2_000)
    await money.place_hold(svc, org_id=oid, member_id=None, call_id="c2", amount_micro=1_000)
    closed = await close_on(svc.db, [Close("c1", SETTLED, int(Decimal("1e300"))), Close("c2", SETTLED, 400)])
    assert sorted(c.call_id for c in closed) == ["c1", "c2"]
    assert (await money.get_hold(svc, "c1"))["settled_micro"] == 2_000
    assert (await money.get_hold(svc, "c2"))["settled_micro"] == 400
    assert await money.settle(svc, "c3", 10**40) is False  # no such hold: still no database error
    books = await check_books(svc, oid)
    assert books["balance"] == 10_000 - 2_400 and books["open"] == 0


async def test_settle_is_capped_at_the_estimate(svc, org):
    oid = org["org_id"]
    await money.grant(svc, org_id=oid, amount_micro=10_000, actor="test")
    h = await money.place_hold(svc, org_id=oid, member_id=None, call_id="c1", amount_micro=2_000)
    assert h.charge_for(5_000) == 2_000
    assert await money.settle(svc, "c1", 5_000) is True
    assert (await money.get_hold(svc, "c1"))["settled_micro"] == 2_000
    assert (await money.balance(svc, oid)).balance_micro == 8_000
    await check_books(svc, oid)


async def test_zero_amount_places_no_hold_and_bad_input_is_refused(svc, org):
    oid = org["org_id"]
    assert await money.place_hold(svc, org_id=oid, member_id=None, call_id="c0", amount_micro=0) is None
    assert await money.hold_state(svc, "c0") is None
    assert await money.settle(svc, "nope", 1) is False and await money.release(svc, "nope") is False
    with pytest.raises(ValueError):
        await money.place_hold(svc, org_id=oid, member_id=None, call_id="c1", amount_micro=-1)
    with pytest.raises(ValueError):
        await money.settle(svc, "c1", -5)
    with pytest.raises(BadRequest):
        await money.place_hold(svc, org_id=oid, member_id=None, call_id="c1", amount_micro=1, tag="has space")
    with pytest.raises(NotFound):
        await money.place_hold(svc, org_id="org_missing", member_id=None, call_id="c1", amount_micro=1)
    with pytest.raises(BadRequest):
        await money.grant(svc, org_id=oid, amount_micro=0, actor="test")
    with pytest.raises(NotFound):
        await money.grant(svc, org_id="org_missing", amount_micro=5, actor="test")


async def test_a_call_id_holds_once(svc, org):
    oid = org["org_id"]
    await money.grant(svc, org_id=oid, amount_micro=100, actor="test")
    await money.place_hold(svc, org_id=oid, member_id=None, call_id="c1", amount_micro=10)
    with pytest.raises(Conflict) as exc:
        await money.place_hold(svc, org_id=oid, member_id=None, call_id="c1", amount_micro=10)
    assert exc.value.code == "hold_exists"
    assert (await money.balance(svc, oid)).held_micro == 10


async def test_usd_amounts():
    assert money.usd_to_micro("12.5") == 12_500_000
    assert money.usd_to_micro("0.000001") == 1
    for bad in ("1.0000001", "abc", "nan", "inf"):
        with pytest.raises(BadRequest):
            money.usd_to_micro(bad)


async def test_trial_allowance_is_granted_once_and_consumed_first(dsn, settings):
    svc = await open_services(dsn, settings.replace(trial_micro=5_000))
    try:
        o = await membership.create_org(svc, slug="trial", email="t@trial.test")
        oid = o["org_id"]
        b = await money.balance(svc, oid)
        assert (b.balance_micro, b.trial_micro, b.trial_remaining_micro) == (5_000, 5_000, 5_000)
        await money.place_hold(svc, org_id=oid, member_id=None, call_id="t1", amount_micro=3_000)
        await money.settle(svc, "t1", 3_000)
        await money.grant(svc, org_id=oid, amount_micro=10_000, actor="test")
        b = await money.balance(svc, oid)
        assert (b.balance_micro, b.trial_remaining_micro, b.granted_micro) == (12_000, 2_000, 15_000)
        grants = await money.list_grants(svc, oid)
        assert sorted(g["kind"] for g in grants) == ["grant", "trial"]
        await check_books(svc, oid)
    finally:
        await svc.db.close()


async def test_two_holds_for_the_last_credit_one_wins(svc, org):
    oid = org["org_id"]
    for round_ in range(10):
        await money.grant(svc, org_id=oid, amount_micro=1_000, actor="test")
        results = await asyncio.gather(
            *(money.place_hold(svc, org_id=oid, member_id=None, call_id=f"r{round_}-{i}", amount_micro=1_000)
              for i in range(2)), return_exceptions=True)
        wins = [r for r in results if isinstance(r, money.Hold)]
        losses = [r for r in results if isinstance(r, PaymentRequired)]
        assert len(wins) == 1 and len(losses) == 1, results
        assert (await money.balance(svc, oid)).available_micro == 0
        await money.settle(svc, wins[0].call_id, 1_000)
    # many at once: exactly balance / amount succeed
    await money.grant(svc, org_id=oid, amount_micro=10 * 700, actor="test")
    results = await asyncio.gather(
        *(money.place_hold(svc, org_id=oid, member_id=None, call_id=f"m{i}", amount_micro=700) for i in range(40)),
        return_exceptions=True)
    assert sum(isinstance(r, money.Hold) for r in results) == 10
    assert sum(isinstance(r, PaymentRequired) for r in results) == 30
    await check_books(svc, oid)


async def test_each_limit_names_itself(svc, org):
    oid, mid, ident = org["org_id"], org["member_id"], org["ident"]
    await money.grant(svc, org_id=oid, amount_micro=100_000, actor="test")

    async def refused(amount: int, **kw) -> dict:
        with pytest.raises(PaymentRequired) as exc:
            await money.place_hold(svc, org_id=oid, call_id=f"x{random.random()}", amount_micro=amount,
                                   member_id=kw.pop("member_id", mid), **kw)
        assert exc.value.status == 402
        return exc.value.body()

    body = await refused(200_000)
    assert (body["error"], body["limit"], body["needed_micro"], body["available_micro"]) == (
        "insufficient_balance", "balance", 200_000, 100_000)

    await limits.set_daily_cap(svc, ident, 5_000)
    await money.place_hold(svc, org_id=oid, member_id=mid, call_id="d1", amount_micro=3_000)
    body = await refused(2_001)
    assert (body["error"], body["limit"], body["needed_micro"], body["available_micro"]) == (
        "daily_cap", "daily_cap", 2_001, 2_000)
    await money.release(svc, "d1")
    await limits.set_daily_cap(svc, ident, None)

    await limits.set_tag_budget(svc, ident, "camp", 1_000)
    await money.place_hold(svc, org_id=oid, member_id=mid, call_id="t1", amount_micro=600, tag="camp")
    await money.settle(svc, "t1", 300)
    await money.place_hold(svc, org_id=oid, member_id=mid, call_id="t2", amount_micro=500, tag="camp")
    body = await refused(201, tag="camp")
    assert (body["error"], body["limit"], body["available_micro"], body["tag"]) == ("tag_budget", "tag_budget", 200,
                                                                                   "camp")
    await money.place_hold(svc, org_id=oid, member_id=mid, call_id="t3", amount_micro=201, tag="other")  # untagged budget
    await money.release(svc, "t2")
    await money.place_hold(svc, org_id=oid, member_id=mid, call_id="t4", amount_micro=700, tag="camp")

    await limits.set_member_cap(svc, ident, mid, 2_000)
    body = await refused(1_000)  # today: 300 spent + 201 + 700 held = 1 201
    assert (body["error"], body["limit"], body["available_micro"], body["member_id"]) == (
        "member_cap", "member_cap", 799, mid)
    # another member (and calls without a member) are not bound by that cap
    await money.place_hold(svc, org_id=oid, member_id=None, call_id="n1", amount_micro=1_000)
    await limits.set_member_cap(svc, ident, mid, None)
    await money.place_hold(svc, org_id=oid, member_id=mid, call_id="m1", amount_micro=1_000)
    await check_books(svc, oid)


async def test_daily_cap_rolls_over_with_the_utc_day(svc, org):
    oid, mid, ident = org["org_id"], org["member_id"], org["ident"]
    await money.grant(svc, org_id=oid, amount_micro=100_000, actor="test")
    await limits.set_daily_cap(svc, ident, 1_000)
    await limits.set_member_cap(svc, ident, mid, 1_000)
    await money.place_hold(svc, org_id=oid, member_id=mid, call_id="y1", amount_micro=1_000)
    await money.settle(svc, "y1", 400)
    await money.place_hold(svc, org_id=oid, member_id=mid, call_id="y2", amount_micro=600)
    with pytest.raises(PaymentRequired) as exc:
        await money.place_hold(svc, org_id=oid, member_id=mid, call_id="y3", amount_micro=1)
    assert exc.value.code == "daily_cap"
    # Move everything so far to yesterday (UTC): today's spend starts from zero.
    async with svc.db.tx() as tx:
        await tx.execute(update(holds).where(holds.c.org_id == oid)
                         .values(day=holds.c.day - 1, created_at=holds.c.created_at - text("interval '1 day'")))
        await tx.execute(text("UPDATE money_daily SET day = day - 1 WHERE org_id = :o").bindparams(o=oid))
    b = await money.balance(svc, oid)
    assert (b.spent_today_micro, b.held_today_micro, b.held_micro) == (0, 0, 600)
    await money.place_hold(svc, org_id=oid, member_id=mid, call_id="t1", amount_micro=1_000)
    # yesterday's open hold settles against yesterday's row, not today's
    assert await money.settle(svc, "y2", 600)
    b = await money.balance(svc, oid)
    assert (b.spent_today_micro, b.held_today_micro) == (0, 1_000)
    await check_books(svc, oid)


async def test_reaper_releases_expired_and_old_holds_only(svc, org):
    oid = org["org_id"]
    await money.grant(svc, org_id=oid, amount_micro=10_000, actor="test")
    for i in range(3):
        await money.place_hold(svc, org_id=oid, member_id=None, call_id=f"o{i}", amount_micro=1_000)
    assert await reaper.reap_orphans(svc) == 0  # nothing expired yet (TTL 1 h)
    async with svc.db.tx() as tx:
        await tx.execute(update(holds).where(holds.c.id == "o0").values(expires_at=text("now() - interval '1 s'")))
    assert await reaper.reap_orphans(svc) == 1
    assert await money.hold_state(svc, "o0") == "released"
    assert await money.settle(svc, "o0", 1_000) is False  # too late: the caller's favour
    assert await money.hold_state(svc, "o1") == "held"
    assert await reaper.reap_orphans(svc, older_than_s=3600) == 0
    assert await reaper.reap_orphans(svc, older_than_s=0) == 2
    b = await money.balance(svc, oid)
    assert (b.balance_micro, b.held_micro) == (10_000, 0)
    await check_books(svc, oid)


async def test_a_release_the_database_refuses_keeps_only_itself_held(svc, org, dsn):
    """A release the database refuses for what it carries (a data exception) failed the reaper's whole
    batch, run after run, so every expired hold of its batch stayed held, credit parked for good. The
    batch is written by halves: the others are released, only it stays held (logged), and the next run
    releases it once the database takes it."""
    oid = org["org_id"]
    await money.grant(svc, org_id=oid, amount_micro=10_000, actor="test")
    for i in range(5):
        await money.place_hold(svc, org_id=oid, member_id=None, call_id=f"r{i}", amount_micro=1_000)
    await asyncio.to_thread(hold_close_fault, dsn, "22003", "r3")
    try:
        assert await reaper.reap_orphans(svc, older_than_s=0) == 4
        states = [await money.hold_state(svc, f"r{i}") for i in range(5)]
        assert states == ["released"] * 3 + ["held", "released"]
        assert (await money.balance(svc, oid)).held_micro == 1_000
        assert await reaper.reap_orphans(svc, older_than_s=0) == 0  # still refused, still alone
    finally:
        await asyncio.to_thread(hold_close_fault, dsn, None)
    assert await reaper.reap_orphans(svc, older_than_s=0) == 1
    b = await money.balance(svc, oid)
    assert (b.balance_micro, b.held_micro) == (10_000, 0)
    await check_books(svc, oid)


@pytest.mark.parametrize("call_id, inlined", [("call_0a1b", True), ("NULL", True), ("o'x", False),
                                              ("a,b", False), ("{x}", False), ("x\\", False)])
async def test_a_close_statement_inlines_only_treg_s_own_ids(svc, org, call_id, inlined):
    """The settler's statements bind each array as one array literal when every id is treg's own kind
    (``[A-Za-z0-9_]``, written quoted: ``NULL`` stays an id); any other id goes as bound lists. Either way
    the statement's text is the one built at import, and the hold is closed once, at its price."""
    oid = org["org_id"]
    await money.grant(svc, org_id=oid, amount_micro=10_000, actor="test")
    other = await money.place_hold(svc, org_id=oid, member_id=None, call_id="call_beside", amount_micro=1_000)
    hold = await money.place_hold(svc, org_id=oid, member_id=None, call_id=call_id, amount_micro=1_000)
    assert hold is not None and other is not None
    closes = [Close(call_id, SETTLED, 700), Close("call_beside", RELEASED)]
    params = holds_module._array_literals(holds_module._close_params(closes))
    assert isinstance(params["calls"], str) == inlined
    if inlined:
        assert params["calls"] == f'{{"{call_id}","call_beside"}}' and params["observed"] == "{700,0}"
    closed = await holds_module.close_on(svc.db, closes)
    assert sorted((c.call_id, c.state, c.charged_micro) for c in closed) == sorted(
        [(call_id, SETTLED, 700), ("call_beside", RELEASED, 0)])
    assert await holds_module.close_on(svc.db, closes) == []  # exactly once
    b = await money.balance(svc, oid)
    assert (b.balance_micro, b.held_micro) == (10_000 - 700, 0)
    await check_books(svc, oid)


async def test_concurrent_calls_with_faults_keep_the_books_exact(svc, org):
    """Hundreds of billed calls at once on one org: failures, double closes, crashes, cancellations."""
    oid, ident = org["org_id"], org["ident"]
    extra = await membership.add_member(svc, ident, {"email": "m2@acme.test"})
    members = [org["member_id"], extra["member_id"], None]
    granted = 300_000
    await money.grant(svc, org_id=oid, amount_micro=granted, actor="test")
    await limits.set_tag_budget(svc, ident, "capped", 40_000)
    await limits.set_member_cap(svc, ident, extra["member_id"], 60_000)
    rng = random.Random(4242)
    wins: dict[str, int] = {}
    charged: dict[str, int] = {}
    background: list[asyncio.Future] = []
    outcomes: dict[str, str] = {}

    def won(call_id: str, ok: bool) -> None:
        if ok:
            wins[call_id] = wins.get(call_id, 0) + 1

    async def closer(coro) -> bool:
        # the pipeline's cleanup: shielded, so a second cancellation cannot interrupt the close
        fut = asyncio.ensure_future(coro)
        background.append(fut)
        return await asyncio.shield(fut)

    async def call(i: int) -> None:
        call_id = f"call_{i}"
        amount = rng.choice([500, 1_000, 2_500, 4_000])
        kind = rng.choice(["settle", "settle", "settle_more", "fail", "release", "double", "crash", "slow"])
        outcomes[call_id] = kind
        member = rng.choice(members)
        tag = rng.choice([None, "capped", "free"])
        try:
            hold = await money.place_hold(svc, org_id=oid, member_id=member, call_id=call_id, amount_micro=amount,
                                          tag=tag)
        except (PaymentRequired, DatabaseError):
            return
        try:
            for _ in range(rng.randint(0, 3)):
                await asyncio.sleep(0)  # the "upstream"
            if kind == "fail":
                raise ConnectionResetError("upstream went away mid-body")
            if kind == "crash":
                return  # the process "died": the hold stays open for the reaper
            if kind == "slow":
                await asyncio.sleep(0.05)
            if kind == "release":
                won(call_id, await closer(money.release(svc, call_id)))
            elif kind == "double":
                observed = rng.randint(0, amount)
                a, b = await asyncio.gather(closer(money.settle(svc, call_id, observed)),
                                            closer(money.release(svc, call_id)))
                won(call_id, a)
                won(call_id, b)
                if a:
                    charged[call_id] = hold.charge_for(observed)
            else:
                observed = rng.randint(0, amount * (3 if kind == "settle_more" else 1))
                if await closer(money.settle(svc, call_id, observed)):
                    won(call_id, True)
                    charged[call_id] = hold.charge_for(observed)
        except BaseException:
            try:
                won(call_id, await closer(money.release(svc, call_id)))
            except DatabaseError:
                pass  # left for the reaper
            raise

    tasks = [asyncio.create_task(call(i)) for i in range(300)]
    for _ in range(60):  # cancel some calls at random points of their life
        await asyncio.sleep(rng.choice([0, 0, 0.001, 0.005]))
        rng.choice(tasks).cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.gather(*background, return_exceptions=True)
    unexpected = [r for r in results if isinstance(r, BaseException)
                  and not isinstance(r, (asyncio.CancelledError, ConnectionResetError))]
    assert not unexpected, unexpected[:3]
    assert sum(isinstance(r, asyncio.CancelledError) for r in results) > 0

    assert all(n == 1 for n in wins.values()), {k: n for k, n in wins.items() if n != 1}
    before = await check_books(svc, oid)
    assert before["open"] > 0  # the crashed calls
    reaped = await reaper.reap_orphans(svc, older_than_s=0)
    assert await reaper.reap_orphans(svc, older_than_s=0) == 0
    books = await check_books(svc, oid)
    assert books["open"] == 0 and reaped == before["open"]
    states = {h["id"]: h for h in books["holds"]}
    assert len(states) > 100
    for call_id, amount in charged.items():
        assert states[call_id]["state"] == "settled" and states[call_id]["settled_micro"] == amount
    assert all(states[c]["state"] == "released" for c, k in outcomes.items() if k in ("crash", "fail", "release")
               and c in states and c not in charged)
    b = await money.balance(svc, oid)
    assert b.held_micro == 0
    assert b.balance_micro == granted - sum(h["settled_micro"] for h in books["holds"])
    assert b.balance_micro == b.available_micro
    assert b.settled_micro >= sum(charged.values())
    assert svc.db.in_use == 0
