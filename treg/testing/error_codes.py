"""Find every error ``code`` treg's source can produce, by reading the source (``ast``), for
tests/test_errors_doc.py (docs/errors.md lists every code, and nothing else).

A code is found as:

* a class-level ``code = "..."`` (or ``status, code, blame = ..., "...", ...``) in a class body;
* a ``code=...`` keyword of a call, where the value is a string literal, a conditional of readable
  values, a parameter of the enclosing function (read from every call of that function in the same
  module, by position or keyword), or a local assigned from ``TABLE.get(key, "default")`` on a
  module-level dict of strings (the table's values and the default).

A ``code=`` the reader cannot follow is reported as unreadable, so a new indirection fails the test
instead of hiding a code.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

#: the tree treg is imported from (a checkout: ``treg/``, ``plugins/``, ``docs/``); paths are relative to it
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Use:
    code: str
    path: str  # relative to the repository
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


class _Module:
    def __init__(self, path: Path) -> None:
        self.path = str(path.relative_to(ROOT))
        self.tree = ast.parse(path.read_text(), filename=self.path)
        self.parent: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(self.tree):
            for child in ast.iter_child_nodes(node):
                self.parent[child] = node
        self.tables = {t.id: node.value for node in self.tree.body if isinstance(node, ast.Assign)
                       and isinstance(node.value, ast.Dict) for t in node.targets if isinstance(t, ast.Name)}
        self.functions = {n.name: n for n in ast.walk(self.tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def enclosing(self, node: ast.AST) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        while node in self.parent:
            node = self.parent[node]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                return node
        return None

    def resolve(self, expr: ast.expr, depth: int = 0) -> list[str] | None:
        if depth > 5:
            return None
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            return [expr.value]
        if isinstance(expr, ast.IfExp):
            a, b = self.resolve(expr.body, depth + 1), self.resolve(expr.orelse, depth + 1)
            return None if a is None or b is None else a + b
        if isinstance(expr, ast.Name):
            func = self.enclosing(expr)
            if func is None:
                return None
            params = [a.arg for a in func.args.posonlyargs + func.args.args]
            if expr.id in params or expr.id in [a.arg for a in func.args.kwonlyargs]:
                return self._from_callers(func, expr.id, depth)
            return self._from_local(func, expr.id, depth)
        return None

    def _from_callers(self, func: ast.FunctionDef | ast.AsyncFunctionDef, name: str, depth: int) -> list[str] | None:
        params = [a.arg for a in func.args.posonlyargs + func.args.args]
        out: list[str] = []
        for call in ast.walk(self.tree):
            if not isinstance(call, ast.Call):
                continue
            callee = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", None)
            if callee != func.name:
                continue
            offset = 1 if params[:1] in (["self"], ["cls"]) and isinstance(call.func, ast.Attribute) else 0
            arg: ast.expr | None = next((k.value for k in call.keywords if k.arg == name), None)
            if arg is None and name in params and params.index(name) - offset < len(call.args):
                arg = call.args[params.index(name) - offset]
            if arg is None:
                return None
            found = self.resolve(arg, depth + 1)
            if found is None:
                return None
            out += found
        return out or None

    def _from_local(self, func: ast.AST, name: str, depth: int) -> list[str] | None:
        for node in ast.walk(func):
            if not (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)):
                continue
            value = node.value
            if (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "get"
                    and isinstance(value.func.value, ast.Name) and value.func.value.id in self.tables):
                table = self.tables[value.func.value.id]
                vals = [v.value for v in table.values if isinstance(v, ast.Constant) and isinstance(v.value, str)]
                if len(vals) != len(table.values):
                    return None
                default = self.resolve(value.args[1], depth + 1) if len(value.args) > 1 else []
                return None if default is None else vals + default
            return self.resolve(value, depth + 1)
        return None


def scan(roots: Iterable[str] = ("treg", "plugins")) -> tuple[list[Use], list[str]]:
    """Every code use in the source, and every ``code=`` that could not be read (``path:line: expr``)."""
    uses: list[Use] = []
    unreadable: list[str] = []
    for root in roots:
        for path in sorted((ROOT / root).rglob("*.py")):
            mod = _Module(path)
            for node in ast.walk(mod.tree):
                if isinstance(node, ast.ClassDef):
                    uses += [Use(c, mod.path, line) for c, line in _class_codes(node)]
                elif isinstance(node, ast.keyword) and node.arg == "code" and isinstance(mod.parent.get(node), ast.Call):
                    found = mod.resolve(node.value)
                    if found is None:
                        unreadable.append(f"{mod.path}:{node.value.lineno}: code={ast.unparse(node.value)}")
                    else:
                        uses += [Use(c, mod.path, node.value.lineno) for c in found]
    return uses, unreadable


def _class_codes(cls: ast.ClassDef) -> list[tuple[str, int]]:
    out = []
    for st in cls.body:
        if not isinstance(st, ast.Assign):
            continue
        for target in st.targets:
            if isinstance(target, ast.Name) and target.id == "code" and isinstance(st.value, ast.Constant):
                out.append((st.value.value, st.lineno))
            elif isinstance(target, ast.Tuple) and isinstance(st.value, ast.Tuple):
                for t, v in zip(target.elts, st.value.elts):
                    if isinstance(t, ast.Name) and t.id == "code" and isinstance(v, ast.Constant):
                        out.append((v.value, st.lineno))
    return out
