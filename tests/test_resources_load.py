"""The managed_resource descriptor validated at startup (every problem names plugin, row and field), and
migration 0008 matching treg/infra/schema.py."""

from __future__ import annotations

from typing import Any, Callable

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from treg.catalog.errors import CatalogError
from treg.catalog.load import build_catalog
from treg.catalog.managed import ManagedResource
from treg.infra import migrate
from treg.infra.schema import metadata
from treg.testing import assert_up_down_up, table_of
from treg.testing.vendors.resources import hooky_provider
from treg_plugins.injectors import HeaderInjector

INJECTORS = {"header": HeaderInjector()}


def build(data: dict[str, Any]):
    return build_catalog([("hooky-plugin", [data])], INJECTORS)


def problems(mutate: Callable[[dict[str, Any]], Any]) -> list[tuple[str, str, str]]:
    data = hooky_provider("https://api.hooky.example/v1")
    mutate(data)
    with pytest.raises(CatalogError) as info:
        build(data)
    return [(p.plugin, p.row, p.field) for p in info.value.problems]


def ep(data: dict[str, Any], op: str) -> dict[str, Any]:
    return next(e for e in data["endpoints"] if e["id"] == f"hooky.webhooks.{op}")


def test_the_example_builds_into_frozen_descriptors():
    reg = build(hooky_provider("https://api.hooky.example/v1"))
    assert reg.get("hooky.webhooks.create").managed_resource == ManagedResource("webhook", "create", id_path="data.id")
    assert reg.get("hooky.webhooks.get").managed_resource.id_param == "hook"
    assert reg.get("hooky.status").managed_resource is None


@pytest.mark.parametrize("mutate,row,field", [
    (lambda d: ep(d, "create")["managed_resource"].pop("id_path"), "create", "managed_resource.id_path"),
    (lambda d: ep(d, "create")["managed_resource"].update(id_path="data..id"), "create", "managed_resource.id_path"),
    (lambda d: ep(d, "create")["managed_resource"].update(id_param="webhook_id"), "create",
     "managed_resource.id_param"),
    (lambda d: ep(d, "create").update(spooled_response=True), "create", "managed_resource"),
    (lambda d: ep(d, "update")["managed_resource"].update(id_param="nope"), "update", "managed_resource.id_param"),
    (lambda d: ep(d, "update")["managed_resource"].update(id_path="id"), "update", "managed_resource.id_path"),
    (lambda d: ep(d, "update")["managed_resource"].update(role="destroy"), "update", "managed_resource.role"),
    (lambda d: ep(d, "update")["managed_resource"].update(kind="Web Hook"), "update", "managed_resource.kind"),
    (lambda d: ep(d, "update")["managed_resource"].update(owner="x"), "update", "managed_resource.owner"),
    (lambda d: ep(d, "update").update(managed_resource="webhook"), "update", "managed_resource"),
    (lambda d: ep(d, "get")["params"][0].update(required=False), "get", "managed_resource.id_param"),
])
def test_a_bad_descriptor_names_plugin_row_and_field(mutate, row, field):
    assert ("hooky-plugin", f"endpoint 'hooky.webhooks.{row}'", field) in problems(mutate)


def test_a_created_kind_needs_one_delete_callable_with_the_id_alone():
    def no_delete(d):
        d["endpoints"] = [e for e in d["endpoints"] if e["id"] != "hooky.webhooks.delete"]
    assert problems(no_delete) == [("hooky-plugin", "endpoint 'hooky.webhooks.create'", "managed_resource.kind")]

    def second_delete(d):
        extra = dict(ep(d, "delete"), id="hooky.webhooks.remove")
        d["endpoints"].append(extra)
    assert problems(second_delete) == [("hooky-plugin", "endpoint 'hooky.webhooks.remove'", "managed_resource.role")]

    def delete_needs_more(d):
        e = ep(d, "delete")
        e["params"] = e["params"] + [{"name": "reason", "in": "query", "required": True}]
    assert problems(delete_needs_more) == [("hooky-plugin", "endpoint 'hooky.webhooks.delete'",
                                            "managed_resource.id_param")]


def test_a_kind_nothing_creates_is_refused():
    def no_create(d):
        d["endpoints"] = [e for e in d["endpoints"] if e["id"] != "hooky.webhooks.create"]
    found = problems(no_create)
    assert {row for _, row, _ in found} == {f"endpoint 'hooky.webhooks.{op}'" for op in ("update", "ping", "get", "test_event",
                                                                                       "delete")}
    assert {f for _, _, f in found} == {"managed_resource.kind"}


TABLES = {"provider_resources"}


def test_schema_matches_migration(dsn):
    with migrate.engine_for(dsn).connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), metadata)
        assert TABLES <= set(inspect(conn).get_table_names())
    assert [d for d in diffs if table_of(d, TABLES) in TABLES] == []


def test_0008_up_down_up(pg_base):
    assert_up_down_up(pg_base, "0008", "0008_provider_resources", TABLES)
