"""The ``async`` descriptor validated at startup (a bad row names plugin, row and field), and migration
0007 (async_jobs, calls.kind) matching treg/infra/schema.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from treg.catalog.errors import CatalogError
from treg.catalog.load import build_catalog
from treg.infra import migrate
from treg.infra.schema import metadata
from treg.catalog.async_jobs import Submission, Utility
from treg.testing import assert_up_down_up
from treg_plugins.injectors import HeaderInjector

INJECTORS = {"header": HeaderInjector()}
ASYNC = {"task_id": "data.task_id", "poll": "vid.tasks.get", "fetch": "vid.files.get", "task_param": "id",
         "status_path": "status", "done": ["completed"], "failed": ["failed"], "result_id_path": "result.file_id",
         "price_on": "done"}


def vid(**over: Any) -> dict[str, Any]:
    row = {"id": "vid", "base_url": "https://api.vid.example/v1", "auth": [{"location": "header", "name": "X-Key"}],
           "endpoints": [
               {"id": "vid.create", "method": "POST", "path": "/videos", "params": [],
                "price": {"per_call_micro": 5000}, "async": copy.deepcopy(ASYNC)},
               {"id": "vid.tasks.get", "method": "GET", "path": "/tasks/{id}", "params": [{"name": "id", "in": "path"}],
                "price": {"per_call_micro": 0}},
               {"id": "vid.files.get", "method": "GET", "path": "/files", "params": [{"name": "id", "in": "query"}],
                "price": {"per_call_micro": 0}},
               {"id": "vid.paid", "method": "GET", "path": "/paid/{id}", "params": [{"name": "id", "in": "path"}],
                "price": {"per_call_micro": 10}},
           ]}
    row.update(over)
    return row


def problems(row: dict[str, Any]) -> list[tuple[str, str, str]]:
    with pytest.raises(CatalogError) as info:
        build_catalog([("dir:vid.py", [row])], INJECTORS)
    return [(p.plugin, p.row, p.field) for p in info.value.problems]


def test_a_valid_descriptor_marks_its_poll_and_fetch():
    reg = build_catalog([("dir:vid.py", [vid()])], INJECTORS)
    sub = reg.get("vid.create").async_job
    assert isinstance(sub, Submission) and sub.poll == "vid.tasks.get" and sub.price_on == "done"
    poll, fetch = reg.get("vid.tasks.get").async_job, reg.get("vid.files.get").async_job
    assert isinstance(poll, Utility) and poll.kind == "poll" and poll.submissions == ("vid.create",)
    assert isinstance(fetch, Utility) and fetch.kind == "fetch" and fetch.by_result_id
    assert reg.get("vid.paid").async_job is None
    assert reg.get("vid.create").to_json()["async"]["poll"] == "vid.tasks.get"


@pytest.mark.parametrize("change,field", [
    ({"poll": "vid.nope"}, "async.poll"),
    ({"fetch": "other.files.get"}, "async.fetch"),
    ({"poll": "vid.paid"}, "async.poll"),               # a poll must be free
    ({"poll": "vid.create"}, "async.poll"),             # the submission itself
    ({"task_param": "task"}, "async.task_param"),       # the poll declares no such parameter
    ({"task_param": "a b"}, "async.task_param"),
    ({"task_id": "data..id"}, "async.task_id"),
    ({"status_path": 7}, "async.status_path"),
    ({"done": []}, "async.done"),
    ({"failed": ["completed"]}, "async.failed"),        # listed as done too
    ({"price_on": "later"}, "async.price_on"),
    ({"fetch": None}, "async.result_id_path"),          # a result id with nothing to fetch it
    ({"expect": "x"}, "async.expect"),                  # unknown field
])
def test_a_bad_descriptor_names_plugin_row_and_field(change, field):
    row = vid()
    row["endpoints"][0]["async"].update(change)
    assert ("dir:vid.py", "endpoint 'vid.create'", field) in problems(row)


def test_a_descriptor_that_is_not_a_dict_and_a_spooled_submission_are_refused():
    row = vid()
    row["endpoints"][0]["async"] = ["poll"]
    assert problems(row) == [("dir:vid.py", "endpoint 'vid.create'", "async")]
    row = vid()
    row["endpoints"][0]["spooled_response"] = True
    assert ("dir:vid.py", "endpoint 'vid.create'", "async") in problems(row)


def test_one_utility_serves_one_role():
    row = vid()
    second = copy.deepcopy(row["endpoints"][0])
    second["id"] = "vid.create2"
    second["async"].update(poll="vid.files.get", fetch=None, result_id_path=None)  # vid.files.get is a fetch above
    row["endpoints"].append(second)
    assert ("dir:vid.py", "endpoint 'vid.create2'", "async.poll") in problems(row)


TABLES = {"async_jobs"}


def _diff_names(diff: Any) -> set[str]:
    item = diff[0] if isinstance(diff, list) else diff
    names = set()
    for part in item[1:] if isinstance(item, tuple) else ():
        table = getattr(part, "table", None)
        names.add(table.name if table is not None else getattr(part, "name", part))
    return {n for n in names if isinstance(n, str)}


def test_schema_matches_migration(dsn):
    with migrate.engine_for(dsn).connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), metadata)
        assert TABLES <= set(inspect(conn).get_table_names())
        assert "kind" in {c["name"] for c in inspect(conn).get_columns("calls")}
    assert [d for d in diffs if _diff_names(d) & (TABLES | {"kind", "calls"})] == []


def test_0007_up_down_up(pg_base):
    assert_up_down_up(pg_base, "0007", "0007_async_jobs", TABLES, columns={"calls": {"kind"}})
