"""Request checks for a catalog call (pure: bytes and pairs in, a frozen result or ``InvalidParameters`` out).

Two stages, matching the seed's order:

* :func:`check_request`, on every tier, before credential selection: the method, the path slots (read
  from the query, encoded by :mod:`treg.catalog.placeholders`), declared query parameters (required,
  enum, type), and the opt-in strict modes: ``strict_query`` (no body, no undeclared or repeated query
  parameter) and ``body_allowlist`` (a JSON object body with only declared top-level fields, each valid).
  An endpoint without the strict flags keeps its undeclared parameters and its body untouched.
* :func:`check_platform`, on the platform tier only (treg's own account pays): declared body parameters
  are enforced even without ``body_allowlist``, so a single-valued enum (a pricing discriminator such
  as a pinned ``model``) must equal its one value; a table price's field must be present and one of
  the listed values. The body is parsed strictly: duplicate keys are refused, so treg's reading and the
  provider's can never disagree about which ``model`` was asked for. Then the row's request guards
  (:mod:`treg.catalog.guards`, called by the ladder right after): integer ranges and defaults.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Mapping, Sequence
from urllib.parse import unquote_plus

from treg import json_text
from treg.catalog.errors import InvalidParameters, MethodNotAllowed
from treg.catalog.load import matches_json, matches_text
from treg.catalog.model import Endpoint, Param
from treg.catalog.placeholders import decode_query_value, encode_segment
from treg.catalog.success import json_equal

QueryPairs = Sequence[tuple[str, "str | None"]]


@dataclass(frozen=True)
class CheckedRequest:
    """What :func:`check_request` accepted."""

    #: slot name → encoded path segment (ready for :func:`treg.catalog.placeholders.fill_path`)
    path_values: Mapping[str, str]
    #: the caller's raw query pairs (encoding, order, duplicates kept) minus the path slots' pairs
    query: tuple[tuple[str, str | None], ...]
    #: the parsed JSON object body when a check read it (body_allowlist), else None
    json_body: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class PlatformCheck:
    """What :func:`check_platform` accepted: the table row chosen (table prices) and the parsed body."""

    table_value: str | None
    json_body: Mapping[str, Any] | None


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_json_object(body: bytes | None, endpoint: Endpoint) -> dict[str, Any]:
    """The body as a JSON object, parsed strictly (duplicate keys and NaN refused); empty: ``{}``."""
    if body is None or not body.strip():
        return {}
    try:
        data = json_text.parse(body, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except _DuplicateKey as exc:
        raise InvalidParameters(f"the JSON body repeats the key {exc.args[0]!r}; {endpoint.id} needs each field "
                                "once", parameter=exc.args[0]) from exc
    except ValueError as exc:  # not JSON, not text, or nested too deeply (treg/json_text.py)
        raise InvalidParameters(f"{endpoint.id} needs a JSON object body; this one does not parse: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidParameters(f"{endpoint.id} needs a JSON object body, not a JSON {type(data).__name__}")
    return data


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _in_enum(value: Any, enum: Sequence[Any]) -> bool:
    return any(json_equal(value, e) for e in enum)


def _listing(values: Sequence[Any]) -> str:
    return ", ".join(json.dumps(v) for v in values)


def _check_text(endpoint: Endpoint, p: Param, value: str) -> None:
    if p.enum is not None and value not in p.enum:
        raise InvalidParameters(f"{p.location} parameter {p.name!r} of {endpoint.id} is {value!r}; it must be one "
                                f"of {_listing(p.enum)}", parameter=p.name)
    if not matches_text(value, p.type):
        raise InvalidParameters(f"{p.location} parameter {p.name!r} of {endpoint.id} must be a {p.type}, "
                                f"not {value!r}", parameter=p.name)


def check_request(endpoint: Endpoint, *, method: str, query: QueryPairs, body: bytes | None = None,
                  surface: str = "/catalog/call") -> CheckedRequest:
    """Every-tier checks. ``query``: the caller's raw pairs (still percent-encoded; value None for a bare
    ``?flag``). ``body``: the whole request body when the endpoint ``needs_body`` (or strict_query must
    see whether there is one); None when it was not read."""
    if method.upper() != endpoint.method:
        raise MethodNotAllowed(f"{endpoint.id} is a {endpoint.method} endpoint, not {method.upper()}",
                               refused_by="catalog", headers={"Allow": endpoint.method})
    named: list[tuple[str, str, str | None]] = [(unquote_plus(k), k, v) for k, v in query]
    slots = set(endpoint.slots)

    path_values: dict[str, str] = {}
    for slot in endpoint.slots:
        given = [v for name, _, v in named if name == slot]
        if not given:
            raise InvalidParameters(f"path parameter {slot!r} of {endpoint.id} is missing: pass it in the query, "
                                    f"{endpoint.query_form(surface)}", parameter=slot)
        if len(given) > 1:
            raise InvalidParameters(f"path parameter {slot!r} of {endpoint.id} is given {len(given)} times; "
                                    "it fills one path slot", parameter=slot)
        raw = decode_query_value(given[0])
        if not raw:
            raise InvalidParameters(f"path parameter {slot!r} of {endpoint.id} is empty", parameter=slot)
        p = endpoint.param(slot, "path")
        assert p is not None  # load guarantees a declared param per slot
        _check_text(endpoint, p, _text(raw))
        path_values[slot] = encode_segment(raw)

    declared = {p.name for p in endpoint.params if p.location in ("path", "query")}
    if endpoint.strict_query:
        if body:
            raise InvalidParameters(f"{endpoint.id} takes no request body (strict query); send the parameters "
                                    "in the query string")
        seen: set[str] = set()
        for name, _, _ in named:
            if name not in declared:
                raise InvalidParameters(f"{endpoint.id} does not take the query parameter {name!r}; it takes "
                                        f"{', '.join(sorted(declared)) or 'none'}", parameter=name)
            if name in seen:
                raise InvalidParameters(f"query parameter {name!r} of {endpoint.id} is given more than once",
                                        parameter=name)
            seen.add(name)

    for p in endpoint.params_in("query"):
        values = [_text(decode_query_value(v)) for name, _, v in named if name == p.name]
        if not values and p.required:
            raise InvalidParameters(f"query parameter {p.name!r} of {endpoint.id} is required", parameter=p.name)
        for value in values:
            _check_text(endpoint, p, value)

    json_body = None
    if endpoint.body_allowlist:
        json_body = parse_json_object(body, endpoint)
        check_body(endpoint, json_body, allow_undeclared=False)

    remaining = tuple((k, v) for (name, k, v) in named if name not in slots)
    return CheckedRequest(path_values=MappingProxyType(path_values), query=remaining,
                          json_body=MappingProxyType(json_body) if json_body is not None else None)


def check_body(endpoint: Endpoint, body: Mapping[str, Any], *, allow_undeclared: bool) -> None:
    """Declared top-level body fields: required, type, enum, array cardinality and items. A present
    ``null`` counts as absent. ``allow_undeclared`` False: any other field is refused (body_allowlist)."""
    params = {p.name: p for p in endpoint.params_in("body")}
    if not allow_undeclared:
        for key in body:
            if key not in params:
                raise InvalidParameters(f"{endpoint.id} does not take the body field {key!r}; it takes "
                                        f"{', '.join(sorted(params)) or 'none'}", parameter=key)
    for p in params.values():
        value = body.get(p.name)
        if value is None:
            if p.required:
                need = f" (it must be {json.dumps(p.singleton)})" if p.singleton is not None else ""
                raise InvalidParameters(f"body field {p.name!r} of {endpoint.id} is required{need}",
                                        parameter=p.name)
            continue
        if not matches_json(value, p.type):
            raise InvalidParameters(f"body field {p.name!r} of {endpoint.id} must be a JSON {p.type}",
                                    parameter=p.name)
        if p.enum is not None and not _in_enum(value, p.enum):
            raise InvalidParameters(f"body field {p.name!r} of {endpoint.id} is {json.dumps(value)}; it must be "
                                    f"one of {_listing(p.enum)}", parameter=p.name)
        if isinstance(value, list):
            if p.min_items is not None and len(value) < p.min_items:
                raise InvalidParameters(f"body field {p.name!r} of {endpoint.id} needs at least {p.min_items} "
                                        f"item(s), not {len(value)}", parameter=p.name)
            if p.max_items is not None and len(value) > p.max_items:
                raise InvalidParameters(f"body field {p.name!r} of {endpoint.id} takes at most {p.max_items} "
                                        f"item(s), not {len(value)}", parameter=p.name)
            if p.item_enum is not None:
                for item in value:
                    if not _in_enum(item, p.item_enum):
                        raise InvalidParameters(f"body field {p.name!r} of {endpoint.id} holds {json.dumps(item)}; "
                                                f"its items must be among {_listing(p.item_enum)}", parameter=p.name)


def check_platform(endpoint: Endpoint, checked: CheckedRequest, body: bytes | None) -> PlatformCheck:
    """Tier-4-only checks (treg's own key pays); see the module docstring."""
    needs = (endpoint.price.kind == "table" or bool(endpoint.params_in("body"))
             or any(g.location == "body" for g in endpoint.guards))  # a body guard reads the object too
    if not needs:
        return PlatformCheck(table_value=None, json_body=checked.json_body)
    obj = dict(checked.json_body) if checked.json_body is not None else parse_json_object(body, endpoint)
    check_body(endpoint, obj, allow_undeclared=True)
    table_value = None
    if endpoint.price.kind == "table":
        field = endpoint.price.table_field
        assert field is not None
        value = obj.get(field)
        if endpoint.price.table_price(value) is None:
            listed = [k for k, _ in endpoint.price.table_prices]
            got = "missing" if value is None else json.dumps(value)
            raise InvalidParameters(f"body field {field!r} of {endpoint.id} chooses its price and is {got}; on treg's "
                                    f"key it must be one of {_listing(listed)}", parameter=field)
        table_value = value
    return PlatformCheck(table_value=table_value, json_body=MappingProxyType(obj))
