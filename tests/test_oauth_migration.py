"""Migration 0016 matches the OAuth tables of treg.infra.schema and downgrades cleanly."""

from __future__ import annotations

from treg.testing import assert_schema_matches, assert_up_down_up

OAUTH_TABLES = {"oauth_apps", "oauth_connections", "oauth_refreshes"}


def test_schema_matches_migration(dsn):
    assert_schema_matches(dsn, OAUTH_TABLES | {"calls"})


def test_0016_up_down_up(pg_base):
    assert_up_down_up(pg_base, "0016", "0016_oauth", OAUTH_TABLES,
                      columns={"calls": ("credential_kind", "connection_id")})
