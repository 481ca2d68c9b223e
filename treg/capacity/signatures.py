"""Capacity signature rows → a frozen registry, validated at startup like provider rows.

A plugin's ``treg_register_capacity_signatures`` returns dicts; every problem names the plugin, the row
and the field, all problems are collected, and treg refuses to start on any (a :class:`CatalogError`,
the catalog's own error type, so ``treg catalog`` and startup report them the same way).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from treg import http_grammar
from treg.catalog.errors import CatalogError, Problem
from treg.catalog.registry import CatalogRegistry
from treg.plugins import PluginFailed, PluginHost, call_hook

KINDS = ("balance", "quota", "burst", "edge_block")
#: the kinds that strike (and so lock); burst and edge_block never do
STRIKING = ("balance", "quota")
RESET_FORMATS = ("epoch", "http-date", "seconds")
ANY_PROVIDER = "*"
ROW_KEYS = frozenset({"provider", "kind", "status", "body_contains", "body_json", "header", "resets_at",
                      "retry_after_max_s"})
_JSON_PATH = re.compile(r"\A[A-Za-z0-9_$-]+(\.[A-Za-z0-9_$-]+)*\Z")
HOOK = "treg_register_capacity_signatures"


@dataclass(frozen=True)
class Signature:
    """One validated row. Every condition that is set must hold for the row to claim an answer."""

    provider: str  # a catalog provider id, or "*"
    kind: str
    plugin: str
    index: int
    status: tuple[int, ...] = ()
    body_contains: str | None = None  # lower-cased: matched case-insensitively
    body_json_path: str | None = None
    body_json_equals: Any = None
    body_json_pattern: re.Pattern[str] | None = None
    header_name: str | None = None  # lower-cased
    header_equals: str | None = None  # None: the header's presence is enough
    retry_after_max_s: float | None = None
    resets_header: str | None = None
    resets_json_path: str | None = None
    resets_format: str | None = None
    trylast: bool = False

    @property
    def needs_json(self) -> bool:
        return self.body_json_path is not None or self.resets_json_path is not None

    @property
    def label(self) -> str:
        return f"{self.plugin}#{self.index}"


@dataclass(frozen=True)
class SignatureRegistry:
    """Rows in the order they are consulted: plugins' own rows first, ``trylast`` (built-in) rows last."""

    rows: tuple[Signature, ...] = ()

    @classmethod
    def empty(cls) -> "SignatureRegistry":
        return cls()

    def for_provider(self, provider: str) -> tuple[Signature, ...]:
        return tuple(r for r in self.rows if r.provider in (provider, ANY_PROVIDER))


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _row(plugin: str, index: int, data: Any, providers: Mapping[str, Any], trylast: bool,
         problems: list[Problem]) -> Signature | None:
    row = f"signature #{index}"

    def bad(field: str, message: str) -> None:
        problems.append(Problem(plugin, row, field, message))

    if not isinstance(data, Mapping):
        bad("", f"a signature must be a dict, not {type(data).__name__}")
        return None
    before = len(problems)
    for key in sorted(set(data) - ROW_KEYS):
        bad(key, f"unknown signature field; known: {sorted(ROW_KEYS)}")
    provider = data.get("provider")
    if provider != ANY_PROVIDER and (not isinstance(provider, str) or provider not in providers):
        bad("provider", f"{provider!r} is not a provider of the catalog (or \"*\" for any provider)")
    else:
        row = f"signature #{index} ({provider})"
    kind = data.get("kind")
    if kind not in KINDS:
        bad("kind", f"{kind!r} is not one of {', '.join(KINDS)}")
    if provider == ANY_PROVIDER and kind in STRIKING:
        bad("kind", f"a {kind!r} signature locks a provider: it must name one, not \"*\"")
    fields: dict[str, Any] = {}
    status = data.get("status")
    if status is not None:
        if not isinstance(status, (list, tuple)) or not status or not all(
                isinstance(s, int) and not isinstance(s, bool) and 400 <= s <= 599 for s in status):
            bad("status", "must be a non-empty list of HTTP statuses 400-599 (a capacity answer is a failure)")
        else:
            fields["status"] = tuple(status)
    contains = data.get("body_contains")
    if contains is not None:
        if not isinstance(contains, str) or not contains.strip():
            bad("body_contains", "must be a non-empty string (matched case-insensitively)")
        else:
            fields["body_contains"] = contains.lower()
    body_json = data.get("body_json")
    if body_json is not None:
        if not isinstance(body_json, Mapping) or "path" not in body_json or \
                len(set(body_json) & {"equals", "pattern"}) != 1 or set(body_json) - {"path", "equals", "pattern"}:
            bad("body_json", "must be {\"path\": \"error.code\", \"equals\": value} or {\"path\", \"pattern\": regex}")
        elif not isinstance(body_json["path"], str) or not _JSON_PATH.fullmatch(body_json["path"]):
            bad("body_json.path", f"{body_json['path']!r} must be a dotted path into the JSON answer")
        else:
            fields["body_json_path"] = body_json["path"]
            if "equals" in body_json:
                fields["body_json_equals"] = body_json["equals"]
            else:
                try:
                    fields["body_json_pattern"] = re.compile(str(body_json["pattern"]))
                except re.error as exc:
                    bad("body_json.pattern", f"is not a regular expression: {exc}")
    header = data.get("header")
    if header is not None:
        if not isinstance(header, Mapping) or "name" not in header or set(header) - {"name", "equals"}:
            bad("header", "must be {\"name\": header, \"equals\": value} (no equals: the header's presence)")
        elif not isinstance(header["name"], str) or not http_grammar.TOKEN.match(header["name"]):
            bad("header.name", f"{header['name']!r} is not an HTTP header name")
        elif "equals" in header and not isinstance(header["equals"], str):
            bad("header.equals", "must be a string")
        else:
            fields["header_name"] = header["name"].lower()
            fields["header_equals"] = header.get("equals")
    retry_max = data.get("retry_after_max_s")
    if retry_max is not None:
        if not _is_number(retry_max) or retry_max < 0:
            bad("retry_after_max_s", "must be a number of seconds ≥ 0 (the Retry-After must be present and at most it)")
        else:
            fields["retry_after_max_s"] = float(retry_max)
    resets = data.get("resets_at")
    if resets is not None:
        if not isinstance(resets, Mapping) or set(resets) - {"header", "body_json", "format"} or \
                len(set(resets) & {"header", "body_json"}) != 1:
            bad("resets_at", "must be {\"header\": name, \"format\": F} or {\"body_json\": path, \"format\": F}")
        elif resets.get("format") not in RESET_FORMATS:
            bad("resets_at.format", f"{resets.get('format')!r} is not one of {', '.join(RESET_FORMATS)}")
        elif "header" in resets and (not isinstance(resets["header"], str)
                                     or not http_grammar.TOKEN.match(resets["header"])):
            bad("resets_at.header", f"{resets['header']!r} is not an HTTP header name")
        elif "body_json" in resets and (not isinstance(resets["body_json"], str)
                                        or not _JSON_PATH.fullmatch(resets["body_json"])):
            bad("resets_at.body_json", f"{resets['body_json']!r} must be a dotted path into the JSON answer")
        else:
            fields["resets_header"] = resets["header"].lower() if "header" in resets else None
            fields["resets_json_path"] = resets.get("body_json")
            fields["resets_format"] = resets["format"]
        if kind not in STRIKING and resets is not None:
            bad("resets_at", f"only a balance or quota signature states a reset (a lock's end), not {kind!r}")
    if not (set(fields) & {"status", "body_contains", "body_json_path", "header_name"}):
        bad("", "a signature needs at least one of status, body_contains, body_json, header: it would claim "
            "every answer")
    if len(problems) > before:
        return None
    return Signature(provider=provider, kind=kind, plugin=plugin, index=index, trylast=trylast, **fields)


def build_signatures(declared: Iterable[tuple[str, Any, bool]], catalog: CatalogRegistry) -> SignatureRegistry:
    """``(plugin, hook result, trylast)`` triples → the registry, or :class:`CatalogError` listing every
    problem."""
    problems: list[Problem] = []
    first: list[Signature] = []
    last: list[Signature] = []
    for plugin, result, trylast in declared:
        if result is None:
            continue
        if isinstance(result, Mapping) or not isinstance(result, (list, tuple)):
            problems.append(Problem(plugin, HOOK, "", "must return a list of signature dicts (or None), not "
                                    f"{type(result).__name__}"))
            continue
        for i, data in enumerate(result):
            sig = _row(plugin, i, data, catalog.providers, trylast, problems)
            if sig is not None:
                (last if trylast else first).append(sig)
    if problems:
        raise CatalogError(problems)
    return SignatureRegistry(tuple(first + last))


def load_signatures(pm: PluginHost, catalog: CatalogRegistry) -> SignatureRegistry:
    """Every plugin's signatures, validated against ``catalog`` (startup; raises :class:`CatalogError`)."""
    try:
        results = call_hook(pm, HOOK)
    except PluginFailed as exc:
        raise CatalogError([Problem(exc.plugin, HOOK, "", f"the hook raised {exc.__cause__!r}")]) from exc
    declared = sorted(((r.plugin, r.value, r.trylast) for r in results), key=lambda item: item[0])
    return build_signatures(declared, catalog)
