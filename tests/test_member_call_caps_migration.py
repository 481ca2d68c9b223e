"""Migration 0017 matches treg.infra.schema's member call caps and downgrades cleanly."""

from __future__ import annotations

from treg.testing import assert_schema_matches, assert_up_down_up


def test_schema_matches_migration(dsn):
    assert_schema_matches(dsn, {"member_calls", "members"})


def test_0017_up_down_up(pg_base):
    assert_up_down_up(pg_base, "0017", "0017_member_call_caps", {"member_calls"},
                      columns={"members": ("calls_per_day",)})
