"""Every module of treg imports on its own, first of treg's (as aiohttp's tests/test_circular_imports.py).

Inside one test session modules are imported in whatever order the tests happen to need them, so a
cycle that only works when one side is imported first (a function-level import papering over it, a
module that needs the other half-initialised) goes unnoticed. Here each module is the first of
treg's that a fresh process imports, one at a time: an import order a plugin, the CLI or a script may
well use. The harness is treg/testing/import_each.py (one fork per module of a process holding only the
third-party dependencies).
"""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import treg
import treg_migrations
import treg_plugins
from treg.testing import import_circles

HARNESS = Path(treg.__file__).resolve().parent / "testing" / "import_each.py"
OURS = ["treg", "treg_plugins", "treg_migrations"]
#: ``env.py`` runs the migrations and only imports inside alembic's context; a ``__main__`` runs the program
NOT_IMPORTABLE_ALONE = {"treg_migrations.env", "treg.__main__"}


def modules() -> list[str]:
    names = []
    for package in (treg, treg_plugins, treg_migrations):
        names.append(package.__name__)
        path = [str(Path(p)) for p in package.__path__]
        names += [m.name for m in pkgutil.walk_packages(path, prefix=package.__name__ + ".")]
    return sorted(n for n in names if n not in NOT_IMPORTABLE_ALONE)


def harness(request: dict[str, Any], tmp: Path) -> Any:
    # -I: no cwd, no PYTHON* variables, no script folder: modules are found only as installed
    done = subprocess.run([sys.executable, "-I", str(HARNESS)], input=json.dumps(request),
                          capture_output=True, text=True, timeout=300, cwd=tmp,
                          env={k: v for k, v in os.environ.items() if not k.startswith("TREG_")})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def first_imports(names: list[str], tmp: Path, ours: list[str] = OURS,
                  path: tuple[str, ...] = ()) -> dict[str, Any]:
    common = {"ours": ours, "path": list(path)}
    deps = harness({**common, "mode": "deps", "modules": names}, tmp)
    return harness({**common, "mode": "check", "modules": names, "preload": deps}, tmp)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, Any]:
    return first_imports(modules(), tmp_path_factory.mktemp("imports"))


def test_every_module_is_listed():
    found = modules()
    for expected in ("treg.catalog.alternatives", "treg.catalog.ladder", "treg.testing.databases",
                     "treg_plugins.injectors", "treg_migrations.versions.0001_foundation"):
        assert expected in found
    assert {m.split(".")[0] for m in found} == set(OURS)


@pytest.mark.parametrize("module", modules())
def test_imports_first_without_cycles_or_warnings(module: str, results: dict[str, Any]):
    assert results[module] is None, f"importing {module} first fails:\n{results[module]}"


def test_the_harness_catches_a_cycle_that_works_in_one_order(tmp_path):
    pkg = tmp_path / "cyc"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    # b imports a name a defines only after importing b: fine when b comes first, broken when a does
    (pkg / "a.py").write_text("from cyc import b\nVALUE = 1\n")
    (pkg / "b.py").write_text("from cyc.a import VALUE\n")
    (pkg / "warns.py").write_text("import warnings\nwarnings.warn('at import time')\n")
    out = first_imports(["cyc", "cyc.a", "cyc.b", "cyc.warns"], tmp_path, ours=["cyc"], path=[str(tmp_path)])
    assert out["cyc"] is None and out["cyc.b"] is None
    assert "ImportError" in out["cyc.a"] and "circular import" in out["cyc.a"]
    assert "UserWarning" in out["cyc.warns"]


# -- cycles a function-level import hides -------------------------------------------------------------

ROOTS = {"treg": "treg", "treg_plugins": "plugins", "treg_migrations": "migrations"}
CHECKOUT = Path(__file__).resolve().parent.parent


def import_graph() -> dict[str, set[str]]:
    """module → the modules of ours it imports anywhere (top level or inside a function), except under
    ``if TYPE_CHECKING:`` (annotations only, never executed)."""
    import ast

    files = {}
    for name, folder in ROOTS.items():
        for f in (CHECKOUT / folder).rglob("*.py"):
            parts = list(f.relative_to(CHECKOUT / folder).with_suffix("").parts)
            files[".".join([name] + (parts[:-1] if parts[-1] == "__init__" else parts))] = f

    def module_of(dotted: str) -> str | None:
        while dotted and dotted not in files:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    graph = {}
    for mod, f in files.items():
        tree = ast.parse(f.read_text(), str(f))
        typing_only = {id(n) for node in ast.walk(tree)
                       if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
                       for n in ast.walk(node)}
        targets = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                targets |= {module_of(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets |= {module_of(f"{node.module}.{a.name}") for a in node.names}
        graph[mod] = {t for t in targets if t and t != mod}
    return graph


def test_no_cycle_even_through_function_level_imports():
    graph = import_graph()
    assert "treg.catalog.tiers" in graph["treg.catalog.alternatives"]
    assert import_circles(graph) == []


def test_the_cycle_finder_finds_one():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
