"""JSON from outside treg is read by one module (treg/json_text.py): it reads what ``json.loads`` reads, a
document nested too deeply is a ``ValueError`` of its own (``TooDeep``), never a ``RecursionError``, and
every other ``json.loads`` in treg reads text treg wrote itself (the table below, checked both ways).
The calls that read such JSON end to end: tests/test_deep_json_calls.py."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from treg import json_text

CHECKOUT = Path(__file__).resolve().parent.parent
DEEP = 50_000

#: the files that may call ``json.loads``/``json.load`` themselves, each with the text it reads: treg's own
OWN_TEXT = {
    "treg/json_text.py": "the reader itself",
    "treg/oauth/store.py": "a connection's tokens, sealed by treg",
    "treg/secrets_store.py": "a JSON secret as treg stored it (checked like any API body when it was created)",
    "treg/org_data.py": "the same secret, read to inject it",
    "treg/call/redirects.py": "a redirect grant treg sealed",
    "treg/infra/embedded_pg.py": "the embedded server's pid list, written by treg",
}


def deep_array(n: int) -> bytes:
    return b"[" * n + b"1" + b"]" * n


def nested_list(n: int) -> list:
    value: list = []
    for _ in range(n):
        value = [value]
    return value


CORPUS = [b'{"a": 1, "a": 2}', b'{"a": {"x": 1}, "a": [1]}', b" \n\t[1] ", b'"\\u00e9\\ud83d\\ude00"', b'"\\ud800"',
          b"18446744073709551616", b"-9223372036854775809", b"1e400", b"NaN", b"[Infinity, -Infinity]", b"5e-324",
          b"0.1", b"\xef\xbb\xbf[1]", '{"k": "é"}'.encode("utf-16"), '[1, "x"]'.encode("utf-32-le"),
          "[1]", '{"é": [true, false, null]}', deep_array(200)]
BAD = [b"", b"[1,2,]", b'{"a": 1,}', b"01", b"-", b"[1]\x00", b"\xff\xfe\xfd", b'{"a" 1}', "[1", b"'x'"]


@pytest.mark.parametrize("data", CORPUS)
def test_parse_reads_what_json_loads_reads(data):
    got = json_text.parse(data)
    assert repr(got) == repr(json.loads(data))  # repr: NaN, -0.0, int against float and key order alike


@pytest.mark.parametrize("data", BAD)
def test_parse_refuses_what_json_loads_refuses_with_its_own_error(data):
    with pytest.raises(ValueError) as caught:
        json_text.parse(data)
    with pytest.raises(type(caught.value)):
        json.loads(data)


@pytest.mark.parametrize("data", [deep_array(DEEP), deep_array(DEEP).decode(), b'{"a":' * DEEP + b"1" + b"}" * DEEP,
                                  b"[" * DEEP])  # the last is not even JSON: the parser recursed before it could say
def test_a_document_nested_too_deeply_is_too_deep_a_value_error(data):
    with pytest.raises(RecursionError):
        json.loads(data)  # what the sites caught before: not a ValueError
    with pytest.raises(json_text.TooDeep) as caught:
        json_text.parse(data)
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value.__cause__, RecursionError)


def test_a_hooks_own_refusal_keeps_its_class():
    class Duplicate(ValueError):
        pass

    def no_duplicates(pairs):
        if len({k for k, _ in pairs}) < len(pairs):
            raise Duplicate(pairs[0][0])
        return dict(pairs)

    with pytest.raises(Duplicate):
        json_text.parse(b'{"a": 1, "a": 2}', object_pairs_hook=no_duplicates)
    assert json_text.parse(b'{"a": 1}', object_pairs_hook=no_duplicates) == {"a": 1}
    with pytest.raises(json_text.TooDeep):
        json_text.parse(b'{"a":' * DEEP + b"1" + b"}" * DEEP, object_pairs_hook=no_duplicates)


def test_parse_file_reads_from_where_the_file_stands(tmp_path):
    path = tmp_path / "doc.json"
    path.write_bytes(b"xx" + b'{"a": [1, 2]}')
    with path.open("rb") as f:
        f.seek(2)
        assert json_text.parse_file(f) == {"a": [1, 2]}
    path.write_bytes(deep_array(DEEP))
    with path.open("rb") as f, pytest.raises(json_text.TooDeep):
        json_text.parse_file(f)


def test_dumps_writes_like_json_dumps_and_a_value_too_deep_is_too_deep():
    value = {"a": [1, "é", None], "b": {"c": 1.5}}
    assert json_text.dumps(value, ensure_ascii=False) == json.dumps(value, ensure_ascii=False)
    with pytest.raises(json_text.TooDeep):
        json_text.dumps(nested_list(DEEP))


def test_nested_deeper_counts_levels_of_arrays_and_objects():
    assert json_text.DEPTH_MAX == 64
    assert not any(json_text.nested_deeper(v) for v in (1, "x" * 100, None, [], {}))
    assert not json_text.nested_deeper(nested_list(63))  # 64 levels: the outer list and 63 inside it
    assert json_text.nested_deeper(nested_list(64))
    obj: dict = {}
    for _ in range(63):
        obj = {"k": obj, "flat": [1, 2]}
    assert not json_text.nested_deeper(obj)
    assert json_text.nested_deeper({"k": obj})
    assert not json_text.nested_deeper(nested_list(2), limit=3) and json_text.nested_deeper(nested_list(3), limit=3)
    assert json_text.nested_deeper(nested_list(DEEP))  # no recursion of its own
    assert not json_text.nested_deeper([[1], [[2]], {"a": {"b": [3]}}], limit=4)


# -- the table: who else calls json.loads ---------------------------------------------------------------

def _json_reads(path: Path) -> list[int]:
    """The lines of ``path`` that call ``json.loads`` or ``json.load`` (as ``json.<name>``, or a name
    imported from ``json``)."""
    tree = ast.parse(path.read_text(), str(path))
    imported = {a.asname or a.name for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module == "json"
                for a in node.names if a.name in ("loads", "load")}
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if (isinstance(f, ast.Attribute) and f.attr in ("loads", "load") and isinstance(f.value, ast.Name)
                and f.value.id == "json") or (isinstance(f, ast.Name) and f.id in imported):
            lines.append(node.lineno)
    return lines


def test_every_json_loads_goes_through_json_text_or_reads_treg_s_own_text():
    found = {}
    for root in ("treg", "plugins"):
        for path in sorted((CHECKOUT / root).rglob("*.py")):
            rel = path.relative_to(CHECKOUT).as_posix()
            if rel.startswith("treg/testing/"):  # fake vendors and servers: test support, not treg
                continue
            lines = _json_reads(path)
            if lines:
                found[rel] = lines
    outside = {f: lines for f, lines in found.items() if f not in OWN_TEXT}
    assert not outside, f"read outside JSON with treg.json_text.parse (or list treg's own text here): {outside}"
    assert sorted(found) == sorted(OWN_TEXT), "OWN_TEXT names a file that no longer calls json.loads"


def test_the_table_sees_an_import_from_json(tmp_path):
    sample = tmp_path / "x.py"
    sample.write_text("from json import loads as l\nimport json\n\n"
                      "def f(b):\n    return l(b), json.load(b), json.dumps(b)\n")
    assert _json_reads(sample) == [5, 5]
