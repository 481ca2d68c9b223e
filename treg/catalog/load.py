"""Provider dicts → frozen catalog types, validating the whole catalog at startup.

Every problem names the plugin that declared the row, the row (provider or endpoint id) and the field,
and all problems are collected before :class:`~treg.catalog.errors.CatalogError` is raised, so a plugin
author sees every mistake at once (``treg catalog`` prints them). A catalog with any problem is never
half-loaded: treg refuses to start.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import math
import re
from decimal import Decimal, InvalidOperation
from typing import Any, Iterable, Mapping, Sequence
from urllib.parse import urlsplit

from treg import http_grammar
from treg.bindings import Binding, Injector, format_fields
from treg.catalog import guards as guard_rows, managed as managed_rows, success as success_rules
from treg.catalog.descriptors import is_int
from treg.catalog.errors import CatalogError, Problem
from treg.catalog.model import SLOT, Endpoint, Param, Price, Provider, RateLimit, UsageTerm
from treg.catalog.registry import CatalogRegistry
from treg.catalog import archive_policy
from treg.catalog.async_jobs import link_utilities, parse_submission
from treg.catalog.routed import with_routed
from treg.catalog.oauth import parse_block as parse_oauth_block
from treg.catalog.table import check_row as check_table
from treg.overflow.aggregator import OverflowRoute, collect_aggregators
from treg.plugins import PluginFailed, PluginHost, call_hook

log = logging.getLogger("treg.catalog")

PROVIDER_ID = re.compile(r"\A[a-z0-9][a-z0-9-]{0,62}\Z")
_OPERATION = r"[A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*"
_CAPABILITY = re.compile(r"\A[a-z0-9][a-z0-9_.-]{0,99}\Z")
_HEADER_TOKEN = http_grammar.TOKEN
_CTL = http_grammar.CTL
# what may appear literally in a path template outside its {slots}: already-encoded path characters
_PATH_CHARS = re.compile(r"\A[A-Za-z0-9\-._~!$&'()*+,;=:@/%]*\Z")
_QUERY_CHARS = re.compile(r"\A[A-Za-z0-9\-._~!$&'()*+,;=:@/%?]*\Z")
_PCT = re.compile(r"%(?![0-9A-Fa-f]{2})")

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
_BODYLESS = ("GET", "HEAD")
_SCALAR_TYPES = ("string", "integer", "number", "boolean")
_BODY_TYPES = _SCALAR_TYPES + ("array", "object")
_HOP_BY_HOP = http_grammar.PER_HOP
#: the largest price a row may declare (USD 1,000,000 per call): a bigger number is a unit mistake
MAX_MICRO = 10 ** 12

PROVIDER_KEYS = frozenset({"id", "name", "description", "docs_url", "base_url", "auth", "required_headers",
                           "catalog_hosts", "rate_limit", "endpoints", "oauth"})
ENDPOINT_KEYS = frozenset({"id", "method", "path", "params", "price", "capability", "status", "status_note",
                           "superseded_by", "platform_auth", "strict_query", "body_allowlist",
                           "spooled_response", "platform_blocked", "host", "description", "docs_url",
                           "overflow", "managed_resource", "archive", "async", "success", "guards", "table"})
PARAM_KEYS = frozenset({"name", "in", "required", "enum", "type", "min_items", "max_items", "item_enum",
                        "description"})
AUTH_KEYS = frozenset({"location", "name", "format", "secret_field"})


class _Collector:
    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def add(self, plugin: str, row: str, field: str, message: str) -> None:
        self.problems.append(Problem(plugin, row, field, message))


def _is_number(v: Any) -> bool:
    return (is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _loopback(hostname: str) -> bool:
    if hostname.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(hostname).is_loopback
    except ValueError:
        return False


def check_root_url(raw: Any) -> str | None:
    """Why ``raw`` cannot be a provider base URL or catalog host (None: it can).

    HTTPS only: an injected credential must never cross the network in clear. Plain http is accepted for
    loopback hosts alone (local development and tests; the SSRF guard still applies at call time).
    """
    if not isinstance(raw, str) or not raw:
        return "must be an https:// URL string"
    if _CTL.search(raw) or " " in raw:
        return "contains whitespace or control characters"
    try:
        parts = urlsplit(raw)
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError as exc:
        return f"is not a valid URL: {exc}"
    if not parts.hostname:
        return "has no host"
    if parts.scheme == "http" and not _loopback(parts.hostname):
        return "must use https:// (plain http only for a loopback host in development)"
    if parts.scheme not in ("http", "https"):
        return "must use https://"
    if parts.username is not None or parts.password is not None:
        return "cannot carry user-info (credentials belong in auth)"
    if parts.query or parts.fragment or raw.endswith(("?", "#")):
        return "cannot carry a query or fragment"
    if _PCT.search(parts.path) or not _PATH_CHARS.fullmatch(parts.path):
        return "has characters in its path that are not valid in a URL"
    return None


class _Loader:
    def __init__(self, injectors: Mapping[str, Injector], aggregators: Mapping[str, Any] | None = None, *,
                 oauth_http: bool = False) -> None:
        self.injectors = injectors
        self.aggregators = aggregators or {}
        #: an ``oauth`` block's URLs may be plain http (TREG_SSRF_ALLOW is set: local development, tests)
        self.oauth_http = oauth_http
        self.c = _Collector()
        self.providers: dict[str, Provider] = {}
        self.endpoints: dict[str, Endpoint] = {}
        self.provider_plugin: dict[str, str] = {}

    # -- providers -------------------------------------------------------------------------------
    def provider(self, plugin: str, index: int, data: Any) -> None:
        add = self.c.add
        if not isinstance(data, Mapping):
            add(plugin, f"provider #{index}", "", f"a provider must be a dict, not {type(data).__name__}")
            return
        pid = data.get("id")
        if not isinstance(pid, str) or not PROVIDER_ID.fullmatch(pid):
            add(plugin, f"provider #{index}", "id",
                f"{pid!r} is not a provider id: 1-63 characters of a-z, 0-9 and '-', starting with a letter or digit")
            return
        row = f"provider {pid!r}"
        if pid in self.provider_plugin:
            add(plugin, row, "id", f"provider {pid!r} is already declared by plugin {self.provider_plugin[pid]!r}")
            return
        self.provider_plugin[pid] = plugin
        for key in sorted(set(data) - PROVIDER_KEYS):
            add(plugin, row, key, f"unknown provider field; known: {sorted(PROVIDER_KEYS)}")
        for key in ("name", "description", "docs_url"):
            if data.get(key) is not None and not isinstance(data[key], str):
                add(plugin, row, key, "must be a string")

        base_url = data.get("base_url")
        why = check_root_url(base_url)
        if why:
            add(plugin, row, "base_url", f"{base_url!r} {why}")

        auth = self._auth(plugin, row, data.get("auth", []))
        headers = self._required_headers(plugin, row, data.get("required_headers") or {})
        auth_headers = {b.name.lower() for b in auth if b.location == "header"}
        for name, _ in headers:
            if name.lower() in auth_headers:
                add(plugin, row, f"required_headers.{name}", "is also set by auth; a header has one source")

        hosts: list[str] = []
        raw_hosts = data.get("catalog_hosts") or []
        if not isinstance(raw_hosts, (list, tuple)):
            add(plugin, row, "catalog_hosts", "must be a list of https:// base URLs")
            raw_hosts = []
        for i, host in enumerate(raw_hosts):
            why = check_root_url(host)
            if why:
                add(plugin, row, f"catalog_hosts[{i}]", f"{host!r} {why}")
            elif host in hosts or host == base_url:
                add(plugin, row, f"catalog_hosts[{i}]", f"{host!r} is listed twice (or is the base_url)")
            else:
                hosts.append(host)

        rate = None
        raw_rate = data.get("rate_limit")
        if raw_rate is not None:
            if not isinstance(raw_rate, Mapping) or set(raw_rate) != {"limit", "window_s"}:
                add(plugin, row, "rate_limit", "must be {\"limit\": calls, \"window_s\": seconds}")
            elif not is_int(raw_rate["limit"]) or raw_rate["limit"] < 1:
                add(plugin, row, "rate_limit.limit", "must be a whole number of calls ≥ 1")
            elif not _is_number(raw_rate["window_s"]) or raw_rate["window_s"] <= 0:
                add(plugin, row, "rate_limit.window_s", "must be a number of seconds > 0")
            else:
                rate = RateLimit(raw_rate["limit"], float(raw_rate["window_s"]))

        oauth = None
        if data.get("oauth") is not None:  # docs/oauth.md: validated like every row, no name resolved
            oauth = parse_oauth_block(lambda f, m: add(plugin, row, f, m), data["oauth"],
                                      allow_http=self.oauth_http, has_auth=bool(auth))
        provider = Provider(id=pid, base_url=base_url if isinstance(base_url, str) else "", auth=tuple(auth),
                            required_headers=tuple(headers), catalog_hosts=tuple(hosts), rate_limit=rate,
                            name=data.get("name"), description=data.get("description"),
                            docs_url=data.get("docs_url"), plugin=plugin, oauth=oauth)
        raw_eps = data.get("endpoints")
        if not isinstance(raw_eps, (list, tuple)) or not raw_eps:
            add(plugin, row, "endpoints", "must be a non-empty list of endpoint dicts")
            raw_eps = []
        ids: list[str] = []
        for i, ep in enumerate(raw_eps):
            built = self.endpoint(plugin, provider, i, ep)
            if built is not None:
                ids.append(built.id)
        self.providers[pid] = dataclasses.replace(provider, endpoint_ids=tuple(ids))

    def _auth(self, plugin: str, row: str, raw: Any) -> list[Binding]:
        add = self.c.add
        if not isinstance(raw, (list, tuple)):
            add(plugin, row, "auth", "must be a list of bindings ({location, name, format?})")
            return []
        out: list[Binding] = []
        targets: set[tuple[str, str]] = set()
        for i, item in enumerate(raw):
            where = f"auth[{i}]"
            if not isinstance(item, Mapping):
                add(plugin, row, where, "must be a binding dict")
                continue
            unknown = set(item) - AUTH_KEYS
            if unknown:
                add(plugin, row, where, f"unknown binding keys {sorted(unknown)}; a provider binding has "
                    f"{sorted(AUTH_KEYS)} (treg supplies the secret itself)")
                continue
            location, name = item.get("location"), item.get("name")
            fmt = item.get("format", "{secret}")
            if not isinstance(location, str) or not location:
                add(plugin, row, f"{where}.location", "is required (header, query, json, …)")
                continue
            if not isinstance(name, str) or not name.strip():
                add(plugin, row, f"{where}.name", "must be a non-empty string")
                continue
            if not isinstance(fmt, str):
                add(plugin, row, f"{where}.format", "must be a string")
                continue
            if item.get("secret_field") is not None and (not isinstance(item["secret_field"], str)
                                                         or not item["secret_field"].strip()):
                add(plugin, row, f"{where}.secret_field", "must be a non-empty string when given")
                continue
            try:
                fields = format_fields(fmt)
            except ValueError as exc:
                add(plugin, row, f"{where}.format", f"is malformed: {exc}")
                continue
            if any(f != "secret" for f in fields):
                add(plugin, row, f"{where}.format", "may use only the {secret} placeholder")
                continue
            injector = self.injectors.get(location)
            if injector is None:
                add(plugin, row, f"{where}.location", f"{location!r} has no injector; known: {sorted(self.injectors)}")
                continue
            binding = Binding(location=location, name=name, format=fmt, secret_field=item.get("secret_field"))
            try:
                injector.validate(binding)
            except ValueError as exc:
                add(plugin, row, where, str(exc))
                continue
            target = (location, name.lower() if location == "header" else name)
            if target in targets:
                add(plugin, row, where, f"targets {location} {name!r}, which another auth binding already sets")
                continue
            targets.add(target)
            out.append(binding)
        return out

    def _required_headers(self, plugin: str, row: str, raw: Any) -> list[tuple[str, str]]:
        add = self.c.add
        if not isinstance(raw, Mapping):
            add(plugin, row, "required_headers", "must be a dict of header name → constant value")
            return []
        out = []
        seen: set[str] = set()
        for name, value in raw.items():
            field = f"required_headers.{name}"
            if not isinstance(name, str) or not _HEADER_TOKEN.match(name):
                add(plugin, row, field, "is not a valid HTTP header name")
            elif name.lower().startswith("x-treg-"):
                add(plugin, row, field, "X-Treg-* headers are treg's own and never relayed")
            elif name.lower() in _HOP_BY_HOP:
                add(plugin, row, field, "is a transport header treg derives per hop")
            elif name.lower() in seen:
                add(plugin, row, field, "is listed twice (header names are case-insensitive)")
            elif not isinstance(value, str) or _CTL.search(value):
                add(plugin, row, field, "must be a string without control characters")
            else:
                seen.add(name.lower())
                out.append((name, value))
        return out

    # -- endpoints -------------------------------------------------------------------------------
    def endpoint(self, plugin: str, provider: Provider, index: int, data: Any) -> Endpoint | None:
        add = self.c.add
        prow = f"provider {provider.id!r}"
        if not isinstance(data, Mapping):
            add(plugin, f"{prow} endpoints[{index}]", "", f"an endpoint must be a dict, not {type(data).__name__}")
            return None
        eid = data.get("id")
        if not isinstance(eid, str) or not re.fullmatch(re.escape(provider.id) + r"\." + _OPERATION, eid) \
                or len(eid) > 200:
            add(plugin, f"{prow} endpoints[{index}]", "id",
                f"{eid!r} must be '{provider.id}.<operation>' (operation: letters, digits, '_', '-', dotted parts)")
            return None
        row = f"endpoint {eid!r}"
        if eid in self.endpoints:
            add(plugin, row, "id", "is declared twice")
            return None
        before = len(self.c.problems)
        for key in sorted(set(data) - ENDPOINT_KEYS):
            add(plugin, row, key, f"unknown endpoint field; known: {sorted(ENDPOINT_KEYS)}")
        for key in ("status_note", "description", "docs_url", "superseded_by"):
            if data.get(key) is not None and not isinstance(data[key], str):
                add(plugin, row, key, "must be a string or null")
        flags = {}
        for key in ("strict_query", "body_allowlist", "spooled_response", "platform_blocked"):
            value = data.get(key, False)
            if not isinstance(value, bool):
                add(plugin, row, key, "must be true or false")
            flags[key] = value is True

        method = data.get("method")
        if not isinstance(method, str) or method.upper() not in METHODS:
            add(plugin, row, "method", f"{method!r} is not one of {', '.join(METHODS)}")
            method = "GET"
        method = method.upper()

        path = data.get("path")
        slots = self._path(plugin, row, path)
        params = self._params(plugin, row, data.get("params", []), method)
        path_params = {p.name for p in params if p.location == "path"}
        if slots is not None:
            for slot in slots:
                if slot not in path_params:
                    add(plugin, row, "path", f"slot {{{slot}}} has no parameter declared with \"in\": \"path\"")
            for name in sorted(path_params - set(slots)):
                add(plugin, row, f"params.{name}", f"is declared \"in\": \"path\" but the path has no {{{name}}} slot")

        price = self._price(plugin, row, data.get("price"), method, params)

        status = data.get("status", "live")
        if status not in ("live", "retired", "broken"):
            add(plugin, row, "status", f"{status!r} is not one of live, retired, broken")
        capability = data.get("capability")
        if capability is not None and (not isinstance(capability, str) or not _CAPABILITY.fullmatch(capability)):
            add(plugin, row, "capability", "must be a lower-case dotted name such as 'weather.forecast'")
        superseded_by = data.get("superseded_by")
        if superseded_by is not None and status == "live":
            add(plugin, row, "superseded_by", "only a retired or broken endpoint names a successor")
        platform_auth = data.get("platform_auth")
        if platform_auth not in (None, "anonymous"):
            add(plugin, row, "platform_auth", f"{platform_auth!r} must be null or \"anonymous\"")
        elif platform_auth == "anonymous":
            if method != "GET":
                add(plugin, row, "platform_auth", "\"anonymous\" is only for a GET")
            if price is not None and not (price.kind == "per_call" and price.per_call_micro == 0):
                add(plugin, row, "platform_auth", "\"anonymous\" is only for a free endpoint (per_call_micro 0)")
        if flags["strict_query"] and any(p.location == "body" for p in params):
            add(plugin, row, "strict_query", "a strict_query endpoint takes no body, but body params are declared")
        if flags["body_allowlist"] and method in _BODYLESS:
            add(plugin, row, "body_allowlist", f"a {method} has no body to allow-list")
        if flags["body_allowlist"] and flags["strict_query"]:
            add(plugin, row, "body_allowlist", "strict_query already refuses every body")
        host = data.get("host")
        if host is not None and host not in provider.catalog_hosts:
            add(plugin, row, "host", f"{host!r} is not one of the provider's approved catalog_hosts "
                f"{list(provider.catalog_hosts)}")

        overflow = self._overflow(plugin, row, data.get("overflow"), method)
        managed = managed_rows.check_descriptor(add, plugin, row, data.get("managed_resource"), params=params,
                                                spooled=flags["spooled_response"])
        archive = archive_policy.check_row(data.get("archive"), method, price, flags["spooled_response"],
                                           lambda field, message: add(plugin, row, field, message))
        async_job = parse_submission(add, plugin, row, data.get("async"), spooled=flags["spooled_response"])
        if archive is not None and (async_job is not None or managed is not None):
            # a stored answer replayed to another caller would skip the job's or the object's bookkeeping
            add(plugin, row, "archive", "an async submission or a managed_resource row is never archived")

        report = lambda field, message: add(plugin, row, field, message)  # noqa: E731
        success = success_rules.parse(data.get("success"), report)
        guards = guard_rows.parse(data.get("guards"), report, method=method, params=params, slots=slots or (),
                                  strict_query=flags["strict_query"], body_allowlist=flags["body_allowlist"])
        if guards and flags["platform_blocked"]:
            add(plugin, row, "guards", "the endpoint is never offered on treg's key (platform_blocked): "
                "nothing would be guarded")
        table = check_table(data.get("table"), report)
        if table is not None and flags["spooled_response"]:
            # /table/ reads the whole answer into memory to make its rows; a spooled one is too large for it
            add(plugin, row, "table", "a spooled_response row's answer is never read whole: it has no table")

        if len(self.c.problems) > before or price is None:
            return None
        ep = Endpoint(id=eid, provider=provider.id, method=method, path=path, params=tuple(params), price=price,
                      capability=capability, status=status, status_note=data.get("status_note"),
                      superseded_by=superseded_by, platform_auth=platform_auth, host=host,
                      description=data.get("description"), docs_url=data.get("docs_url"), plugin=plugin,
                      overflow=overflow, managed_resource=managed, archive=archive, async_job=async_job,
                      success=success, guards=guards, table=table, **flags)
        self.endpoints[eid] = ep
        return ep

    def _overflow(self, plugin: str, row: str, raw: Any, method: str) -> tuple[OverflowRoute, ...]:
        """The row's routes to aggregators: each names a registered aggregator and its price; the
        aggregator checks its own fields (docs/resilience.md)."""
        add = self.c.add
        if raw is None:
            return ()
        if not isinstance(raw, (list, tuple)) or not raw:
            add(plugin, row, "overflow", "must be a non-empty list of routes {aggregator, price_micro, …}")
            return ()
        if method in ("PUT", "PATCH", "DELETE"):
            add(plugin, row, "overflow", f"a {method} never overflows (it may not be repeated elsewhere)")
            return ()
        out = []
        for i, item in enumerate(raw):
            where = f"overflow[{i}]"
            if not isinstance(item, Mapping):
                add(plugin, row, where, "must be a dict {aggregator, price_micro, …}")
                continue
            name = item.get("aggregator")
            agg = self.aggregators.get(name) if isinstance(name, str) else None
            if agg is None:
                add(plugin, row, f"{where}.aggregator", f"{name!r} is not a registered aggregator; known: "
                    f"{sorted(self.aggregators)}")
                continue
            if any(r.aggregator == name for r in out):
                add(plugin, row, f"{where}.aggregator", f"{name!r} is listed twice (one call tries one aggregator once)")
                continue
            price = item.get("price_micro")
            if not is_int(price) or not 0 <= price <= MAX_MICRO:
                add(plugin, row, f"{where}.price_micro", f"{price!r} must be a whole number of micro-USD, 0 to {MAX_MICRO}")
                continue
            fields = {k: v for k, v in item.items() if k not in ("aggregator", "price_micro")}
            try:
                problems = agg.check_route(fields)
            except Exception as exc:  # a plugin bug must name the row, not crash startup anonymously
                problems = [("", f"aggregator {name!r} failed to check the route: {exc!r}")]
            for field, message in problems:
                add(plugin, row, f"{where}.{field}" if field else where, message)
            if not problems:
                out.append(OverflowRoute(aggregator=name, price_micro=price, fields=tuple(sorted(fields.items()))))
        return tuple(out)

    def _path(self, plugin: str, row: str, path: Any) -> list[str] | None:
        add = self.c.add
        if not isinstance(path, str) or (path and not path.startswith("/")):
            add(plugin, row, "path", "must be a string starting with '/' (or \"\" for the base URL itself)")
            return None
        template, _, query = path.partition("?")
        literal = SLOT.sub("", template)
        if "{" in literal or "}" in literal:
            add(plugin, row, "path", "has a '{' or '}' that is not a {param} slot")
            return None
        if not _PATH_CHARS.fullmatch(literal) or _PCT.search(literal):
            add(plugin, row, "path", "has characters that are not valid in a URL path (encode them as %HH)")
            return None
        if any(seg in (".", "..") for seg in template.split("/")):
            add(plugin, row, "path", "cannot contain '.' or '..' segments")
            return None
        if "?" in path and (SLOT.search(query) or not _QUERY_CHARS.fullmatch(query) or _PCT.search(query)
                            or "{" in query):
            add(plugin, row, "path", "its fixed query part may not hold slots or characters invalid in a URL")
            return None
        slots = SLOT.findall(template)
        if len(slots) != len(set(slots)):
            add(plugin, row, "path", "names one slot twice")
            return None
        return slots

    def _params(self, plugin: str, row: str, raw: Any, method: str) -> list[Param]:
        add = self.c.add
        if not isinstance(raw, (list, tuple)):
            add(plugin, row, "params", "must be a list of parameter dicts")
            return []
        out: list[Param] = []
        names: dict[str, str] = {}
        for i, item in enumerate(raw):
            where = f"params[{i}]"
            if not isinstance(item, Mapping):
                add(plugin, row, where, "must be a dict")
                continue
            name, loc = item.get("name"), item.get("in")
            if not isinstance(name, str) or not name or _CTL.search(name):
                add(plugin, row, f"{where}.name", "must be a non-empty string")
                continue
            where = f"params.{name}"
            for key in sorted(set(item) - PARAM_KEYS):
                add(plugin, row, f"{where}.{key}", f"unknown parameter field; known: {sorted(PARAM_KEYS)}")
            if loc not in ("path", "query", "body"):
                add(plugin, row, f"{where}.in", f"{loc!r} must be path, query or body")
                continue
            if name in names:
                # path values arrive in the query, so a name is one parameter whatever its location
                add(plugin, row, where, f"is declared twice ({names[name]} and {loc})")
                continue
            names[name] = loc
            if loc == "body" and method in _BODYLESS:
                add(plugin, row, where, f"a {method} has no body; declare it \"in\": \"query\"")
                continue
            required = item.get("required", loc == "path")
            if not isinstance(required, bool):
                add(plugin, row, f"{where}.required", "must be true or false")
                continue
            if loc == "path" and not required:
                add(plugin, row, f"{where}.required", "a path parameter is always required")
                continue
            ptype = item.get("type")
            allowed_types = _BODY_TYPES if loc == "body" else _SCALAR_TYPES
            array_keys = [k for k in ("min_items", "max_items", "item_enum") if k in item]
            if array_keys and loc == "body" and ptype is None:
                ptype = "array"
            if ptype is not None and ptype not in allowed_types:
                add(plugin, row, f"{where}.type", f"{ptype!r} must be one of {', '.join(allowed_types)}")
                continue
            if array_keys and (loc != "body" or ptype != "array"):
                add(plugin, row, f"{where}.{array_keys[0]}", "only a body parameter of type array has items")
                continue
            enum = self._enum(plugin, row, f"{where}.enum", item.get("enum"), loc, ptype)
            item_enum = self._enum(plugin, row, f"{where}.item_enum", item.get("item_enum"), "body", None)
            if enum is False or item_enum is False:
                continue
            if ptype in ("array", "object") and enum is not None:
                add(plugin, row, f"{where}.enum", f"an {ptype} parameter cannot have an enum")
                continue
            bounds = []
            for key in ("min_items", "max_items"):
                value = item.get(key)
                if value is not None and (not is_int(value) or value < 0):
                    add(plugin, row, f"{where}.{key}", "must be a whole number ≥ 0")
                    value = False
                bounds.append(value)
            if False in bounds:
                continue
            if bounds[0] is not None and bounds[1] is not None and bounds[0] > bounds[1]:
                add(plugin, row, f"{where}.min_items", "is larger than max_items")
                continue
            if item.get("description") is not None and not isinstance(item["description"], str):
                add(plugin, row, f"{where}.description", "must be a string")
                continue
            out.append(Param(name=name, location=loc, required=required, enum=enum, type=ptype,
                             min_items=bounds[0], max_items=bounds[1], item_enum=item_enum,
                             description=item.get("description")))
        return out

    def _enum(self, plugin: str, row: str, field: str, raw: Any, loc: str, ptype: str | None) -> Any:
        """A tuple of allowed values, None when absent, False when invalid (reported)."""
        if raw is None:
            return None
        if not isinstance(raw, (list, tuple)) or not raw:
            self.c.add(plugin, row, field, "must be a non-empty list of values")
            return False
        for value in raw:
            ok = isinstance(value, str) if loc != "body" else (
                value is None or isinstance(value, (str, bool)) or _is_number(value))
            if not ok:
                self.c.add(plugin, row, field, f"{value!r} is not allowed: "
                           + ("path and query values are strings" if loc != "body" else "values are JSON scalars"))
                return False
            if ptype is not None and not _matches_type(value, ptype, loc):
                self.c.add(plugin, row, field, f"{value!r} is not a {ptype}")
                return False
        keys = [(type(v).__name__, v) for v in raw]
        if len(set(keys)) != len(keys):
            self.c.add(plugin, row, field, "lists a value twice")
            return False
        return tuple(raw)

    def _price(self, plugin: str, row: str, raw: Any, method: str, params: Sequence[Param]) -> Price | None:
        add = self.c.add
        forms = ("per_call_micro", "usage", "table")
        if not isinstance(raw, Mapping) or sum(k in raw for k in forms) != 1:
            add(plugin, row, "price", "must be exactly one of {\"per_call_micro\": N}, "
                "{\"usage\": [...], \"estimate_micro\": N}, {\"table\": {\"field\": F, \"prices\": {...}}} (free: 0)")
            return None
        if "per_call_micro" in raw:
            if set(raw) != {"per_call_micro"}:
                add(plugin, row, "price", f"a per-call price has no other keys than per_call_micro, not "
                    f"{sorted(set(raw) - {'per_call_micro'})}")
                return None
            n = raw["per_call_micro"]
            if not is_int(n) or not 0 <= n <= MAX_MICRO:
                add(plugin, row, "price.per_call_micro", f"{n!r} must be a whole number of micro-USD, 0 to {MAX_MICRO}")
                return None
            return Price(kind="per_call", per_call_micro=n)
        if "usage" in raw:
            if set(raw) != {"usage", "estimate_micro"}:
                add(plugin, row, "price", "a usage price is {\"usage\": [{path, micro_per_unit}], \"estimate_micro\": N}")
                return None
            terms_raw = raw["usage"]
            if not isinstance(terms_raw, (list, tuple)) or not terms_raw:
                add(plugin, row, "price.usage", "must be a non-empty list of {path, micro_per_unit}")
                return None
            terms = []
            for i, term in enumerate(terms_raw):
                where = f"price.usage[{i}]"
                if not isinstance(term, Mapping) or set(term) != {"path", "micro_per_unit"}:
                    add(plugin, row, where, "must be {\"path\": \"usage.total_tokens\", \"micro_per_unit\": N}")
                    return None
                path = term["path"]
                if not isinstance(path, str) or not re.fullmatch(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*", path):
                    add(plugin, row, f"{where}.path", f"{path!r} must be a dotted path into the JSON answer")
                    return None
                rate = term["micro_per_unit"]
                try:
                    dec = Decimal(str(rate)) if _is_number(rate) else None
                except InvalidOperation:
                    dec = None
                if dec is None or dec < 0 or dec > MAX_MICRO:
                    add(plugin, row, f"{where}.micro_per_unit", f"{rate!r} must be a number of micro-USD ≥ 0")
                    return None
                terms.append(UsageTerm(path, dec))
            est = raw["estimate_micro"]
            if not is_int(est) or not 0 <= est <= MAX_MICRO:
                add(plugin, row, "price.estimate_micro", f"{est!r} must be a whole number of micro-USD, 0 to {MAX_MICRO}")
                return None
            if est == 0 and any(t.micro_per_unit > 0 for t in terms):
                add(plugin, row, "price.estimate_micro", "must be > 0 when a usage term costs anything: "
                    "it is what a hold reserves")
                return None
            return Price(kind="usage", usage=tuple(terms), estimate_micro=est)
        table = raw["table"]
        if set(raw) != {"table"} or not isinstance(table, Mapping) or set(table) != {"field", "prices"}:
            add(plugin, row, "price.table", "must be {\"field\": \"<top-level body field>\", \"prices\": {value: N}}")
            return None
        field, prices = table["field"], table["prices"]
        if not isinstance(field, str) or not field:
            add(plugin, row, "price.table.field", "must name a top-level JSON body field")
            return None
        if method in _BODYLESS:
            add(plugin, row, "price.table", f"a {method} has no body to choose a table price from")
            return None
        if not isinstance(prices, Mapping) or not prices:
            add(plugin, row, "price.table.prices", "must be a non-empty dict of value → micro-USD")
            return None
        for key, n in prices.items():
            if not isinstance(key, str) or not is_int(n) or not 0 <= n <= MAX_MICRO:
                add(plugin, row, f"price.table.prices.{key}", f"{n!r} must be a whole number of micro-USD, 0 to "
                    f"{MAX_MICRO}, keyed by a string value")
                return None
        declared = next((p for p in params if p.name == field), None)
        if declared is not None and declared.location != "body":
            add(plugin, row, "price.table.field", f"{field!r} is declared \"in\": \"{declared.location}\"; a table "
                "price is chosen by a body field")
            return None
        if declared is not None and declared.enum is not None:
            unpriced = [v for v in declared.enum if v not in prices]
            if unpriced:
                add(plugin, row, "price.table.prices", f"enum values {unpriced!r} of {field!r} have no price")
                return None
        return Price(kind="table", table_field=field, table_prices=tuple((k, v) for k, v in prices.items()))

    # -- whole catalog ---------------------------------------------------------------------------
    def finish(self) -> CatalogRegistry:
        for ep in self.endpoints.values():
            if ep.superseded_by is None:
                continue
            if ep.superseded_by == ep.id:
                self.c.add(ep.plugin, f"endpoint {ep.id!r}", "superseded_by", "names the endpoint itself")
            elif ep.superseded_by not in self.endpoints:
                self.c.add(ep.plugin, f"endpoint {ep.id!r}", "superseded_by",
                           f"{ep.superseded_by!r} is not an endpoint of the catalog")
        managed_rows.check_kinds(self.c.add, self.endpoints.values())
        utilities = link_utilities(self.c.add, self.endpoints)  # async jobs: treg/catalog/async_jobs.py
        for uid, util in utilities.items():
            if util.archive is not None:
                # a poll answered from the archive reads a stale status; a fetch is streamed, never stored
                self.c.add(util.plugin, f"endpoint {uid!r}", "archive", f"an async {util.async_job.kind} "
                           "utility is never archived: it must read the vendor's live job")
        self.endpoints.update(utilities)
        if self.c.problems:
            raise CatalogError(self.c.problems)
        return CatalogRegistry.build(self.providers.values(), self.endpoints.values())


def _matches_type(value: Any, ptype: str, loc: str) -> bool:
    if loc != "body":  # path/query values are strings; the type says how they must read
        return matches_text(value, ptype)
    return matches_json(value, ptype)


def matches_text(value: str, ptype: str | None) -> bool:
    if ptype in (None, "string"):
        return True
    if ptype == "integer":
        return re.fullmatch(r"-?[0-9]+", value) is not None
    if ptype == "number":
        return re.fullmatch(r"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?", value) is not None
    if ptype == "boolean":
        return value in ("true", "false")
    return False


def matches_json(value: Any, ptype: str | None) -> bool:
    if ptype is None:
        return True
    return {
        "string": isinstance(value, str),
        "integer": is_int(value),
        "number": _is_number(value),
        "boolean": isinstance(value, bool),
        "array": isinstance(value, list),
        "object": isinstance(value, dict),
    }[ptype]


def build_catalog(declared: Iterable[tuple[str, Any]], injectors: Mapping[str, Injector],
                  aggregators: Mapping[str, Any] | None = None, *, oauth_http: bool = False) -> CatalogRegistry:
    """Validate ``(plugin name, hook result)`` pairs and build the registry, or raise :class:`CatalogError`
    listing every problem. A hook result is a list of provider dicts, or None. ``aggregators`` (by name)
    are what endpoint rows' ``overflow`` routes may name; ``oauth_http``: an ``oauth`` block may name plain
    http URLs (``TREG_SSRF_ALLOW`` is set)."""
    loader = _Loader(injectors, aggregators, oauth_http=oauth_http)
    for plugin, result in declared:
        if result is None:
            continue
        if isinstance(result, Mapping) or not isinstance(result, (list, tuple)):
            loader.c.add(plugin, "treg_register_providers", "", "must return a list of provider dicts (or None), "
                         f"not {type(result).__name__}")
            continue
        for i, data in enumerate(result):
            loader.provider(plugin, i, data)
    return with_routed(loader.finish())  # treg.<capability> for each capability two live endpoints share


def declared_providers(pm: PluginHost) -> list[tuple[str, Any]]:
    """Call every plugin's ``treg_register_providers`` hook, keeping who returned what."""
    try:
        results = call_hook(pm, "treg_register_providers")
    except PluginFailed as exc:  # a plugin bug must name the plugin, not crash anonymously
        raise CatalogError([Problem(exc.plugin, "treg_register_providers", "",
                                    f"the hook raised {exc.__cause__!r}")]) from exc
    out = [(res.plugin, res.value) for res in results]
    out.sort(key=lambda item: item[0])  # a stable order whatever pluggy's call order
    return out


def load_catalog(pm: PluginHost, injectors: Mapping[str, Injector],
                 aggregators: Mapping[str, Any] | None = None, *, oauth_http: bool = False) -> CatalogRegistry:
    """The validated catalog every plugin declares (raises :class:`CatalogError` on any bad row).
    ``aggregators`` None: collected from ``pm`` (:func:`treg.overflow.aggregator.collect_aggregators`)."""
    if aggregators is None:
        aggregators = collect_aggregators(pm)
    return build_catalog(declared_providers(pm), injectors, aggregators, oauth_http=oauth_http)


def warn_unknown_anonymous(registry: CatalogRegistry, settings: Any) -> list[str]:
    """Log (not refuse: the allow-list may name a provider a plugin adds later) every provider listed in
    ``TREG_ANONYMOUS_PROVIDERS`` that the catalog does not have or that has no anonymous endpoint."""
    odd = []
    for pid in settings.anonymous_providers:
        if pid not in registry.providers:
            odd.append(pid)
            log.warning("TREG_ANONYMOUS_PROVIDERS names %r, which no plugin declares", pid)
        elif not any(e.anonymous for e in registry.endpoints_of(pid)):
            odd.append(pid)
            log.warning("TREG_ANONYMOUS_PROVIDERS names %r, which has no platform_auth: anonymous endpoint", pid)
    return odd
