"""Migration 0018 matches treg.infra.schema's token scopes, the public demo's switch, window and audit column,
and downgrades cleanly."""

from __future__ import annotations

from treg.testing import assert_schema_matches, assert_up_down_up


def test_schema_matches_migration(dsn):
    assert_schema_matches(dsn, {"demo_calls", "tokens", "orgs", "calls"})


def test_0018_up_down_up(pg_base):
    assert_up_down_up(pg_base, "0018", "0018_table_demo", {"demo_calls"},
                      columns={"tokens": ("scope",), "orgs": ("public_demo",), "calls": ("demo",)})
