"""treg's layers: which part of the package may import which, checked over the import graph.

The rule is :data:`LAYERS`, lowest first, and docs/architecture.md's "Layers" table says the same
(checked both ways below). A module may import its own layer and every layer below it, never one above.
Every module of ``treg`` is placed (a new one must be given its layer here and in the doc: the longest
entry that names it, a module or a package, places it).

What counts as an import: every ``import`` and ``from … import`` of treg's own modules anywhere in a file,
at module level, inside a function and under ``if TYPE_CHECKING:`` alike (an annotation names a
dependency as much as a call does). ``from pkg import name`` is an import of the module ``pkg.name``
when there is one, else of ``pkg`` (its ``__init__.py``); importing ``pkg.mod`` is not counted as
importing the parent package's ``__init__.py`` too (Python runs it, but it only hands names on).

Circles, with the same imports: none between modules, and none between the folders of any package, each
subfolder counted as one node (as a drawing of that package shows it: ``treg/call/`` is one room in
``treg/``'s picture). tests/test_circular_imports.py checks the other side: each module imports first,
on its own, with the imports that run.

The built-in plugins (``plugins/``, installed as ``treg_plugins``) use only the plugin API, the layers up
to "registries"; the migrations (``treg_migrations``) only "infra" and below.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Iterable

import pytest

from treg.testing import import_circles

CHECKOUT = Path(__file__).resolve().parent.parent
ARCHITECTURE = CHECKOUT / "docs" / "architecture.md"

#: (layer, the modules and packages in it), lowest first; docs/architecture.md "Layers" is this table
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("values", ("treg", "treg.errors", "treg.ids", "treg.frozen", "treg.memo", "treg.events", "treg.jsonpath",
                "treg.json_text", "treg.http_grammar", "treg.uri_grammar", "treg.link_grammar", "treg.names",
                "treg.query", "treg.forwarded", "treg.periodic",
                "treg.logs", "treg.identity", "treg.bindings", "treg.redaction", "treg.spool_budget",
                "treg.call_record", "treg.hold", "treg.origin", "treg.settings", "treg.cookie_names", "treg.domain")),
    ("infra", ("treg.infra", "treg.cache")),
    ("registries", ("treg.hookspecs", "treg.plugins", "treg.catalog", "treg.overflow", "treg.capacity",
                    "treg.results", "treg.metrics", "treg.oauth_runtime", "treg.hub_runs", "treg.startup")),
    ("services", ("treg.context",)),
    ("org data and domain", ("treg.org_changes", "treg.management", "treg.authentication", "treg.membership",
                             "treg.member_limits", "treg.org_settings", "treg.secrets_store", "treg.deny_rules", "treg.tool_urls",
                             "treg.tools", "treg.ui_sessions", "treg.idempotency", "treg.money", "treg.jobs",
                             "treg.owned_resources", "treg.archive", "treg.calls", "treg.reaper", "treg.oauth",
                             "treg.org_data", "treg.public_demo", "treg.hub")),
    ("call pipeline", ("treg.call",)),
    ("mcp", ("treg.mcp",)),
    ("edges", ("treg.web", "treg.keys", "treg.factory", "treg.app", "treg.cli", "treg.doctor", "treg.__main__",
               "treg.testing")),
)
#: packages outside ``treg`` and the highest layer of treg's each may import
OUTSIDE = {"treg_plugins": "registries", "treg_migrations": "infra"}
ROOTS = {"treg": CHECKOUT / "treg", "treg_plugins": CHECKOUT / "plugins", "treg_migrations": CHECKOUT / "migrations"}

Edge = tuple[str, str, str]  # (importing module, imported module, "path:line")


def modules_under(name: str, folder: Path) -> dict[str, Path]:
    out = {}
    for f in sorted(folder.rglob("*.py")):
        parts = list(f.relative_to(folder).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([name, *parts])] = f
    return out


def imports(files: dict[str, Path], known: Iterable[str], ours: tuple[str, ...]) -> list[Edge]:
    """Every import of a module in ``known`` made by a file of ``files``, wherever it stands in the file."""
    known = set(known)

    def module_of(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    edges = []
    for mod, f in files.items():
        tree = ast.parse(f.read_text(), str(f))
        package = mod if f.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(tree):  # every node: module level, functions, if TYPE_CHECKING alike
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, *([node.module] if node.module else [])])
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            for name in names:
                target = module_of(name) if name.split(".")[0] in ours else None
                if target is not None and target != mod:
                    shown = f.relative_to(CHECKOUT) if f.is_relative_to(CHECKOUT) else f
                    edges.append((mod, target, f"{shown}:{node.lineno}"))
    return edges


def layer_of(module: str, layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> int | None:
    """The index of ``module``'s layer: the longest entry naming it or a package above it."""
    best: tuple[int, int] | None = None
    for index, (_, entries) in enumerate(layers):
        for entry in entries:
            if module == entry or (module.startswith(entry + ".") and "." in entry):
                if best is None or len(entry) > best[1]:
                    best = (index, len(entry))
    return best[0] if best is not None else None


def upward(edges: Iterable[Edge], layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS) -> list[str]:
    out = []
    for a, b, where in edges:
        la, lb = layer_of(a, layers), layer_of(b, layers)
        if la is not None and lb is not None and lb > la:
            out.append(f"{where}: {a} ({layers[la][0]}) imports {b} ({layers[lb][0]})")
    return out


def folder_circles(edges: Iterable[Edge], packages: Iterable[str]) -> dict[str, list[list[str]]]:
    """Per package, the circles between its direct children (a module, or a subfolder as one node; the
    package's own ``__init__.py`` is a node of its own)."""
    edges = list(edges)
    out = {}
    for package in packages:
        def node(m: str) -> str | None:
            if m == package:
                return m
            if not m.startswith(package + "."):
                return None
            return package + "." + m[len(package) + 1:].split(".")[0]

        graph: dict[str, set[str]] = {}
        for a, b, _ in edges:
            na, nb = node(a), node(b)
            if na is not None and nb is not None and na != nb:
                graph.setdefault(na, set()).add(nb)
        found = import_circles(graph)
        if found:
            out[package] = found
    return out


def treg_graph() -> tuple[dict[str, Path], list[Edge]]:
    files = modules_under("treg", ROOTS["treg"])
    return files, imports(files, files, ("treg",))


def packages_of(files: dict[str, Path]) -> list[str]:
    return sorted(m for m, f in files.items() if f.name == "__init__.py")


def test_every_module_has_a_layer():
    files, _ = treg_graph()
    assert [m for m in files if layer_of(m) is None] == []
    # each entry names a module or package that exists (a stale entry places nothing)
    assert [e for _, entries in LAYERS for e in entries if e not in files] == []


def test_no_import_points_up_a_layer():
    _, edges = treg_graph()
    assert upward(edges) == []


def test_no_import_circle_between_modules():
    _, edges = treg_graph()
    graph: dict[str, set[str]] = {}
    for a, b, _ in edges:
        graph.setdefault(a, set()).add(b)
    assert import_circles(graph) == []


def test_no_import_circle_between_the_folders_of_any_package():
    files, edges = treg_graph()
    assert folder_circles(edges, packages_of(files)) == {}


@pytest.mark.parametrize("outside", sorted(OUTSIDE))
def test_the_plugins_and_the_migrations_use_only_the_layers_below_them(outside: str):
    treg_files = modules_under("treg", ROOTS["treg"])
    files = modules_under(outside, ROOTS[outside])
    highest = [name for name, _ in LAYERS].index(OUTSIDE[outside])
    found = [(a, b, where) for a, b, where in imports(files, treg_files, ("treg",))]
    assert found, f"{outside} imports nothing of treg: the check reads nothing"
    assert [f"{where}: {b}" for a, b, where in found if (layer_of(b) or 0) > highest] == []


# -- the doc says the same --------------------------------------------------------------------------------

def documented_layers() -> list[tuple[str, tuple[str, ...]]]:
    """docs/architecture.md's "Layers" table: (layer, the modules its row names), lowest first."""
    text = ARCHITECTURE.read_text()
    section = text.split("\n### The layers, as imports\n", 1)[1].split("\n#", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].isdigit():
            continue
        names = []
        for path in re.findall(r"`(treg/[^`]*)`", cells[2]):
            dotted = path.removesuffix("/").removesuffix(".py").replace("/", ".")
            names.append("treg" if dotted == "treg.__init__" else dotted)
        rows.append((cells[1].strip("*"), tuple(names)))
    return rows


def test_docs_architecture_lists_the_same_layers():
    assert documented_layers() == [(name, tuple(entries)) for name, entries in LAYERS]


# -- the checks find what they are for ------------------------------------------------------------------

def test_an_upward_import_is_found_even_under_type_checking(tmp_path):
    """An import added to a real low module, only for annotations: the layer check names it."""
    low = tmp_path / "treg"
    (low / "call").mkdir(parents=True)
    (low / "__init__.py").write_text("")
    (low / "call" / "__init__.py").write_text("")
    (low / "call" / "metered.py").write_text("class SpoolBudget: ...\n")
    (low / "context.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                    "    from treg.call.metered import SpoolBudget\n")
    (low / "cache.py").write_text("def f():\n    from treg import context\n")  # inside a function: counted too
    files = modules_under("treg", low)
    edges = imports(files, files, ("treg",))
    assert sorted((a, b) for a, b, _ in edges) == [("treg.cache", "treg.context"),
                                                   ("treg.context", "treg.call.metered")]
    assert sorted(upward(edges)) == [f"{low / 'cache.py'}:2: treg.cache (infra) imports treg.context (services)",
                                     f"{low / 'context.py'}:3: treg.context (services) imports treg.call.metered "
                                     "(call pipeline)"]


def test_the_real_graph_with_one_upward_import_added_fails():
    files, edges = treg_graph()
    added = [*edges, ("treg.catalog.ladder", "treg.call.relay", "treg/catalog/ladder.py:1")]
    assert upward(added) == ["treg/catalog/ladder.py:1: treg.catalog.ladder (registries) imports treg.call.relay "
                             "(call pipeline)"]


def test_a_circle_is_found_between_modules_and_between_folders():
    edges = [("p.a.x", "p.b.y", ""), ("p.b.y", "p.a.z", ""), ("p.c", "p.a.x", "")]
    graph: dict[str, set[str]] = {}
    for a, b, _ in edges:
        graph.setdefault(a, set()).add(b)
    assert import_circles(graph) == []  # no module imports itself back
    assert folder_circles(edges, ["p", "p.a", "p.b"]) == {"p": [["p.a", "p.b"]]}  # but folder a and b do
    graph.setdefault("p.a.z", set()).add("p.b.y")  # and now two modules do
    assert import_circles(graph) == [["p.a.z", "p.b.y"]]
