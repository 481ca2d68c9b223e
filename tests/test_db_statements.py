"""Compiled statements kept by shape (treg/infra/db.py ``StatementCache``): a statement compiled once per
shape gives every later one of that shape its own values; what cannot be kept (an expanding ``IN``,
whose SQL depends on the list) is compiled each time; and against the real database the rows are
those of each call's own values."""

from __future__ import annotations

from sqlalchemy import insert, select, text, update

from treg.infra.db import StatementCache
from treg.infra.schema import holds, orgs


def test_one_shape_compiled_once_each_with_its_own_values():
    cache = StatementCache()
    seen = [cache.compile(select(holds.c.id).where(holds.c.org_id == f"org{i}", holds.c.amount_micro > i), None)
            for i in range(5)]
    assert (cache.misses, cache.hits, cache.uncacheable) == (1, 4, 0)
    assert len({c.sql for c in seen}) == 1
    assert [c.params for c in seen] == [{"org_id_1": f"org{i}", "amount_micro_1": i} for i in range(5)]


def test_updates_inserts_limits_and_text_keep_their_values():
    cache = StatementCache()
    a = cache.compile(update(holds).where(holds.c.id == "x").values(state="settled", settled_micro=5), None)
    b = cache.compile(update(holds).where(holds.c.id == "y").values(state="released", settled_micro=0), None)
    assert a.sql == b.sql and a.params != b.params
    assert b.params == {"state": "released", "settled_micro": 0, "id_1": "y"}
    assert cache.compile(select(holds.c.id).limit(7), None).params == {"param_1": 7}
    assert cache.compile(select(holds.c.id).limit(9), None).params == {"param_1": 9}
    assert cache.compile(text("SELECT :a + 1").bindparams(a=4), None).params == {"a": 4}
    assert cache.compile(text("SELECT :a + 1"), {"a": 5}).params == {"a": 5}
    one = cache.compile(insert(holds).values(id="h1", org_id="o1", amount_micro=1), None)
    two = cache.compile(insert(holds).values(id="h2", org_id="o2", amount_micro=2), None)
    assert one.sql == two.sql and two.params == {"id": "h2", "org_id": "o2", "amount_micro": 2}
    assert cache.hits >= 3


def test_an_expanding_in_is_compiled_for_each_list():
    cache = StatementCache()
    three = cache.compile(select(holds.c.id).where(holds.c.id.in_(["a", "b", "c"])), None)
    one = cache.compile(select(holds.c.id).where(holds.c.id.in_(["z"])), None)
    assert three.sql.count("%(") == 3 and one.sql.count("%(") == 1
    assert sorted(three.params.values()) == ["a", "b", "c"] and list(one.params.values()) == ["z"]
    two = cache.compile(select(holds.c.id).where(holds.c.id.in_(["p", "q"])), None)  # the shape is known by now
    assert two.sql.count("%(") == 2 and sorted(two.params.values()) == ["p", "q"]
    assert cache.uncacheable == 3 and cache.hits == 0 and cache.misses == 0


def test_a_full_memo_starts_over_and_stays_correct():
    cache = StatementCache(max_entries=2)
    shapes = (lambda v: select(holds.c.id).where(holds.c.id == v), lambda v: select(orgs.c.id).where(orgs.c.slug == v),
              lambda v: select(orgs.c.slug).where(orgs.c.id == v))
    for i in range(6):  # three shapes in turn through a memo of two: it is cleared when full, never wrong
        for n, shape in enumerate(shapes):
            value = f"{n}-{i}"
            assert list(cache.compile(shape(value), None).params.values()) == [value]
    assert (cache.misses, cache.hits) == (18, 0)  # three shapes in turn never fit in two: each compiled again
    cache.compile(shapes[0]("again"), None)
    assert list(cache.compile(shapes[0]("once more"), None).params.values()) == ["once more"]
    assert cache.hits == 1


async def test_cached_statements_read_their_own_rows(svc):
    from treg import membership

    a = await membership.create_org(svc, slug="alpha", email="a@alpha.test")
    b = await membership.create_org(svc, slug="beta", email="b@beta.test")
    for org in (a, b, a, b):  # the same shape, alternating values, through the shared cache
        async with svc.db.tx() as tx:
            row = await tx.fetch_one(select(orgs.c.id, orgs.c.slug).where(orgs.c.id == org["org_id"]))
        assert row is not None and row["id"] == org["org_id"]
    async with svc.db.tx() as tx:
        rows = await tx.fetch_all(select(orgs.c.slug).where(orgs.c.id.in_([a["org_id"], b["org_id"]])))
        assert sorted(r["slug"] for r in rows) == ["alpha", "beta"]
        rows = await tx.fetch_all(select(orgs.c.slug).where(orgs.c.id.in_([b["org_id"]])))
        assert [r["slug"] for r in rows] == ["beta"]
