"""docs/errors.md lists every error code treg's source can produce, and nothing else; the error tree
of treg/errors.py is what code branches on."""

from __future__ import annotations

import ast
import re
from collections import defaultdict

import pytest

from treg import errors
from treg.testing.error_codes import ROOT, scan

DOC = ROOT / "docs" / "errors.md"
ROW = re.compile(r"^\|\s*`([a-z0-9_]+)`\s*\|\s*([^|]+?)\s*\|\s*([^|]+?)\s*\|", re.M)


def documented(text: str) -> dict[str, tuple[str, str]]:
    """code -> (status, blame) from the tables' rows."""
    return {m.group(1): (m.group(2), m.group(3)) for m in ROW.finditer(text)}


def test_every_code_in_the_source_is_documented_and_every_documented_code_is_used():
    uses, unreadable = scan()
    assert unreadable == [], ("treg/testing/error_codes.py cannot read these code= values; write the code "
                              f"as a literal (or a conditional of literals): {unreadable}")
    where: dict[str, list[str]] = defaultdict(list)
    for use in uses:
        where[use.code].append(str(use))
    doc = documented(DOC.read_text())
    missing = {code: sites for code, sites in sorted(where.items()) if code not in doc}
    assert not missing, "error codes used in the source but missing from docs/errors.md (add a row " \
        "`| code | status | blame | class | when |`):\n" + "\n".join(
            f"  {code!r} used at {', '.join(sites)}" for code, sites in missing.items())
    unused = sorted(set(doc) - set(where))
    assert not unused, f"docs/errors.md lists codes no source file in treg/ or plugins/ uses: {unused}"


def test_class_defaults_match_the_doc():
    doc = documented(DOC.read_text())
    for cls in (errors.BadRequest, errors.Unauthorized, errors.Forbidden, errors.NotFound, errors.Conflict,
                errors.Gone, errors.PaymentRequired, errors.Unprocessable, errors.GatewayFailed,
                errors.SsrfRefused, errors.ConfigError, errors.DatabaseError):
        status, blame = doc[cls.code]
        assert str(cls.status) in status and cls.blame in blame, (cls.__name__, doc[cls.code])


def test_the_scanner_finds_every_form(tmp_path, monkeypatch):
    # the reader must be able to fail: each form it claims to follow is found, an f-string is reported
    from treg.testing import error_codes

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text('''
TABLE = {400: "table_a", 413: "table_b"}

class Custom(Exception):
    status, code, blame = 400, "class_tuple", "caller"

class Other(Exception):
    code = "class_plain"

def refuse(code, detail):
    return Custom(detail, code=code)

def f(key, exc):
    refuse("positional", "x")
    refuse(code="by_keyword", detail="x")
    c = TABLE.get(exc.status, "table_default")
    raise Custom("x", code=c if key else "else_branch")

def g(key):
    raise Custom("x", code=f"dyn_{key}")
''')
    monkeypatch.setattr(error_codes, "ROOT", tmp_path)
    uses, unreadable = error_codes.scan(("pkg",))
    assert {u.code for u in uses} == {"table_a", "table_b", "class_tuple", "class_plain", "positional",
                                      "by_keyword", "table_default", "else_branch"}
    assert unreadable == ["pkg/m.py:20: code=f'dyn_{key}'"]


def test_integrity_error_is_a_conflict_not_a_database_outage():
    assert issubclass(errors.IntegrityError, errors.Conflict)
    assert not issubclass(errors.IntegrityError, errors.DatabaseError)
    assert issubclass(errors.SsrfRefused, errors.GatewayFailed)


async def test_a_constraint_violation_maps_to_integrity_error(svc):
    # over a real PostgreSQL: the mapped error is a Conflict naming the constraint, never a DatabaseError
    async with svc.db.tx() as tx:
        await tx.execute("CREATE TEMP TABLE errdoc_t (x int CONSTRAINT errdoc_pk PRIMARY KEY)")
        await tx.execute("INSERT INTO errdoc_t VALUES (1)")
        with pytest.raises(errors.Conflict) as info:
            await tx.execute("INSERT INTO errdoc_t VALUES (1)")
    assert isinstance(info.value, errors.IntegrityError) and not isinstance(info.value, errors.DatabaseError)
    assert info.value.constraint == "errdoc_pk" and info.value.status == 409 and info.value.blame == "caller"


def test_no_code_string_branches():
    # code branches on classes: no `x.code == "..."` / `x.code in (...)` comparison in treg/ or plugins/
    found = []
    for root in ("treg", "plugins"):
        for path in sorted((ROOT / root).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Compare) and any(
                        isinstance(side, ast.Attribute) and side.attr == "code"
                        for side in (node.left, *node.comparators)):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert found == [], f"branch on an error class (isinstance), not on its code: {found}"
