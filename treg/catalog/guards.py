"""Request guards on treg's own key: integer ranges and defaults on query and body parameters, so nobody
runs up treg's vendor bill with one request (sharing.md "Request guards on treg's own key"; the seed's
tier-4 checks; docs/plugins.md).

A row declares::

    "guards": [{"param": "limit", "in": "query", "type": "integer", "min": 1, "max": 100, "default": 25},
               {"param": "page_size", "in": "body", "type": "integer", "max": 50}]

On the ``platform`` tier only (the ladder's platform branch, ``treg/catalog/ladder.py``: after the tier
is chosen, before any hold), :func:`apply`:

* refuses 400 ``invalid_parameters`` (with ``param``, ``min``, ``max``) a value outside ``[min, max]``
  (inclusive) or that is not an integer: a query value must be decimal digits with an optional leading
  ``-`` once percent-decoded (``+5``, ``5.0``, ``1e3``, `` 5``, a bare ``?limit`` or an empty one are
  not), a body value a JSON integer (``5.0``, ``"5"``, ``true`` and ``null`` are not); a query parameter
  given twice (in any spelling that decodes to its name: ``limit`` and ``lim%69t``) is refused too, as
  the vendor might read either;
* sends a missing one that has a ``default`` with it: appended to the query, or added as a field of the
  JSON body object (no body counts as ``{}``; the new body gets ``Content-Type: application/json`` and
  its own ``Content-Length``). The caller's bytes are kept: the field is spliced in before the object's
  closing ``}``, nothing re-serialised.

``own`` and ``team`` calls are neither guarded nor defaulted (the account is the team's), nor is the
keyless ``anonymous`` tier. Pure: no I/O.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Sequence
from urllib.parse import quote, unquote_plus

from treg.catalog.descriptors import is_int
from treg.catalog.errors import InvalidParameters
from treg.catalog.placeholders import decode_query_value
from treg.http_grammar import CTL

KEYS = frozenset({"param", "in", "type", "min", "max", "default"})
#: a guard's bound: any integer a vendor's page size or record count could be (far beyond int64 refused)
BOUND_MAX = 10 ** 15
_INTEGER = re.compile(r"\A-?[0-9]+\Z")
#: a query value longer than this cannot be an integer within any bound (and Python refuses to parse
#: a few thousand digits): refused as out of range without converting it
_DIGITS_MAX = 40

#: the loader's report of one problem of the row: ``(field, message)``
Report = Callable[[str, str], None]


@dataclass(frozen=True)
class Guard:
    param: str
    location: Literal["query", "body"]
    min: int | None = None
    max: int | None = None
    default: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"param": self.param, "in": self.location, "type": "integer"}
        for key in ("min", "max", "default"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    def within(self, value: int) -> bool:
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)

    def refusal(self, why: str) -> "GuardRefused":
        lo = "" if self.min is None else f" ≥ {self.min}"
        hi = "" if self.max is None else f" ≤ {self.max}"
        bound = f"an integer{lo}{' and' if lo and hi else ''}{hi}"
        return GuardRefused(f"{self.location} parameter {self.param!r} {why}; on treg's key it must be {bound} "
                            "(with your own or your team's key, the vendor's own limits apply)", self)


class GuardRefused(InvalidParameters):
    """400 ``invalid_parameters`` from a guard: the body names ``param``, ``min`` and ``max`` (null when
    the guard has no such bound)."""

    def __init__(self, detail: str, guard: Guard) -> None:
        super().__init__(detail, parameter=guard.param, param=guard.param)
        self.guard = guard

    def body(self) -> dict[str, Any]:
        out = super().body()
        out["min"], out["max"] = self.guard.min, self.guard.max
        return out


@dataclass(frozen=True)
class Applied:
    """What :func:`apply` adds to the request treg sends."""

    #: ``(name, value)`` query pairs to append, encoded
    query: tuple[tuple[str, str], ...] = ()
    #: the whole body as sent, when a default was added to it (None: the caller's, untouched)
    body: bytes | None = None
    #: the body is treg's own (the caller sent none): it needs ``Content-Type: application/json``
    body_created: bool = False
    #: the fields added to the JSON body object
    body_fields: Mapping[str, int] | None = None


NOTHING = Applied()


def parse(raw: Any, report: Report, *, method: str, params: Sequence[Any], slots: Sequence[str],
          strict_query: bool, body_allowlist: bool) -> tuple[Guard, ...]:
    """The row's ``guards`` (every problem reported; the valid ones returned)."""
    if raw is None:
        return ()
    if not isinstance(raw, (list, tuple)) or not raw:
        report("guards", "must be a non-empty list of {param, in, type: integer, min?, max?, default?}")
        return ()
    out: list[Guard] = []
    seen: set[tuple[str, str]] = set()
    for i, item in enumerate(raw):
        where = f"guards[{i}]"
        if not isinstance(item, Mapping):
            report(where, "must be a dict {param, in, type: integer, min?, max?, default?}")
            continue
        problems: list[str] = []

        def bad(field: str, message: str) -> None:
            problems.append(field)
            report(f"{where}.{field}" if field else where, message)

        for key in sorted(set(item) - KEYS, key=str):
            bad(str(key), f"unknown guard field; known: {sorted(KEYS)}")
        param, loc = item.get("param"), item.get("in")
        if not isinstance(param, str) or not param or len(param) > 200 or CTL.search(param):
            bad("param", "must name the parameter (a non-empty string)")
        if loc not in ("query", "body"):
            bad("in", f"{loc!r} must be query or body")
        if item.get("type") != "integer":
            bad("type", "must be \"integer\" (the one kind of guard)")
        bounds = {}
        for key in ("min", "max", "default"):
            value = item.get(key)
            if value is not None and (not is_int(value) or abs(value) > BOUND_MAX):
                bad(key, f"must be a whole number between -{BOUND_MAX} and {BOUND_MAX}")
                value = None
            bounds[key] = value
        lo, hi, default = bounds["min"], bounds["max"], bounds["default"]
        if lo is None and hi is None and default is None and not problems:
            bad("", "guards nothing: give min, max or default")
        if lo is not None and hi is not None and lo > hi:
            bad("min", f"{lo} is larger than max {hi}")
        if default is not None and ((lo is not None and default < lo) or (hi is not None and default > hi)):
            bad("default", f"{default} is outside [{lo}, {hi}]")
        if isinstance(param, str) and loc in ("query", "body"):
            if (param, loc) in seen:
                bad("param", f"{loc} parameter {param!r} is guarded twice")
            seen.add((param, loc))
            _against_row(bad, param, loc, method=method, params=params, slots=slots, strict_query=strict_query,
                         body_allowlist=body_allowlist)
        if not problems:
            out.append(Guard(param=param, location=loc, min=lo, max=hi, default=default))
    return tuple(out)


def _against_row(bad: Callable[[str, str], None], param: str, loc: str, *, method: str, params: Sequence[Any],
                 slots: Sequence[str], strict_query: bool, body_allowlist: bool) -> None:
    """A guard must agree with the row's own declarations (a declared parameter's location and type, the
    strict modes, the method)."""
    if loc == "body" and method in ("GET", "HEAD"):
        bad("in", f"a {method} has no body; guard it \"in\": \"query\"")
        return
    if loc == "body" and strict_query:
        bad("in", "a strict_query endpoint takes no body")
        return
    if loc == "query" and param in slots:
        bad("param", f"{param!r} fills a path slot; a guard bounds a query or body parameter")
        return
    declared = next((p for p in params if p.name == param), None)
    if declared is not None:
        if declared.location != loc:
            bad("in", f"{param!r} is declared \"in\": \"{declared.location}\"")
        elif declared.type not in (None, "integer") or declared.enum is not None:
            bad("param", f"{param!r} is declared as {declared.type or 'an enum'}; a guard bounds an integer")
    elif loc == "query" and strict_query:
        bad("param", f"strict_query refuses the undeclared query parameter {param!r}: declare it in params")
    elif loc == "body" and body_allowlist:
        bad("param", f"body_allowlist refuses the undeclared body field {param!r}: declare it in params")


def _query_value(guard: Guard, raw: str | None) -> None:
    if raw is None:
        raise guard.refusal("is given without a value")
    text = decode_query_value(raw).decode("utf-8", errors="replace")
    if not _INTEGER.fullmatch(text):
        raise guard.refusal(f"is {text[:40]!r}, not an integer")
    if len(text.lstrip("-").lstrip("0")) > _DIGITS_MAX or not guard.within(int(text)):
        raise guard.refusal(f"is {text[:40]}")


def _splice(body: bytes | None, obj: Mapping[str, Any], fields: Mapping[str, int]) -> tuple[bytes, bool]:
    """The body with ``fields`` added to its top-level JSON object, the caller's bytes otherwise kept (no
    body, or only whitespace: ``{…}`` alone, True)."""
    added = ",".join(f"{json.dumps(k, ensure_ascii=False)}:{v}" for k, v in fields.items()).encode("utf-8")
    if body is None or not body.strip():
        return b"{" + added + b"}", True
    if json.detect_encoding(body) not in ("utf-8", "utf-8-sig"):
        # a UTF-16/32 JSON body (json.loads reads those): a UTF-8 field spliced in would break it
        raise InvalidParameters("on treg's key this endpoint adds a default to the JSON body, which must be "
                                "UTF-8 to take it", parameter=next(iter(fields)))
    end = len(body.rstrip())
    assert body[end - 1:end] == b"}"  # parsed strictly as a JSON object by the platform checks
    sep = b"," if obj else b""
    return body[:end - 1] + sep + added + body[end - 1:], False


def apply(guards: Sequence[Guard], query: Sequence[tuple[str, str | None]], body: bytes | None,
          json_body: Mapping[str, Any] | None) -> Applied:
    """Check every guard against the request (``query``: the caller's raw pairs minus the path slots;
    ``json_body``: the body as the platform checks parsed it, ``{}`` for none) and say what to add."""
    if not guards:
        return NOTHING
    named = [(unquote_plus(k), v) for k, v in query]
    added_query: list[tuple[str, str]] = []
    fields: dict[str, int] = {}
    obj = json_body if json_body is not None else {}
    for g in guards:
        if g.location == "query":
            given = [v for name, v in named if name == g.param]
            if len(given) > 1:
                raise g.refusal(f"is given {len(given)} times (the vendor might read any of them)")
            if given:
                _query_value(g, given[0])
            elif g.default is not None:
                added_query.append((quote(g.param, safe=""), str(g.default)))
        elif g.param in obj:
            value = obj[g.param]
            if not is_int(value):
                raise g.refusal(f"is {json.dumps(value)[:40]}, not a JSON integer")
            if not g.within(value):
                raise g.refusal(f"is {value}")
        elif g.default is not None:
            fields[g.param] = g.default
    if not fields:
        return Applied(query=tuple(added_query)) if added_query else NOTHING
    sent, created = _splice(body, obj, fields)
    return Applied(query=tuple(added_query), body=sent, body_created=created, body_fields=fields)
