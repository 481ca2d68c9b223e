"""Idempotency-Key claims against the real PostgreSQL: one NEW under concurrency, replay, mismatch,
in-progress, abandon, expiry and pruning; and the platform-tier key digest."""

from __future__ import annotations

import asyncio
import random

import pytest
from sqlalchemy import select, text, update

from treg import idempotency, membership, money
from treg.errors import BadRequest, Conflict, NotFound, Unprocessable
from treg.idempotency import ClaimOutcome
from treg.infra.schema import idempotency_keys
from treg import reaper
from treg.testing import check_books


@pytest.fixture
async def org_id(svc):
    return (await membership.create_org(svc, slug="acme", email="owner@acme.test"))["org_id"]


D1 = idempotency.request_digest("POST", "acme.items.create", "a=1", b'{"x":1}')
D2 = idempotency.request_digest("POST", "acme.items.create", "a=1", b'{"x":2}')


def test_request_digest_covers_every_part():
    base = ("POST", "acme.items.create", "a=1", b"body")
    digests = {idempotency.request_digest(*base),
               idempotency.request_digest("GET", *base[1:]),
               idempotency.request_digest(base[0], "acme.items.get", *base[2:]),
               idempotency.request_digest(*base[:2], "a=2", base[3]),
               idempotency.request_digest(*base[:3], b"body2"),
               # length-prefixed: moving bytes between parts changes the digest
               idempotency.request_digest("POST", "acme.items.create", "a=1b", b"ody")}
    assert len(digests) == 6
    assert idempotency.request_digest(*base) == idempotency.request_digest("post", *base[1:])


def test_shared_key_digest():
    d = idempotency.shared_key_digest("org_a", "label-1")
    assert len(d) == 64 and int(d, 16) >= 0
    assert d == idempotency.shared_key_digest("org_a", "label-1")
    assert "label-1" not in d
    assert d != idempotency.shared_key_digest("org_b", "label-1")
    assert d != idempotency.shared_key_digest("org_a", "label-2")
    assert idempotency.shared_key_digest("org_a", "bc") != idempotency.shared_key_digest("org_ab", "c")


async def test_new_then_in_progress_then_replay(svc, org_id):
    first = await idempotency.claim(svc, org_id, "k1", D1, call_id="call_1")
    assert first.outcome is ClaimOutcome.NEW and first.refusal() is None
    again = await idempotency.claim(svc, org_id, "k1", D1, call_id="call_2")
    assert again.outcome is ClaimOutcome.IN_PROGRESS and again.call_id == "call_1"
    err = again.refusal()
    assert isinstance(err, Conflict) and err.status == 409 and err.code == "idempotency_in_progress"

    headers = [("Content-Type", "application/json"), ("Set-Cookie", "a=1"), ("Set-Cookie", "b=2")]
    assert await idempotency.complete(svc, first, 201, headers, b'{"id":7}\x00\xff') is True
    assert await idempotency.complete(svc, first, 500, [], b"") is False  # stored once
    assert await idempotency.abandon(svc, first) is False  # after complete: a no-op

    replay = await idempotency.claim(svc, org_id, "k1", D1, call_id="call_3")
    assert replay.outcome is ClaimOutcome.REPLAY and replay.refusal() is None
    assert (replay.status, replay.headers, replay.body, replay.call_id) == (201, tuple(headers), b'{"id":7}\x00\xff',
                                                                             "call_1")
    # labels are per org
    other = (await membership.create_org(svc, slug="other", email="o@other.test"))["org_id"]
    assert (await idempotency.claim(svc, other, "k1", D1)).outcome is ClaimOutcome.NEW


async def test_mismatch(svc, org_id):
    first = await idempotency.claim(svc, org_id, "k1", D1)
    mismatch = await idempotency.claim(svc, org_id, "k1", D2)  # while running: the mismatch wins
    assert mismatch.outcome is ClaimOutcome.MISMATCH
    err = mismatch.refusal()
    assert isinstance(err, Unprocessable) and err.status == 422 and err.code == "idempotency_mismatch"
    await idempotency.complete(svc, first, 200, {"A": "b"}, b"ok")
    assert (await idempotency.claim(svc, org_id, "k1", D2)).outcome is ClaimOutcome.MISMATCH
    assert (await idempotency.claim(svc, org_id, "k1", D1)).headers == (("A", "b"),)


async def test_abandon_frees_the_label(svc, org_id):
    first = await idempotency.claim(svc, org_id, "k1", D1)
    assert await idempotency.abandon(svc, first) is True
    assert await idempotency.abandon(svc, first) is False
    assert await idempotency.abandon(svc, None) is False and await idempotency.complete(svc, None, 200, [], b"") is False
    second = await idempotency.claim(svc, org_id, "k1", D2)  # nothing stored: any request may take it
    assert second.outcome is ClaimOutcome.NEW
    assert await idempotency.complete(svc, first, 200, [], b"stale") is False  # the old owner cannot store
    with pytest.raises(ValueError):
        await idempotency.complete(svc, await idempotency.claim(svc, org_id, "k1", D2), 200, [], b"")


async def test_bad_labels_and_unknown_org(svc, org_id):
    for bad in ("", " lead", "x" * 256, "tab\there", "é", None):
        with pytest.raises(BadRequest):
            await idempotency.claim(svc, org_id, bad, D1)  # type: ignore[arg-type]
    assert (await idempotency.claim(svc, org_id, "x" * 255, D1)).outcome is ClaimOutcome.NEW
    with pytest.raises(NotFound):
        await idempotency.claim(svc, "org_missing", "k", D1)


async def test_concurrent_claims_one_new(svc, org_id):
    for round_ in range(5):
        label = f"race-{round_}"
        claims = await asyncio.gather(*(idempotency.claim(svc, org_id, label, D1, call_id=f"c{i}")
                                        for i in range(20)))
        new = [c for c in claims if c.outcome is ClaimOutcome.NEW]
        assert len(new) == 1
        assert all(c.outcome is ClaimOutcome.IN_PROGRESS for c in claims if c is not new[0])
        await idempotency.complete(svc, new[0], 200, [], b"done")
        claims = await asyncio.gather(*(idempotency.claim(svc, org_id, label, D1) for _ in range(10)))
        assert all(c.outcome is ClaimOutcome.REPLAY and c.body == b"done" for c in claims)


async def _age(svc, org_id: str, label: str) -> None:
    async with svc.db.tx() as tx:
        await tx.execute(update(idempotency_keys).where(idempotency_keys.c.label == label)
                         .values(expires_at=text("now() - interval '1 second'")))


async def test_expiry_replaces_and_prunes(svc, org_id):
    first = await idempotency.claim(svc, org_id, "done", D1)
    await idempotency.complete(svc, first, 200, [], b"old")
    async with svc.db.tx() as tx:
        hours = await tx.scalar(text("SELECT extract(epoch FROM (expires_at - now())) / 3600 FROM idempotency_keys"))
    assert 23.9 < float(hours) <= 24.0  # stored answers live 24 h
    await _age(svc, org_id, "done")
    renewed = await idempotency.claim(svc, org_id, "done", D2)  # expired: replaced, whatever the request
    assert renewed.outcome is ClaimOutcome.NEW
    assert await idempotency.complete(svc, first, 200, [], b"x") is False

    # an in-progress claim whose process died blocks the label only until its lease ends
    crashed = await idempotency.claim(svc, org_id, "crashed", D1)
    assert crashed.outcome is ClaimOutcome.NEW
    assert (await idempotency.claim(svc, org_id, "crashed", D1)).outcome is ClaimOutcome.IN_PROGRESS
    await _age(svc, org_id, "crashed")
    # concurrent claimers of an expired entry: still exactly one NEW
    claims = await asyncio.gather(*(idempotency.claim(svc, org_id, "crashed", D1) for _ in range(10)))
    assert sum(c.outcome is ClaimOutcome.NEW for c in claims) == 1
    assert await idempotency.complete(svc, crashed, 200, [], b"late") is False

    for i in range(5):
        c = await idempotency.claim(svc, org_id, f"p{i}", D1)
        await idempotency.complete(svc, c, 200, [], b"")
        await _age(svc, org_id, f"p{i}")
    assert await idempotency.prune(svc, batch=2) == 5
    assert await idempotency.prune(svc) == 0
    result = await reaper.run_once(svc)
    assert result == {"holds_released": 0, "idempotency_pruned": 0}
    async with svc.db.tx() as tx:
        left = {r["label"] for r in await tx.fetch_all(select(idempotency_keys.c.label))}
    assert left == {"done", "crashed"}


async def test_retries_under_concurrency_never_charge_twice(svc, org_id):
    """The pipeline's order: claim → hold → relay → complete (store) → settle. Many concurrent retries of
    a few labels: one charge per label, every other attempt refused or replayed."""
    await money.grant(svc, org_id=org_id, amount_micro=1_000_000, actor="test")
    rng = random.Random(7)
    labels = [f"job-{i}" for i in range(8)]
    replays: list[bytes] = []

    async def attempt(n: int) -> str:
        label = rng.choice(labels)
        call_id = f"call_{n}"
        c = await idempotency.claim(svc, org_id, label, D1, call_id=call_id)
        if c.outcome is ClaimOutcome.REPLAY:
            replays.append(c.body or b"")
            return "replay"
        if c.outcome is not ClaimOutcome.NEW:
            return c.outcome.value
        try:
            hold = await money.place_hold(svc, org_id=org_id, member_id=None, call_id=call_id, amount_micro=1_000)
            for _ in range(rng.randint(0, 3)):
                await asyncio.sleep(0)
            await idempotency.complete(svc, c, 200, [("X-Treg-Cost-Micro", "700")], label.encode())
            assert await money.settle(svc, call_id, 700) and hold is not None
            return "charged"
        except BaseException:
            await money.release(svc, call_id)
            await idempotency.abandon(svc, c)
            raise

    results = []
    for _ in range(4):  # waves: later waves meet stored answers
        results += await asyncio.gather(*(attempt(len(results) + i) for i in range(40)))
    assert results.count("charged") == len(labels)
    assert "replay" in results and "in_progress" in results
    assert set(replays) <= {lbl.encode() for lbl in labels}
    books = await check_books(svc, org_id)
    assert books["settled"] == 700 * len(labels) and books["open"] == 0
