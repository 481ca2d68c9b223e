"""The catalog's own frozen types: what a provider plugin's dicts become once validated.

Plugins write plain dicts (the contract of ``docs/plugins.md``); :mod:`treg.catalog.load` validates them
and builds these. Nothing here touches the network, the database or aiohttp.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal

from treg.bindings import Binding
from treg.jsonpath import dig
from treg.catalog.oauth import OAuthBlock

Tier = Literal["own", "team", "anonymous", "platform"]
#: the ladder's order (catalog.md "Credential tiers"): free beats paid, so anonymous precedes platform
TIERS: tuple[Tier, ...] = ("own", "team", "anonymous", "platform")

SLOT = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class Param:
    """One declared parameter. ``location`` is the contract's ``in``: path, query or body."""

    name: str
    location: Literal["path", "query", "body"]
    required: bool = False
    #: allowed values (strings for path/query; JSON scalars for body); None: any value
    enum: tuple[Any, ...] | None = None
    #: string | integer | number | boolean (every location); array | object (body only); None: any
    type: str | None = None
    #: body arrays: cardinality and the allowed items (checked when the caller supplies the array)
    min_items: int | None = None
    max_items: int | None = None
    item_enum: tuple[Any, ...] | None = None
    description: str | None = None

    @property
    def singleton(self) -> Any:
        """The one fixed value of a single-valued enum (tier-4 discriminator), else None."""
        return self.enum[0] if self.enum is not None and len(self.enum) == 1 else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "in": self.location, "required": self.required}
        for key in ("enum", "type", "min_items", "max_items", "item_enum", "description"):
            value = getattr(self, key)
            if value is not None:
                out[key] = list(value) if isinstance(value, tuple) else value
        return out


@dataclass(frozen=True)
class UsageTerm:
    """``units at path`` × ``micro_per_unit``: one meter read from the buffered answer."""

    path: str
    micro_per_unit: Decimal

    @property
    def top_level(self) -> str:
        return self.path.split(".", 1)[0]


def _number(d: Decimal) -> int | float:
    return int(d) if d == d.to_integral_value() else float(d)


@dataclass(frozen=True)
class Price:
    """A price in integer micro-USD, one of three forms (catalog.md "price forms").

    * ``per_call``: ``per_call_micro`` each call;
    * ``usage``: reserved at ``estimate_micro``, settled from usage terms read from the answer;
    * ``table``: a flat price chosen by the top-level JSON body field ``table_field``.
    """

    kind: Literal["per_call", "usage", "table"]
    per_call_micro: int = 0
    usage: tuple[UsageTerm, ...] = ()
    estimate_micro: int = 0
    table_field: str | None = None
    table_prices: tuple[tuple[str, int], ...] = ()

    @property
    def is_free(self) -> bool:
        if self.kind == "per_call":
            return self.per_call_micro == 0
        if self.kind == "usage":
            return self.estimate_micro == 0 and all(t.micro_per_unit == 0 for t in self.usage)
        return all(p == 0 for _, p in self.table_prices)

    @property
    def list_micro(self) -> int:
        """The price shown in listings and alternatives: the flat price, the usage estimate, the cheapest
        table row."""
        if self.kind == "per_call":
            return self.per_call_micro
        if self.kind == "usage":
            return self.estimate_micro
        return min(p for _, p in self.table_prices)

    def table_price(self, value: Any) -> int | None:
        if not isinstance(value, str):
            return None
        return dict(self.table_prices).get(value)

    def estimate_for(self, table_value: str | None = None) -> int:
        """What a hold reserves: flat price, usage estimate, or the chosen table row (unknown row: the
        dearest, so a hold never under-reserves)."""
        if self.kind == "table":
            price = self.table_price(table_value)
            return price if price is not None else max(p for _, p in self.table_prices)
        return self.list_micro

    @property
    def evidence_paths(self) -> tuple[str, ...]:
        """The paths of the answer that settlement reads (the leaves a spooled answer must keep)."""
        return tuple(dict.fromkeys(t.path for t in self.usage))

    def observed_micro(self, answer: Any, table_value: str | None = None) -> int:
        """The price actually owed once the answer is known.

        ``usage``: Σ units × micro_per_unit, rounded up to a whole micro-USD; when the answer is not a
        JSON object or any term is missing or not a non-negative number, the estimate (the reserve) is
        the price, as the seed settles a usage basis with no evidence.
        """
        if self.kind != "usage":
            return self.estimate_for(table_value)
        if not isinstance(answer, dict):
            return self.estimate_micro
        total = Decimal(0)
        for term in self.usage:
            units = dig(answer, term.path)
            if isinstance(units, bool) or not isinstance(units, (int, float)) or units < 0 \
                    or (isinstance(units, float) and not math.isfinite(units)):
                return self.estimate_micro
            total += Decimal(str(units)) * term.micro_per_unit
        return int(total.to_integral_value(rounding="ROUND_CEILING"))

    def to_json(self) -> dict[str, Any]:
        """The contract's dict form (what a plugin wrote)."""
        if self.kind == "per_call":
            return {"per_call_micro": self.per_call_micro}
        if self.kind == "usage":
            return {"usage": [{"path": t.path, "micro_per_unit": _number(t.micro_per_unit)} for t in self.usage],
                    "estimate_micro": self.estimate_micro}
        return {"table": {"field": self.table_field, "prices": dict(self.table_prices)}}


@dataclass(frozen=True)
class RateLimit:
    limit: int
    window_s: float

    def to_json(self) -> dict[str, Any]:
        return {"limit": self.limit, "window_s": self.window_s}


@dataclass(frozen=True)
class Endpoint:
    id: str
    provider: str
    method: str
    #: template relative to the provider's base URL (or ``host``), ``{param}`` slots filled from the query
    path: str
    params: tuple[Param, ...]
    price: Price
    capability: str | None = None
    status: Literal["live", "retired", "broken"] = "live"
    status_note: str | None = None
    superseded_by: str | None = None
    #: "anonymous": a free keyless GET, callable with no credential on an allow-listed provider
    platform_auth: str | None = None
    strict_query: bool = False
    body_allowlist: bool = False
    spooled_response: bool = False
    #: never offered on treg's own key (tier 4): BYOK only
    platform_blocked: bool = False
    #: one of the provider's approved ``catalog_hosts``; None: the provider's base URL
    host: str | None = None
    description: str | None = None
    docs_url: str | None = None
    #: the plugin that declared the endpoint (for error messages and ``treg catalog``)
    plugin: str = ""
    #: overflow routes to aggregators (treg.overflow.aggregator.OverflowRoute), tried in this order
    overflow: tuple[Any, ...] = ()
    #: the durable vendor object this row acts on (treg.catalog.managed.ManagedResource), None: none
    managed_resource: Any = None
    #: the archive's policy for the endpoint's answers (treg.catalog.archive_policy.ArchivePolicy); None: not archived
    archive: Any = None
    #: the row's ``async`` descriptor (treg.catalog.async_jobs.Submission), or, on the poll/fetch endpoint a
    #: descriptor names, that role (treg.catalog.async_jobs.Utility); None: neither (docs/lifecycle.md)
    async_job: Any = None
    #: a generated ``treg.<capability>`` (treg.catalog.routed.RoutedPlan: its children); None: a plugin's row
    route: Any = None
    #: when an answer counts as a success for money (treg.catalog.success.SuccessRule); None: any 2xx
    success: Any = None
    #: integer ranges and defaults enforced on treg's own key (treg.catalog.guards.Guard), in row order
    guards: tuple[Any, ...] = ()
    #: where the answer's rows are (treg.catalog.table.TableSpec): callable on ``/table/``; None: not there
    table: Any = None

    @property
    def operation(self) -> str:
        return self.id[len(self.provider) + 1:]

    @property
    def is_live(self) -> bool:
        return self.status == "live"

    @property
    def slots(self) -> tuple[str, ...]:
        """Path parameter names in template order."""
        return tuple(SLOT.findall(self.path))

    def params_in(self, location: str) -> tuple[Param, ...]:
        return tuple(p for p in self.params if p.location == location)

    def param(self, name: str, location: str | None = None) -> Param | None:
        for p in self.params:
            if p.name == name and (location is None or p.location == location):
                return p
        return None

    @property
    def needs_body(self) -> bool:
        """True when the pipeline must read the whole request body before the checks: body_allowlist
        checks it, strict_query refuses any, a table price is chosen by one of its fields, declared body
        params and body guards are checked on tier 4. Otherwise the body may stream untouched."""
        return (self.body_allowlist or self.strict_query or self.price.kind == "table"
                or bool(self.params_in("body")) or any(g.location == "body" for g in self.guards))

    @property
    def anonymous(self) -> bool:
        return self.platform_auth == "anonymous"

    def query_form(self, surface: str = "/catalog/call") -> str:
        """``/catalog/call/<id>?slot=<slot>&…``: how the path slots are passed (for the 400's detail)."""
        query = "&".join(f"{s}=<{s}>" for s in self.slots)
        return f"{surface}/{self.id}" + (f"?{query}" if query else "")

    def first_overflow(self, usable: Any = None) -> Any:
        """The first overflow route ``usable(route)`` accepts (None: every route is usable), else None."""
        return next((r for r in self.overflow if usable is None or usable(r)), None)

    def summary_json(self, overflow_usable: Any = None) -> dict[str, Any]:
        """``overflow_usable``: which routes count as usable now (an aggregator with a key, healthy, under
        its budget); None: every declared route."""
        route = self.first_overflow(overflow_usable)
        return {"id": self.id, "provider": self.provider, "method": self.method, "path": self.path,
                "capability": self.capability, "status": self.status, "price_micro": self.price.list_micro,
                "price": self.price.to_json(), "platform_auth": self.platform_auth,
                "description": self.description,
                "overflow_price_micro": route.price_micro if route is not None else None,
                "overflow_aggregator": route.aggregator if route is not None else None,
                "kind": "endpoint" if self.route is None else "routed",
                "guards": [g.to_json() for g in self.guards],
                **({} if self.route is None else {"children": self.route.summary_json()})}

    def to_json(self, overflow_usable: Any = None) -> dict[str, Any]:
        out = self.summary_json(overflow_usable)
        out.update({
            "params": [p.to_json() for p in self.params], "status_note": self.status_note,
            "superseded_by": self.superseded_by, "strict_query": self.strict_query,
            "body_allowlist": self.body_allowlist, "spooled_response": self.spooled_response,
            "platform_blocked": self.platform_blocked, "host": self.host, "docs_url": self.docs_url,
            "query_form": self.query_form(),
            "managed_resource": self.managed_resource.to_json() if self.managed_resource is not None else None,
            "archive": self.archive.to_json() if self.archive is not None else None,
            "async": self.async_job.to_json() if self.async_job is not None else None,
            "success": self.success.to_json() if self.success is not None else None,
            "table": self.table.to_json() if self.table is not None else None,
        })
        return out


@dataclass(frozen=True)
class Provider:
    id: str
    base_url: str
    #: the provider's key injection, same shape as tool bindings but with no secret reference: the ladder
    #: fills ``secret_id`` (team tier) or ``platform_setting`` (platform tier)
    auth: tuple[Binding, ...]
    #: constant headers sent on every tier (protocol pins such as an API version)
    required_headers: tuple[tuple[str, str], ...] = ()
    catalog_hosts: tuple[str, ...] = ()
    rate_limit: RateLimit | None = None
    endpoint_ids: tuple[str, ...] = ()
    name: str | None = None
    description: str | None = None
    docs_url: str | None = None
    plugin: str = ""
    #: how a person grants access (docs/oauth.md): connections then inject the access token as ``{secret}``
    oauth: OAuthBlock | None = None

    @property
    def platform_setting(self) -> str:
        """``TREG_PLATFORM_KEY_<PROVIDER>``: upper-case, ``-`` → ``_`` (catalog.md)."""
        return "TREG_PLATFORM_KEY_" + self.id.upper().replace("-", "_")

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "base_url": self.base_url,
                "auth": [b.to_json() for b in self.auth],
                "required_headers": dict(self.required_headers), "catalog_hosts": list(self.catalog_hosts),
                "rate_limit": self.rate_limit.to_json() if self.rate_limit else None,
                "endpoints": list(self.endpoint_ids), "description": self.description, "docs_url": self.docs_url,
                "platform_setting": self.platform_setting,
                "oauth": self.oauth.to_json() if self.oauth is not None else None}


def join_url(root: str, path: str) -> str:
    """Root (keeping its own path prefix) + an endpoint path; no path: the root itself."""
    if not path:
        return root
    return root.rstrip("/") + path


