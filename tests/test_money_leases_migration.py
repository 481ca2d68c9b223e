"""Migration 0020 (credit leases: holds.lease, calls.lease_id, treg_place_hold's headroom, treg_close_leased)
matches treg.infra.schema, downgrades cleanly — spent leases and all, back to 0015's hold function — and
upgrades again."""

from __future__ import annotations

import pytest

from treg.infra import migrate
from treg.testing import assert_schema_matches, assert_up_down_up, empty_database, run_sql

_PLACE_0015 = ("SELECT refused FROM treg_place_hold('call_x', 'org_m', NULL, NULL, 10, 60.0, 0, NULL, NULL, NULL)")
_PLACE_0020 = ("SELECT refused FROM treg_place_hold('call_y', 'org_m', NULL, NULL, 10, 60.0, 0, NULL, NULL, NULL, "
               "0, false)")


def test_schema_matches_migration(dsn):
    assert_schema_matches(dsn, {"holds", "calls"})


def test_0020_up_down_up(pg_base):
    assert_up_down_up(pg_base, "0020", "0020_money_leases", (),
                      columns={"holds": {"lease"}, "calls": {"lease_id"}})


def test_0020_downgrades_with_leases_on_the_books(pg_base):
    with empty_database(pg_base) as dsn:
        migrate.upgrade(dsn, "0020")
        run_sql(dsn, "INSERT INTO orgs (id, slug) VALUES ('org_m', 'm')")
        run_sql(dsn, "INSERT INTO org_balances (org_id, granted_micro) VALUES ('org_m', 1000)")
        assert run_sql(dsn, _PLACE_0020) == [(None,)]
        # a spent lease (amount 0: only a lease may be) and a returned one beside a call's own hold
        run_sql(dsn, "INSERT INTO holds (id, org_id, day, amount_micro, state, expires_at, lease, closed_at) "
                     "VALUES ('lse_spent', 'org_m', current_date, 0, 'released', now(), true, now()), "
                     "('lse_left', 'org_m', current_date, 30, 'released', now(), true, now())")
        with pytest.raises(Exception, match="ck_holds_amounts"):
            run_sql(dsn, "INSERT INTO holds (id, org_id, day, amount_micro, state, expires_at) "
                         "VALUES ('call_zero', 'org_m', current_date, 0, 'held', now())")
        migrate.downgrade(dsn, "0019")
        assert run_sql(dsn, "SELECT id FROM holds ORDER BY id") == [("call_y",), ("lse_left",)]
        assert run_sql(dsn, _PLACE_0015) == [(None,)]  # 0015's function is back
        migrate.upgrade(dsn, "0020")
        assert run_sql(dsn, "SELECT count(*) FROM holds WHERE lease") == [(0,)]
