"""An endpoint's declared success rule: when a vendor's answer counts as a success for money
(sharing.md "The declared success rule"; docs/plugins.md, docs/money.md).

Many vendors answer ``200`` with an error inside. A row may say what a success looks like::

    "success": {"status": [200, 201], "path": "error", "absent": True}
    "success": {"path": "status", "equals": "ok"}
    "success": {"path": "data.items", "nonempty": True}

``status`` lists the 2xx statuses that may count (default: any 2xx; a non-2xx is never a success);
``absent`` holds when the value at ``path`` is missing or ``null``; ``equals`` when it is that JSON
scalar (type and value: ``1`` is not ``true``); ``nonempty`` when it is not ``null``, ``""``, ``[]`` or
``{}``. An answer that is not JSON (or is JSON ``null``) fails a rule that names a path. Without a rule,
any 2xx is a success.

What the rule decides, in one place each: a billed call's money (a 2xx failing it releases its hold,
``treg/call/settle.py``), an async submission's acceptance and what its done poll reads as ``failed``
(``treg/call/jobs.py``, frozen with the job's terms), what the archive stores (``treg/call/archive.py``),
and whether a routed call's child answered (``treg/call/routed.py``). The bytes are relayed unchanged.

Pure: validated with the other row fields at startup (:func:`parse`), every problem naming the plugin,
the row and the field.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping

from treg.jsonpath import MISSING, dig

KEYS = frozenset({"status", "path", "absent", "equals", "nonempty"})
PREDICATES = ("absent", "equals", "nonempty")
_PATH = re.compile(r"\A[A-Za-z0-9_$-]+(\.[A-Za-z0-9_$-]+)*\Z")

#: the loader's report of one problem of the row: ``(field, message)``
Report = Callable[[str, str], None]


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, bool, int)) or (isinstance(v, float) and math.isfinite(v))


def json_equal(a: Any, b: Any) -> bool:
    """JSON equality without Python's ``True == 1`` (the catalog's enums compare by it too)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, (str, list, dict)) and len(value) == 0)


@dataclass(frozen=True)
class SuccessRule:
    #: the statuses that may count (None: any 2xx)
    statuses: tuple[int, ...] | None = None
    path: str | None = None
    op: Literal["absent", "equals", "nonempty"] | None = None
    operand: Any = None

    def holds(self, status: int, answer: Any) -> bool:
        """Whether an answer of ``status`` whose decoded JSON is ``answer`` (None: not JSON) is a success."""
        if not 200 <= status < 300 or (self.statuses is not None and status not in self.statuses):
            return False
        if self.path is None:
            return True
        if answer is None:
            return False  # not JSON: a rule that names a path cannot hold
        value = dig(answer, self.path, MISSING)
        if self.op == "absent":
            return value is MISSING or value is None
        if value is MISSING:
            return False
        if self.op == "equals":
            return json_equal(value, self.operand)
        return not _empty(value)

    @property
    def paths(self) -> tuple[str, ...]:
        """The answer's paths the rule reads (what a spooled answer must keep as evidence)."""
        return (self.path,) if self.path is not None else ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.statuses is not None:
            out["status"] = list(self.statuses)
        if self.path is not None:
            out["path"] = self.path
            out[str(self.op)] = True if self.op in ("absent", "nonempty") else self.operand
        return out


def succeeded(rule: SuccessRule | None, status: int, answer: Any) -> bool:
    """The endpoint's verdict on an answer: its rule's, else any 2xx."""
    return 200 <= status < 300 if rule is None else rule.holds(status, answer)


def parse(raw: Any, report: Report) -> SuccessRule | None:
    """The row's ``success`` (None: absent, or invalid: then every problem is reported)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        report("success", "must be a dict {status?, path, absent | equals | nonempty}")
        return None
    bad = False

    def problem(field: str, message: str) -> None:
        nonlocal bad
        bad = True
        report(f"success.{field}" if field else "success", message)

    for key in sorted(set(raw) - KEYS, key=str):
        problem(str(key), f"unknown success field; known: {sorted(KEYS)}")
    statuses = None
    if "status" in raw:
        given = raw["status"]
        if (not isinstance(given, (list, tuple)) or not given
                or not all(isinstance(s, int) and not isinstance(s, bool) and 200 <= s <= 299 for s in given)):
            problem("status", "must be a non-empty list of 2xx statuses (a non-2xx answer is never a success)")
        elif len(set(given)) != len(given):
            problem("status", "lists a status twice")
        else:
            statuses = tuple(given)
    predicates = [p for p in PREDICATES if p in raw]
    path = raw.get("path")
    if path is None:
        if predicates:
            problem(predicates[0], "needs a path: the value it judges")
        elif "status" not in raw:
            problem("", "says nothing: give a path and one of absent, equals, nonempty (and/or status)")
    elif not isinstance(path, str) or not _PATH.fullmatch(path):
        problem("path", f"{path!r} must be a dotted path into the JSON answer (such as 'error' or 'data.items')")
    elif len(predicates) != 1:
        problem("path", "takes exactly one of absent, equals, nonempty")
    op = predicates[0] if len(predicates) == 1 else None
    if op in ("absent", "nonempty") and raw[op] is not True:
        problem(op, "must be true")
    if op == "equals" and not _scalar(raw["equals"]):
        problem("equals", "must be a JSON scalar (a string, number, true, false or null)")
    if bad:
        return None
    return SuccessRule(statuses=statuses, path=path, op=op if path is not None else None,  # type: ignore[arg-type]
                       operand=raw.get("equals") if op == "equals" else None)


def from_json(raw: Any) -> SuccessRule | None:
    """A rule stored with an async job's terms (written by :meth:`SuccessRule.to_json`); None: none, or a
    stored value treg cannot read (the job then settles as a job without a rule)."""
    if not isinstance(raw, Mapping) or not raw:
        return None
    problems: list[str] = []
    rule = parse(raw, lambda field, message: problems.append(field))
    return None if problems else rule
