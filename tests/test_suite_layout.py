"""The suite's own layout: no test module imports another, and ``tests/`` holds only test modules and
``conftest.py`` (plus data: plugin folders, baselines).

What tests share lives in ``treg.testing`` (shipped, one module per concern, its fixtures a pytest plugin)
or, for a fixture two modules of this suite use, in ``conftest.py``. A test module imported by another
runs its module-level code twice under two names, drags its fixtures into the importer's namespace and
makes one module's refactoring break another's tests; a helper module beside the tests is test support
that plugin authors cannot import from an installed treg.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
#: calls whose first (string) argument names a module to import, or ``module.attr`` to patch
_DYNAMIC = {"import_module", "__import__", "importorskip", "setattr", "delattr"}


def local_names(folder: Path) -> set[str]:
    """What an import of this folder's code is spelled with: its modules, its subfolders, and the folder
    itself (``from tests.test_x import ...``)."""
    return ({p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir() if p.is_dir()}
            | {folder.name})


def _dotted(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def local_imports(path: Path, local: set[str]) -> list[str]:
    """Every import in ``path`` of the folder's own code (``line: name``): ``import``/``from`` statements at
    any depth (in a function too), relative imports, and the string forms ``importlib.import_module("x")``,
    ``__import__``, ``pytest.importorskip`` and ``monkeypatch.setattr("x.NAME", ...)``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] in local]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                names = ["." * node.level + (node.module or "")]
            elif node.module and node.module.split(".")[0] in local:
                names = [node.module]
        elif isinstance(node, ast.Call) and node.args:
            func = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            target = _dotted(node.args[0])
            if func in _DYNAMIC and target and target.split(".")[0] in local and (
                    func not in ("setattr", "delattr") or "." in target):
                names = [target]
        found += [(node.lineno, name) for name in names]
    return [f"{line}: {name}" for line, name in sorted(found)]


def test_no_test_module_imports_another():
    local = local_names(TESTS)
    offenders = {p.name: found for p in sorted(TESTS.glob("*.py")) if (found := local_imports(p, local))}
    assert offenders == {}, ("test modules importing tests/ code; move what they share into treg/testing/ "
                             f"(or a fixture into conftest.py): {offenders}")


def test_tests_holds_only_test_modules_and_conftest():
    helpers = sorted(p.name for p in TESTS.glob("*.py")
                     if not p.name.startswith("test_") and p.name != "conftest.py")
    assert helpers == [], f"helper modules in tests/; they belong in treg/testing/: {helpers}"
    assert not (TESTS / "__init__.py").exists()  # tests/ is no package: nothing imports it as one


def test_the_check_sees_every_form_of_import(tmp_path):
    # the check must be able to fail: each spelling of an import of a sibling is found, other imports are not
    (tmp_path / "test_a.py").write_text("ok = 1\n")
    (tmp_path / "shared_helpers.py").write_text("")
    (tmp_path / "data").mkdir()
    (tmp_path / "test_b.py").write_text('''
import json
import pytest
from treg.testing import Events
import test_a
import test_a as other
from test_a import ok
from shared_helpers import thing
from .test_a import ok
from . import test_a
from data.mod import x
from ''' + tmp_path.name + '''.test_a import ok


def test_x(monkeypatch):
    import test_a
    from test_a import ok
    importlib.import_module("test_a")
    __import__("shared_helpers")
    pytest.importorskip("test_a")
    monkeypatch.setattr("test_a.ok", 2)
    monkeypatch.setattr(json, "dumps", None)
    monkeypatch.setattr("json.dumps", None)
    monkeypatch.setenv("test_a", "1")
''')
    found = local_imports(tmp_path / "test_b.py", local_names(tmp_path))
    assert [f.split(": ", 1)[1] for f in found] == [
        "test_a", "test_a", "test_a", "shared_helpers", ".test_a", ".", "data.mod", f"{tmp_path.name}.test_a",
        "test_a", "test_a", "test_a", "shared_helpers", "test_a", "test_a.ok"], found
    assert local_imports(tmp_path / "test_a.py", local_names(tmp_path)) == []
