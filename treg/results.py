"""Result classifiers: what a good answer of a catalog endpoint looks like, declared by plugins.

A plugin's ``treg_register_result_classifiers`` returns rows; each names one catalog endpoint and
says, with a predicate on one dotted path of the JSON answer, when the answer is a ``hit`` (the vendor
found something) and when it is a ``miss`` (an explicit empty result). Anything else — not JSON, the
path absent, neither predicate holding — is ``unknown``. The verdict is shared by the audit trail
(``result_state``, business-hit telemetry) and the archive's admission (``treg/call/archive.py``), so
the two can never disagree. Classification only reads a body treg already buffered; it never changes
what is relayed.

Rows are validated once at startup like provider rows: every problem names the plugin, the row and
the field, and treg refuses to start on any (:class:`~treg.catalog.errors.CatalogError`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from treg.catalog.errors import CatalogError, Problem
from treg.jsonpath import MISSING, dig
from treg.catalog.registry import CatalogRegistry
from treg.plugins import PluginFailed, PluginHost, call_hook

HOOK = "treg_register_result_classifiers"
HIT, MISS, UNKNOWN = "hit", "miss", "unknown"
#: why a verdict (the ``tool_called`` event's ``result_reason``): the hit rule held, the miss rule held,
#: the answer is no JSON object or array, or it is JSON and neither rule held
HIT_RULE, MISS_RULE, NOT_JSON, NO_RULE = "hit_rule", "miss_rule", "not_json", "no_rule_held"
REASONS = (HIT_RULE, MISS_RULE, NOT_JSON, NO_RULE)
ROW_KEYS = frozenset({"endpoint", "hit", "miss", "admit_misses"})
#: the predicates, one per rule: ``nonempty``/``empty`` take ``true``; ``equals`` a JSON scalar;
#: ``in`` a non-empty list of JSON scalars
PREDICATES = ("nonempty", "empty", "equals", "in")
_PATH = re.compile(r"\A[A-Za-z0-9_$-]+(\.[A-Za-z0-9_$-]+)*\Z")
_MISSING = MISSING


def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, (str, list, dict)) and len(value) == 0)


def _at(answer: Any, path: str) -> Any:
    """The value at ``path``, or ``_MISSING`` (``empty`` must tell an absent field, which is not an
    explicit empty result, from a JSON null)."""
    return dig(answer, path, _MISSING)


@dataclass(frozen=True)
class Rule:
    """One predicate on the value at ``path``."""

    path: str
    op: str
    operand: Any = None

    def holds(self, answer: Any) -> bool:
        value = _at(answer, self.path)
        if value is _MISSING:
            return False
        if self.op == "nonempty":
            return not _empty(value)
        if self.op == "empty":
            return _empty(value)
        if self.op == "equals":
            return type(value) is type(self.operand) and value == self.operand
        return any(type(value) is type(o) and value == o for o in self.operand)


@dataclass(frozen=True)
class Classifier:
    endpoint: str
    plugin: str
    hit: Rule | None = None
    miss: Rule | None = None
    #: a ``miss`` answer may be stored by the archive too (an explicit "nothing found" worth repeating)
    admit_misses: bool = False

    def classify(self, answer: Any) -> str:
        """``hit``, ``miss`` or ``unknown`` for a decoded JSON answer (None: not JSON). The hit rule is
        asked first, so a row whose rules overlap calls such an answer a hit."""
        return self.explain(answer)[0]

    def explain(self, answer: Any) -> tuple[str, str]:
        """(verdict, reason): :meth:`classify`'s verdict and which of :data:`REASONS` led to it."""
        if not isinstance(answer, (dict, list)):
            return UNKNOWN, NOT_JSON
        if self.hit is not None and self.hit.holds(answer):
            return HIT, HIT_RULE
        if self.miss is not None and self.miss.holds(answer):
            return MISS, MISS_RULE
        return UNKNOWN, NO_RULE

    def admits(self, verdict: str) -> bool:
        """Whether the archive may store an answer so classified (``unknown`` never)."""
        return verdict == HIT or (verdict == MISS and self.admit_misses)

    @property
    def paths(self) -> tuple[str, ...]:
        """The answer's paths the rules read (what a spooled answer must keep as evidence)."""
        return tuple(dict.fromkeys(r.path for r in (self.hit, self.miss) if r is not None))


@dataclass(frozen=True)
class ClassifierRegistry:
    by_endpoint: Mapping[str, Classifier] = field(default_factory=dict)

    @classmethod
    def empty(cls) -> "ClassifierRegistry":
        return cls()

    def get(self, endpoint_id: str | None) -> Classifier | None:
        return self.by_endpoint.get(endpoint_id) if endpoint_id is not None else None


def _rule(raw: Any, where: str, bad: Any) -> Rule | None:
    if not isinstance(raw, Mapping):
        bad(where, "must be a dict {\"path\": \"data.emails\", <one of nonempty, empty, equals, in>}")
        return None
    path = raw.get("path")
    ops = [k for k in raw if k in PREDICATES]
    unknown = sorted(set(raw) - {"path", *PREDICATES})
    if unknown:
        bad(where, f"unknown keys {unknown}; a rule is a path and one of {', '.join(PREDICATES)}")
        return None
    if not isinstance(path, str) or not _PATH.fullmatch(path):
        bad(f"{where}.path", f"{path!r} must be a dotted path into the JSON answer (list items by index: a.0.b)")
        return None
    if len(ops) != 1:
        bad(where, f"needs exactly one of {', '.join(PREDICATES)} (has {ops or 'none'})")
        return None
    op, operand = ops[0], raw[ops[0]]
    if op in ("nonempty", "empty") and operand is not True:
        bad(f"{where}.{op}", "must be true (the opposite rule is the other verdict's)")
        return None
    if op == "equals" and not _is_scalar(operand):
        bad(f"{where}.equals", "must be a JSON scalar (string, number, boolean or null)")
        return None
    if op == "in":
        if not isinstance(operand, (list, tuple)) or not operand or not all(_is_scalar(o) for o in operand):
            bad(f"{where}.in", "must be a non-empty list of JSON scalars")
            return None
        operand = tuple(operand)
    return Rule(path=path, op=op, operand=None if op in ("nonempty", "empty") else operand)


def _row(plugin: str, index: int, data: Any, catalog: CatalogRegistry, taken: dict[str, str],
         problems: list[Problem]) -> Classifier | None:
    row = f"classifier #{index}"

    def bad(field_: str, message: str) -> None:
        problems.append(Problem(plugin, row, field_, message))

    if not isinstance(data, Mapping):
        bad("", f"a classifier must be a dict, not {type(data).__name__}")
        return None
    before = len(problems)
    endpoint = data.get("endpoint")
    if isinstance(endpoint, str):
        row = f"classifier #{index} ({endpoint})"
    for key in sorted(set(data) - ROW_KEYS):
        bad(key, f"unknown classifier field; known: {sorted(ROW_KEYS)}")
    if not isinstance(endpoint, str) or catalog.endpoints.get(endpoint) is None:
        bad("endpoint", f"{endpoint!r} is not an endpoint of the catalog")
    elif endpoint in taken:
        bad("endpoint", f"is already classified by plugin {taken[endpoint]!r} (one classifier per endpoint)")
    if "hit" not in data and "miss" not in data:
        bad("", "a classifier needs a hit rule, a miss rule or both")
    hit = _rule(data["hit"], "hit", bad) if "hit" in data else None
    miss = _rule(data["miss"], "miss", bad) if "miss" in data else None
    admit = data.get("admit_misses", False)
    if not isinstance(admit, bool):
        bad("admit_misses", "must be true or false")
    elif admit and "miss" not in data:
        bad("admit_misses", "admits misses, but the row has no miss rule")
    if len(problems) > before:
        return None
    taken[endpoint] = plugin
    return Classifier(endpoint=endpoint, plugin=plugin, hit=hit, miss=miss, admit_misses=admit)


def build_classifiers(declared: Iterable[tuple[str, Any]], catalog: CatalogRegistry) -> ClassifierRegistry:
    """``(plugin, hook result)`` pairs → the registry, or :class:`CatalogError` listing every problem."""
    problems: list[Problem] = []
    taken: dict[str, str] = {}
    out: dict[str, Classifier] = {}
    for plugin, result in declared:
        if result is None:
            continue
        if isinstance(result, Mapping) or not isinstance(result, (list, tuple)):
            problems.append(Problem(plugin, HOOK, "", "must return a list of classifier dicts (or None), not "
                                    f"{type(result).__name__}"))
            continue
        for i, data in enumerate(result):
            c = _row(plugin, i, data, catalog, taken, problems)
            if c is not None:
                out[c.endpoint] = c
    if problems:
        raise CatalogError(problems)
    return ClassifierRegistry(out)


def load_classifiers(pm: PluginHost, catalog: CatalogRegistry) -> ClassifierRegistry:
    """Every plugin's classifiers, validated against ``catalog`` (startup; raises :class:`CatalogError`)."""
    try:
        results = call_hook(pm, HOOK)
    except PluginFailed as exc:
        raise CatalogError([Problem(exc.plugin, HOOK, "", f"the hook raised {exc.__cause__!r}")]) from exc
    return build_classifiers(sorted(((r.plugin, r.value) for r in results), key=lambda item: item[0]), catalog)
