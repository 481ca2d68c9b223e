"""The audit writer encodes a batch a slice at a time, letting the loop run in between (the c=1 tail,
docs/performance.md round 4), and the rows stored are the same as from one encoding."""

from __future__ import annotations

import asyncio

from treg.call import audit
from treg.call_record import CallRecord


def _records(org_id: str, n: int, prefix: str) -> list[CallRecord]:
    out = [CallRecord(id=f"{prefix}_{i}", org_id=org_id, member_id=None, surface="call", method="GET",
                      target=f"t/{i}", outcome="refused", status=404) for i in range(n)]
    # text JSONB refuses, in a later slice than the first: made storable there too
    out[150] = out[150]._replace(target="a\ud800b")
    return out


async def test_a_large_batch_is_encoded_in_slices_with_the_loop_running_between():
    batch = _records("org_x", 300, "call_s")
    ticks = 0
    stop = False

    async def ticker() -> None:
        nonlocal ticks
        while not stop:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    before = ticks
    spread = await audit.insert_sql_spread(batch)
    during = ticks - before
    stop = True
    await task
    # 300 rows in slices of 64: the loop ran between each of the 5 slices, not once for the whole batch
    assert during >= -(-len(batch) // audit.ENCODE_SLICE) - 1 >= 4
    assert spread == audit.insert_sql(batch)  # the same statement, the same text


async def test_rows_of_a_spread_batch_are_all_stored(gateway):
    org_id = gateway.org["org_id"]
    writer = gateway.services.audit
    for rec in _records(org_id, 300, "call_spread"):
        writer.record(rec)
    await writer.flush()
    async with gateway.services.db.tx() as tx:
        rows = await tx.fetch_all("SELECT id, target FROM calls WHERE org_id = %(org)s AND id LIKE 'call_spread_%%'",
                                  {"org": org_id})
    targets = {r["id"]: r["target"] for r in rows}
    assert len(targets) == 300
    assert targets["call_spread_0"] == "t/0" and targets["call_spread_299"] == "t/299"
    assert targets["call_spread_150"] == "a\ufffdb"
