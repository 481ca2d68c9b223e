"""The ``table`` descriptor of a catalog row, validated at startup with the row's other fields, and the
table made of an answer (treg/catalog/table.py): pure, no I/O."""

from __future__ import annotations

import csv
import io
import json

import pandas
import pytest

from treg.catalog import table as tables
from treg.catalog.errors import CatalogError
from treg.testing import build_catalog_of, catalog_problems, contract_provider


def with_table(value, i=0, **extra):
    def mutate(data):
        data["endpoints"][i]["table"] = value
        data["endpoints"][i].update(extra)
    return mutate


@pytest.mark.parametrize("value, field", [
    ("data.items", "table"),
    ({"rows": 1}, "table.rows"),
    ({"rows": "data items"}, "table.rows"),
    ({"rows": "data\nitems"}, "table.rows"),
    ({"rows": "x", "colums": []}, "table.colums"),
    ({"rows": "x", "columns": []}, "table.columns"),
    ({"rows": "x", "columns": "id"}, "table.columns"),
    ({"rows": "x", "columns": [{"name": "id"}]}, "table.columns[0].path"),
    ({"rows": "x", "columns": [{"path": "id"}]}, "table.columns[0].name"),
    ({"rows": "x", "columns": [{"name": " ", "path": "id"}]}, "table.columns[0].name"),
    ({"rows": "x", "columns": [{"name": "a", "path": "id", "type": "int"}]}, "table.columns[0].type"),
    ({"rows": "x", "columns": [{"name": "a", "path": "."}]}, "table.columns[0].path"),
    ({"rows": "x", "columns": [{"name": "a", "path": "id"}, {"name": "a", "path": "b"}]}, "table.columns[1].name"),
    ({"rows": "x", "columns": ["id"]}, "table.columns[0]"),
])
def test_a_bad_descriptor_stops_startup_naming_the_plugin_row_and_field(value, field):
    problems = catalog_problems(with_table(value))
    assert [(p.plugin, p.row, p.field) for p in problems] == [("acme-plugin", "endpoint 'acme.items.get'", field)]


def test_a_spooled_row_has_no_table():
    problems = catalog_problems(with_table({"rows": "data"}, spooled_response=True))
    assert [p.field for p in problems] == ["table"]


def test_a_good_descriptor_is_loaded_and_listed():
    data = contract_provider()
    data["endpoints"][0]["table"] = {"rows": "data.items", "columns": [{"name": "email", "path": "contact.email"}]}
    data["endpoints"][1]["table"] = {"rows": ""}
    registry = build_catalog_of(data)
    ep = registry.endpoints["acme.items.get"]
    assert ep.table == tables.TableSpec("data.items", (tables.Column("email", "contact.email"),))
    assert ep.to_json()["table"] == {"rows": "data.items", "columns": [{"name": "email", "path": "contact.email"}]}
    assert registry.endpoints["acme.items.create"].table.to_json() == {"rows": ""}


def spec(rows="items", columns=None):
    bad = []
    out = tables.check_row({"rows": rows, **({"columns": columns} if columns is not None else {})},
                           lambda f, m: bad.append(f))
    assert bad == [] and out is not None
    return out


def test_rows_columns_missing_values_and_non_object_rows():
    doc = tables.parse(b'{"items": [{"a": 1, "b": {"c": [10, 20]}}, {"b": null, "d": true}, 7, [1]]}')
    t = tables.make_table(spec(), doc, 100)
    assert t.columns == ("a", "b", "d")
    assert t.rows[0] == ("1", {"c": ["10", "20"]}, None) and t.rows[1] == (None, None, True)
    assert t.rows[2] == t.rows[3] == (None, None, None)
    t = tables.make_table(spec(columns=[{"name": "c1", "path": "b.c.1"}, {"name": "a", "path": "a"}]), doc, 100)
    assert t.columns == ("c1", "a") and t.rows[0] == ("20", "1") and t.rows[1] == (None, None)
    assert tables.make_table(spec("nope"), doc, 100) is None
    assert tables.make_table(spec("items.0"), doc, 100) is None  # an object, not an array
    top = tables.make_table(spec(""), tables.parse(b'[{"x": 1}]'), 100)
    assert top.columns == ("x",) and top.rows == (("1",),)
    assert tables.make_table(spec(""), tables.parse(b'{"x": 1}'), 100) is None


def test_truncation_keeps_the_first_rows_and_the_union_of_their_keys():
    doc = {"items": [{"a": 1}, {"b": 2}, {"c": 3}]}
    t = tables.make_table(spec(), doc, 2)
    assert t.truncated and t.columns == ("a", "b") and len(t.rows) == 2
    assert not tables.make_table(spec(), doc, 3).truncated
    assert tables.make_table(spec(), doc, 0).rows == () and tables.make_table(spec(), doc, 0).truncated


def test_json_keeps_numbers_as_written_and_is_valid_json():
    raw = b'{"items": [{"n": 1.50, "e": -1E+3, "big": 123456789012345678901234567890, "s": "\\ud800x", "u": "\xc3\xa9"}]}'
    t = tables.make_table(spec(), tables.parse(raw), 10)
    out = tables.to_json(t)
    assert b"1.50" in out and b"-1E+3" in out and b"123456789012345678901234567890" in out
    doc = json.loads(out)
    assert doc["rows"][0][:3] == [1.5, -1000.0, 123456789012345678901234567890] and doc["rows"][0][4] == "é"
    assert doc["rows"][0][3] == "\ud800x"  # a lone surrogate stays an escape, the bytes stay UTF-8
    out.decode("utf-8")
    with pytest.raises(ValueError):
        tables.parse(b'{"items": [NaN]}')
    with pytest.raises(ValueError):
        tables.parse(b'{"items": [Infinity]}')


@pytest.mark.parametrize("text", ["=1+1", "+1", "-1", "@x", "\t=1", "\r=1", "\n=1", "|calc", "%x", "\uff1d1",
                                  "\uff0b1", "\uff0d1", "\uff20x", " =1", "\xa0=1", "\u3000+1", "  \t@x"])
def test_every_trigger_is_defused(text):
    assert tables.defused(text) == "'" + text


@pytest.mark.parametrize("text", ["", "hello", "1+1", "a=b", "'=already", "(1)", "#tag", "!x", " hi", "[1]"])
def test_ordinary_text_is_left_alone(text):
    assert tables.defused(text) == text


def test_csv_cells_and_a_real_reader():
    t = tables.Table(("=name", "n", "b", "z", "o"), (
        ("=x", tables.Number("-5"), True, None, {"k": [tables.Number("1e2"), "=y"]}),
        ("-5", tables.Number("0.10"), False, "", ["a,b", 'q"'])), False)
    out = tables.to_csv(t)
    rows = list(csv.reader(io.StringIO(out.decode(), newline="")))
    assert rows == [["'=name", "n", "b", "z", "o"],
                    ["'=x", "-5", "true", "", '{"k":[1e2,"=y"]}'],
                    ["'-5", "0.10", "false", "", '["a,b","q\\""]']]
    assert out.count(b"\r\n") == 3
    frame = pandas.read_csv(io.BytesIO(out), dtype=str, keep_default_na=False)
    assert list(frame.columns) == ["'=name", "n", "b", "z", "o"] and frame["'=name"].tolist() == ["'=x", "'-5"]


@pytest.mark.parametrize("fmt, accept, csv_wanted", [
    (None, None, False), (None, "", False), (None, "text/csv", True), (None, "TEXT/CSV; charset=utf-8", True),
    (None, "application/json", False), (None, "*/*", False), (None, "text/csv;q=0", False),
    (None, "text/csv, application/json", True), (None, "application/json, text/csv", False),
    (None, "application/json;q=0.5, text/csv", True), (None, "text/csv;q=0.4, application/json;q=0.9", False),
    (None, "text/csv;q=bad", False), ("csv", "application/json", True), ("json", "text/csv", False),
])
def test_the_answer_format(fmt, accept, csv_wanted):
    assert tables.wants_csv(fmt, accept) is csv_wanted


def test_the_loader_collects_every_problem_of_a_table_at_once():
    data = contract_provider()
    data["endpoints"][0]["table"] = {"rows": 3, "columns": [{"name": "a"}, {"path": "b"}]}
    with pytest.raises(CatalogError) as exc:
        build_catalog_of(data)
    assert sorted(p.field for p in exc.value.problems) == ["table.columns[0].path", "table.columns[1].name",
                                                           "table.rows"]
