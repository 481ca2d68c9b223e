"""What an aggregator plugin provides, and the normalised result every aggregator's answer becomes.

An aggregator is another account of treg's at a reseller of vendor APIs (Orthogonal, Monid…). Its
plugin knows its envelope: how to ask for one vendor endpoint (a catalog endpoint row's ``overflow``
route + the caller's input) and how to read the answer. treg only sees :class:`OverflowResult`.
"""

from __future__ import annotations

import abc
import json
import re
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any, Mapping

from treg.errors import ConfigError
from treg.plugins import PluginFailed, PluginHost, call_hook

if TYPE_CHECKING:
    import aiohttp

    from treg.settings import SecretStr

NAME = re.compile(r"\A[a-z][a-z0-9_]{0,31}\Z")

#: the aggregator's key or account was refused (its 401/403): the aggregator is marked unhealthy
UNAUTHORIZED = "unauthorized"
#: its own wallet is empty (its 402): marked unhealthy
WALLET = "wallet"
#: its own rate limit (its 429): marked unhealthy
RATE_LIMITED = "rate_limited"
#: it refused this request (its 400/404/422, no vendor data): marks nothing, charges nothing
REFUSED = "refused"
#: not its envelope: not JSON, a 5xx without vendor data, a transport error, a run that failed or never
#: finished: marked unhealthy
NOT_ENVELOPE = "not_envelope"
#: the vendor answered through it that the account is out (a vendor 402): only ``overflow:<name>:<provider>``
VENDOR_CAPACITY = "vendor_capacity"
FAILURES = (UNAUTHORIZED, WALLET, RATE_LIMITED, REFUSED, NOT_ENVELOPE, VENDOR_CAPACITY)
#: the failures that mark the whole aggregator unhealthy
AGGREGATOR_FAILURES = (UNAUTHORIZED, WALLET, RATE_LIMITED, NOT_ENVELOPE)


@dataclass(frozen=True)
class OverflowRoute:
    """One validated entry of an endpoint row's ``overflow`` list (the aggregator's own fields in
    ``fields``: ``api``/``path`` for Orthogonal, ``provider``/``endpoint`` for Monid…)."""

    aggregator: str
    price_micro: int
    fields: tuple[tuple[str, Any], ...] = ()

    def get(self, name: str, default: Any = None) -> Any:
        return dict(self.fields).get(name, default)

    def to_json(self) -> dict[str, Any]:
        return {"aggregator": self.aggregator, **dict(self.fields), "price_micro": self.price_micro}


@dataclass(frozen=True)
class OverflowInput:
    """The caller's request, as the catalog endpoint read it: path slots, query, JSON body."""

    method: str
    path_params: Mapping[str, str] = field(default_factory=dict)
    query: Mapping[str, str] = field(default_factory=dict)
    body: Any = None  # the caller's JSON body (None: no body)


@dataclass(frozen=True)
class OverflowResult:
    """One aggregator attempt, normalised.

    ``failure`` None: the vendor answered through the aggregator (``vendor_status``, ``vendor_body`` as
    it relayed them) and treg owes ``price_micro``. Otherwise one of :data:`FAILURES`; ``message`` is
    the aggregator's own words (for ``refused``: what the 503's ``overflow_refused`` carries), and a
    vendor answer it carried (a relayed error) is in ``vendor_status``/``vendor_body``.
    """

    failure: str | None = None
    vendor_status: int | None = None
    vendor_body: Any = None
    price_micro: int = 0
    message: str | None = None
    #: the aggregator's own HTTP status (None: transport error)
    aggregator_status: int | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def marks_aggregator(self) -> bool:
        return self.failure in AGGREGATOR_FAILURES

    def vendor_bytes(self) -> bytes:
        """The vendor body as the caller receives it (JSON re-serialised; a string as UTF-8)."""
        if isinstance(self.vendor_body, (bytes, bytearray)):
            return bytes(self.vendor_body)
        if isinstance(self.vendor_body, str):
            return self.vendor_body.encode()
        return json.dumps(self.vendor_body, separators=(",", ":")).encode()


def usd_to_micro(raw: Any) -> int | None:
    """A USD amount (``"0.012"``, ``0.015``) as whole micro-USD, rounded up (None: not an amount ≥ 0)."""
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        return None
    try:
        dec = Decimal(str(raw))
    except InvalidOperation:
        return None
    if not dec.is_finite() or dec < 0:
        return None
    return int((dec * 1_000_000).to_integral_value(rounding=ROUND_CEILING))


class Aggregator(abc.ABC):
    """Subclass (or duck-type) this in a plugin and return instances from ``treg_register_aggregators``."""

    #: lower-case name: settings are ``TREG_OVERFLOW_KEY_<NAME>`` …, routes say ``"aggregator": name``
    name: str
    #: base URL used when ``TREG_OVERFLOW_URL_<NAME>`` is unset
    default_url: str

    @abc.abstractmethod
    def check_route(self, route: Mapping[str, Any]) -> list[tuple[str, str]]:
        """Problems with an endpoint row's route (its own fields, without ``aggregator``/``price_micro``),
        as ``(field, message)`` pairs; ``[]``: valid. Called at catalog load."""

    @abc.abstractmethod
    async def run(self, session: "aiohttp.ClientSession", *, base_url: str, key: "SecretStr",
                  route: OverflowRoute, call: OverflowInput, poll_max_s: float) -> OverflowResult:
        """Send the request and read the answer. Never raises for what the aggregator or the network
        did (a transport error is ``not_envelope``); never logs ``key``."""


def _is_aggregator(obj: Any) -> bool:
    return (isinstance(getattr(obj, "name", None), str) and callable(getattr(obj, "check_route", None))
            and callable(getattr(obj, "run", None)))


def collect_aggregators(pm: PluginHost) -> Mapping[str, Any]:
    """Aggregators by name (startup). A non-aggregator, a bad name or a duplicate stops startup."""
    found: dict[str, tuple[Any, str]] = {}
    for res in call_hook(pm, "treg_register_aggregators"):
        result = res.value or []
        if not isinstance(result, (list, tuple)):
            raise PluginFailed(res.plugin, "treg_register_aggregators",
                               f"must return a list of aggregators, not {type(result).__name__}")
        for agg in result:
            if not _is_aggregator(agg):
                raise PluginFailed(res.plugin, "treg_register_aggregators",
                                   f"returned {agg!r}, which is not an aggregator (name, check_route, run)")
            if not NAME.fullmatch(agg.name):
                raise PluginFailed(res.plugin, "treg_register_aggregators",
                                   f"aggregator name {agg.name!r} must be 1-32 of a-z, 0-9, '_', starting with a letter")
            if agg.name in found:
                raise ConfigError(f"two aggregators named {agg.name!r}: plugins {found[agg.name][1]!r} and "
                                  f"{res.plugin!r}", code="plugin_conflict")
            found[agg.name] = (agg, res.plugin)
    return {name: agg for name, (agg, _) in sorted(found.items())}
