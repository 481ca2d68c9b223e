"""The services one treg process runs with, built by :func:`treg.factory.build_services` for the app,
the CLI and the tests alike (no import-time singletons, nothing looked up by name).

Plain-Python stages (management operations, the call pipeline) take a :class:`Services` and never
touch aiohttp's request objects, so tests can drive them without HTTP. Every component is a typed
field that is always set: what a process may run without (caches, the batching audit writer, the
upstream sessions, the resolver) is a null object there, so no use site asks whether it is on
(docs/architecture.md, "Services instead of singletons").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Protocol

from treg.bindings import Binding, InjectionPlan, Injector
from treg.cache import Caches
from treg.catalog.registry import CatalogRegistry
from treg.cookie_names import HostCookies
from treg.infra.crypto import SecretBox
from treg.infra.db import Database
from treg.infra.dns import NullResolver, VettingResolver
from treg.infra.ssrf import SsrfPolicy
from treg.infra.upstream import NotServing
from treg.memo import BoundedMemo
from treg.capacity.breaker import BreakerStore, LockView
from treg.capacity.signatures import SignatureRegistry
from treg.capacity.spacer import Spacer
from treg.metrics import Metrics
from treg.hub_runs import HubRuns
from treg.oauth_runtime import OAuthRuntime
from treg.overflow.aggregator import Aggregator
from treg.plugins import PluginHost
from treg.redaction import RedactorMemo
from treg.results import ClassifierRegistry
from treg.settings import Settings
from treg.spool_budget import SpoolBudget

if TYPE_CHECKING:
    import aiohttp


    from treg.call_record import CallRecord
    from treg.hold import Close, Hold


class AuditSink(Protocol):
    """Where finished calls and token uses go (treg.call.audit.AuditWriter when serving)."""

    #: True when :meth:`touch_token` batches a token's last use; False: the caller writes it at once
    batches_token_touch: bool

    def record(self, rec: "CallRecord") -> None: ...

    def touch_token(self, token_id: str) -> None: ...

    async def flush(self) -> None: ...


class HoldCloser(Protocol):
    """Closes money holds (treg.money.settler): at once outside a server, off the answer's path in one."""

    async def close(self, hold: "Hold", close: "Close") -> bool: ...

    async def take_leased(self, svc: Any, *, org_id: str, member_id: str | None, tag: str | None, call_id: str,
                          amount_micro: int) -> "Hold | None": ...

    async def drain(self) -> None: ...

    def return_leases(self, org_id: str) -> None: ...

    def release_orphan(self, hold_id: str) -> None: ...


class NullAuditWriter:
    """The audit sink of a process that serves no calls (CLI commands, domain tests) or has stopped:
    nothing is recorded, and a token's last use is written by the caller at once."""

    batches_token_touch = False

    def record(self, rec: "CallRecord") -> None:
        pass  # no call surface runs here

    def touch_token(self, token_id: str) -> None:
        pass  # batches_token_touch is False: authenticate writes it itself

    async def flush(self) -> None:
        pass


@dataclass
class Services:
    settings: Settings
    db: Database
    box: SecretBox
    #: the loaded plugins; call-time hooks go through treg.plugins.call_hook on it
    pm: PluginHost
    # -- what the plugins registered: one treg.startup.Startup, collected once (treg/startup.py) -----
    injectors: Mapping[str, Injector]
    #: the validated endpoint catalog (treg.catalog)
    catalog: CatalogRegistry
    #: overflow aggregators by name (treg.overflow)
    aggregators: Mapping[str, Aggregator]
    #: how vendors say treg's account is out (treg.capacity)
    capacity_signatures: SignatureRegistry
    #: result classifiers by endpoint id (treg.results)
    result_classifiers: ClassifierRegistry
    # -----------------------------------------------------------------------------------------------
    ssrf: SsrfPolicy
    #: the redactors of platform settings' values (they live as long as the process), memoized once
    platform_redactors: RedactorMemo
    #: the cookies of treg and of its host that a caller's Cookie loses before it goes upstream
    #: (the built-in names and ``TREG_HOST_COOKIES``: treg.cookie_names.HostCookies)
    host_cookies: HostCookies
    #: closes money holds: at once (treg.money.settler.InlineSettler) until the call runtime installs the
    #: background Settler, which closes them off the answer's path
    settler: HoldCloser
    #: the breaker's strikes and locks (treg.capacity.breaker), written after platform-tier answers
    breaker: BreakerStore
    #: this process's in-memory copy of the locks (LISTEN/NOTIFY-fed once the call runtime starts it)
    lock_view: LockView
    #: platform-tier call spacing per provider, in this process (treg.capacity.spacer)
    spacer: Spacer
    #: this process's Prometheus metrics (treg.metrics), fed where each audit row is queued
    metrics: Metrics
    #: the one shared upstream ClientSession, opened by the app's cleanup context; until then (and in a
    #: process that serves no calls) the null session, which refuses every send
    client: "aiohttp.ClientSession | NotServing" = field(default_factory=NotServing)
    #: the resolver of SSRF checks and of the upstream connector (treg.infra.dns, an app component);
    #: the null resolver until it starts
    resolver: VettingResolver | NullResolver = field(default_factory=NullResolver)
    #: per-org caches: null caches until the call runtime installs live ones (treg.call.runtime)
    caches: Caches = field(default_factory=Caches.off)
    #: finished calls and token uses: the batching writer while serving, else the null writer
    audit: AuditSink = field(default_factory=NullAuditWriter)
    #: bytes the spooled answers of this process may hold at once
    spool_budget: SpoolBudget = field(default_factory=SpoolBudget)
    #: provider id → (its auth bindings, their compiled injection plan), compiled once per provider
    provider_plans: BoundedMemo[str, tuple[tuple[Binding, ...], InjectionPlan]] = field(
        default_factory=lambda: BoundedMemo(256))
    #: a catalog call's checked request and ladder decision, by (endpoint, request shape, the org's
    #: credentials for its provider): a bodiless request seen before skips check_request and plan_call
    #: (treg/call/catalog_stage.py ``plan_key``; a speed trick, docs/performance.md round 8)
    catalog_plans: BoundedMemo[tuple[Any, ...], tuple[Any, Any]] = field(default_factory=lambda: BoundedMemo(4096))
    #: the session overflow's aggregator runs use (treg/call/overflow_stage.py ``setup``): operator-configured
    #: hosts, plain JSON exchanges, not the faithful upstream session; the null session until it opens
    aggregator_client: "aiohttp.ClientSession | NotServing" = field(default_factory=NotServing)
    #: OAuth connections' token endpoints (their session, this process's refreshes in flight:
    #: treg/oauth_runtime.py); the null session until the app opens it
    oauth: OAuthRuntime = field(default_factory=OAuthRuntime)
    #: the hub calls this process runs: their slots' leases (treg/hub_runs.py, renewed by its component)
    hub: HubRuns = field(default_factory=HubRuns)
