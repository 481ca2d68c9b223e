"""An endpoint row's ``table`` descriptor and the table made of an answer: pure, no I/O (docs/sharing.md).

    "table": {"rows": "data.items", "columns": [{"name": "id", "path": "id"},
                                                {"name": "email", "path": "contact.email"}]}

``rows`` is the dotted path (:mod:`treg.jsonpath`) of the answer's array of rows (``""``: the answer is
the array); each column names a dotted path into a row. Without ``columns``, the columns are the union
of the rows' top-level keys in first-seen order. A missing value is ``null``.

The answer is parsed keeping every number as the vendor wrote it (:class:`Number`: ``1.50``, ``1e3`` and
a 30-digit id stay exactly those characters, in JSON and in CSV alike), refusing ``NaN``/``Infinity``
(not JSON). Rendered as

* JSON: ``{"columns": [...], "rows": [[...], ...], "truncated": false}``, cells their JSON values;
* CSV (RFC 4180: comma, CRLF, a header line, a field quoted when it holds ``"``, ``,``, CR or LF):
  numbers as written, ``true``/``false``, ``null`` an empty field, arrays and objects as compact JSON
  text, and every text field (column names included) that a spreadsheet could read as a formula
  prefixed with ``'`` (:func:`defused`). Numbers are never prefixed: ``-5`` the number stays ``-5``;
  ``"-5"`` the string becomes ``'-5``.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from treg import json_text, jsonpath
from treg.catalog.descriptors import open_descriptor

KEYS = frozenset({"rows", "columns"})
COLUMN_KEYS = frozenset({"name", "path"})
#: the most columns a row may declare
MAX_COLUMNS = 500
_NAME_MAX = 200

#: the first characters that make a spreadsheet read a text field as a formula or a command: the four
#: of the contract (``=`` ``+`` ``-`` ``@``), tab and CR (OWASP's list: Excel and LibreOffice strip them
#: and read on), LF, ``|`` (Excel's DDE, ``|cmd``), ``%`` (Lotus-style ``%`` macros some importers honour)
#: and their full-width forms (``＝`` ``＋`` ``－`` ``＠``, which Excel in East Asian locales folds into ASCII)
TRIGGERS = frozenset("=+-@\t\r\n|%\uff1d\uff0b\uff0d\uff20")
#: what a spreadsheet skips before it looks for a trigger (`` =1+1`` is evaluated by some)
_LEADING = " \t\r\n\x0b\x0c\xa0\u3000"


class Number(str):
    """A JSON number as its text (``json.loads`` hands its ``parse_int``/``parse_float`` the text)."""

    __slots__ = ()


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse(data: bytes | str) -> Any:
    """The answer as JSON with every number kept as written; ValueError when it is not JSON."""
    return json_text.parse(data, parse_int=Number, parse_float=Number, parse_constant=_not_json)


@dataclass(frozen=True)
class Column:
    name: str
    path: str

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(jsonpath.parts(self.path))

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "path": self.path}


@dataclass(frozen=True)
class TableSpec:
    """A validated ``table`` descriptor."""

    rows: str
    #: None: the union of the rows' top-level keys
    columns: tuple[Column, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rows": self.rows}
        if self.columns is not None:
            out["columns"] = [c.to_json() for c in self.columns]
        return out


def _path_ok(path: str) -> bool:
    return path.isprintable() and not any(c.isspace() for c in path)


def check_row(raw: Any, bad: Callable[[str, str], None]) -> TableSpec | None:
    """The row's ``table`` field validated (None: absent, or a problem reported through ``bad(field,
    message)``, the catalog loader's collector, so it names the plugin and the row)."""
    opened = open_descriptor(raw, "table", "{rows, columns?}", KEYS, bad)
    if opened is None:
        return None
    raw, fail = opened
    rows = raw.get("rows")
    if not isinstance(rows, str) or not _path_ok(rows):
        fail("table.rows", "must be the dotted path of the answer's array of rows (\"data.items\"; \"\": the "
                           "answer itself), without spaces or control characters")
    columns: list[Column] | None = None
    raw_cols = raw.get("columns")
    if raw_cols is not None:
        columns = []
        if not isinstance(raw_cols, (list, tuple)) or not raw_cols or len(raw_cols) > MAX_COLUMNS:
            fail("table.columns", f"must be a list of 1 to {MAX_COLUMNS} columns {{name, path}} (or left out: "
                                  "the rows' top-level keys)")
            raw_cols = ()
        seen: set[str] = set()
        for i, col in enumerate(raw_cols):
            where = f"table.columns[{i}]"
            if not isinstance(col, Mapping):
                fail(where, "must be a dict {name, path}")
                continue
            for key in sorted(set(col) - COLUMN_KEYS):
                fail(f"{where}.{key}", f"unknown column field; known: {sorted(COLUMN_KEYS)}")
            name, path = col.get("name"), col.get("path")
            if not isinstance(name, str) or not name.strip() or len(name) > _NAME_MAX or not name.isprintable():
                fail(f"{where}.name", f"must be a printable name of 1 to {_NAME_MAX} characters")
                continue
            if name in seen:
                fail(f"{where}.name", f"{name!r} names two columns")
            seen.add(name)
            if not isinstance(path, str) or not path or not _path_ok(path) or not jsonpath.parts(path):
                fail(f"{where}.path", "must be the dotted path of the value within a row (\"contact.email\")")
                continue
            columns.append(Column(name, path))
    if fail.count:
        return None
    return TableSpec(rows=rows, columns=tuple(columns) if columns is not None else None)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Table:
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    truncated: bool


def make_table(spec: TableSpec, doc: Any, max_rows: int) -> Table | None:
    """The table ``spec`` reads in the parsed answer ``doc`` (at most ``max_rows`` rows); None when the
    answer holds no array at ``spec.rows``."""
    found = jsonpath.dig(doc, jsonpath.parts(spec.rows), jsonpath.MISSING)
    if not isinstance(found, list):
        return None
    kept = found[:max(0, max_rows)]
    truncated = len(found) > len(kept)
    if spec.columns is not None:
        paths = [c.parts for c in spec.columns]
        names = tuple(c.name for c in spec.columns)
        rows = tuple(tuple(jsonpath.dig(row, p) for p in paths) for row in kept)
        return Table(names, rows, truncated)
    keys: dict[str, None] = {}
    for row in kept:
        if isinstance(row, dict):
            keys.update(dict.fromkeys(row))
    names = tuple(keys)
    # a row that is not an object has no keys: every cell null
    rows = tuple(tuple(row.get(k) for k in names) if isinstance(row, dict) else (None,) * len(names)
                 for row in kept)
    return Table(names, rows, truncated)


# -- rendering -------------------------------------------------------------------------------------

class _Piece(str):
    """Text :func:`_json_text` writes as it is (punctuation, a key), never a value to render."""

    __slots__ = ()


_CLOSE_LIST, _CLOSE_DICT, _COMMA = _Piece("]"), _Piece("}"), _Piece(",")


def _json_text(value: Any) -> str:
    """Compact JSON of a parsed value, its numbers as written.

    Without recursion: a cell holds whatever the vendor nested there, as deep as the parser let it be,
    and this runs after the call's money is settled (a cell nested 600 deep once ended a charged
    ``/table/`` call in a 500). What is left to write is a stack of values and pieces of text."""
    out: list[str] = []
    todo: list[Any] = [value]
    while todo:
        v = todo.pop()
        if type(v) is _Piece:
            out.append(v)
        elif v is None:
            out.append("null")
        elif v is True:
            out.append("true")
        elif v is False:
            out.append("false")
        elif isinstance(v, Number):
            out.append(str.__str__(v))
        elif isinstance(v, str):
            out.append(json.dumps(v, ensure_ascii=False))
        elif isinstance(v, dict):
            out.append("{")
            todo.append(_CLOSE_DICT)
            for i, (k, x) in enumerate(reversed(v.items())):  # pushed last first: popped in order
                todo.append(x)
                todo.append(_Piece(json.dumps(k, ensure_ascii=False) + ":"))
                if i < len(v) - 1:
                    todo.append(_COMMA)
        elif isinstance(v, (list, tuple)):
            out.append("[")
            todo.append(_CLOSE_LIST)
            for i, x in enumerate(reversed(v)):
                todo.append(x)
                if i < len(v) - 1:
                    todo.append(_COMMA)
        elif isinstance(v, (int, float)):  # a value parsed without Number (a test's own dict)
            out.append(json.dumps(v, allow_nan=False))
        else:
            raise TypeError(f"not a JSON value: {type(v).__name__}")
    return "".join(out)


def to_json(table: Table) -> bytes:
    """``{"columns", "rows", "truncated"}`` as UTF-8 JSON."""
    head = "[" + ",".join(json.dumps(c, ensure_ascii=False) for c in table.columns) + "]"
    body = ",".join("[" + ",".join(_json_text(v) for v in row) + "]" for row in table.rows)
    return (f'{{"columns":{head},"rows":[{body}],"truncated":{"true" if table.truncated else "false"}}}'
            .encode("utf-8", "backslashreplace"))


def defused(text: str) -> str:
    """``text`` as a spreadsheet must show it: prefixed with ``'`` when its first character, or the first
    after leading blanks, is a formula trigger (:data:`TRIGGERS`)."""
    if text and (text[0] in TRIGGERS or text.lstrip(_LEADING)[:1] in TRIGGERS):
        return "'" + text
    return text


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, Number):
        return str.__str__(value)  # a number as written, never prefixed
    if isinstance(value, str):
        return defused(value)
    if isinstance(value, (int, float)):
        return json.dumps(value, allow_nan=False)
    return _json_text(value)  # an array or object: its JSON text (it starts with ``[`` or ``{``)


def to_csv(table: Table) -> bytes:
    """RFC 4180 CSV with a header line (UTF-8, no byte-order mark: pandas and csv read it as it is)."""
    out = io.StringIO()
    writer = csv.writer(out, dialect="excel", lineterminator="\r\n", quoting=csv.QUOTE_MINIMAL)
    writer.writerow([defused(c) for c in table.columns])
    writer.writerows([_csv_cell(v) for v in row] for row in table.rows)
    return out.getvalue().encode("utf-8", "backslashreplace")


def wants_csv(query_format: str | None, accept: str | None) -> bool:
    """CSV or JSON: ``?format=csv|json`` decides; else ``Accept`` (``text/csv`` preferred over
    ``application/json`` by its q-value, a tie going to the one listed first); else JSON."""
    if query_format is not None:
        return query_format == "csv"
    found: dict[str, tuple[float, int]] = {}  # media type -> (its best q, where it was first listed)
    for i, item in enumerate((accept or "").split(",")):
        media, *params = (p.strip() for p in item.split(";"))
        media = media.lower()
        if media not in ("text/csv", "application/json"):
            continue
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        first = found[media][1] if media in found else i
        found[media] = (max(q, found.get(media, (q, i))[0]), first)
    csv_q, csv_at = found.get("text/csv", (0.0, 0))
    json_q, json_at = found.get("application/json", (0.0, 0))
    return csv_q > 0 and (csv_q > json_q or (csv_q == json_q and csv_at < json_at))
