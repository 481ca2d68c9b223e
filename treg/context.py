"""The services one treg process runs with, built by :func:`treg.factory.build_services` for the app,
the CLI and the tests alike (no import-time singletons, nothing looked up by name).

Plain-Python stages (management operations, the call pipeline) take a :class:`Services` and never
touch aiohttp's request objects, so tests can drive them without HTTP. Every component is a typed
field that is always set: what a process may run without (caches, the batching audit writer) is a
null object there, so no use site asks whether it is on (docs/architecture.md, "Services instead
of singletons").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Protocol

import pluggy

from treg.bindings import Binding, Injector
from treg.cache import Caches
from treg.call.metered import SpoolBudget
from treg.catalog.registry import CatalogRegistry
from treg.infra.crypto import SecretBox
from treg.infra.db import Database
from treg.infra.dns import VettingResolver
from treg.infra.ssrf import SsrfPolicy
from treg.memo import BoundedMemo
from treg.capacity.breaker import BreakerStore, LockView
from treg.capacity.signatures import SignatureRegistry
from treg.capacity.spacer import Spacer
from treg.metrics import Metrics
from treg.overflow.aggregator import Aggregator
from treg.results import ClassifierRegistry
from treg.settings import Settings

if TYPE_CHECKING:
    import aiohttp

    from treg.call.relay import OrgSecrets  # imports this module: the factory builds the value
    from treg.call.injection import InjectionPlan  # imports this module
    from treg.call.types import CallRecord


class AuditSink(Protocol):
    """Where finished calls and token uses go (treg.call.audit.AuditWriter when serving)."""

    #: True when :meth:`touch_token` batches a token's last use; False: the caller writes it at once
    batches_token_touch: bool

    def record(self, rec: "CallRecord") -> None: ...

    def touch_token(self, token_id: str) -> None: ...

    async def flush(self) -> None: ...


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
    pm: pluggy.PluginManager
    injectors: Mapping[str, Injector]
    ssrf: SsrfPolicy
    #: the redactors of platform settings' values (they live as long as the process), memoized once
    platform_redactors: OrgSecrets
    #: the breaker's strikes and locks (treg.capacity.breaker), written after platform-tier answers
    breaker: BreakerStore
    #: this process's in-memory copy of the locks (LISTEN/NOTIFY-fed once the call runtime starts it)
    lock_view: LockView
    #: platform-tier call spacing per provider, in this process (treg.capacity.spacer)
    spacer: Spacer
    #: the one shared upstream ClientSession (set by the app's cleanup context)
    client: "aiohttp.ClientSession | None" = None
    #: resolver used for SSRF checks (treg.infra.dns.VettingResolver), when running
    resolver: VettingResolver | None = None
    #: the validated endpoint catalog (treg.catalog), built by the app factory before anything starts
    catalog: CatalogRegistry = field(default_factory=CatalogRegistry.empty)
    #: per-org caches: null caches until the call runtime installs live ones (treg.call.runtime)
    caches: Caches = field(default_factory=Caches.off)
    #: finished calls and token uses: the batching writer while serving, else the null writer
    audit: AuditSink = field(default_factory=NullAuditWriter)
    #: bytes the spooled answers of this process may hold at once
    spool_budget: SpoolBudget = field(default_factory=SpoolBudget)
    #: provider id → (its auth bindings, their compiled injection plan), compiled once per provider
    provider_plans: BoundedMemo[str, tuple[tuple[Binding, ...], InjectionPlan]] = field(
        default_factory=lambda: BoundedMemo(256))
    #: the app's Prometheus metrics (treg.metrics), fed where each audit row is queued; None outside a server
    metrics: Metrics | None = None
    #: how vendors say treg's account is out (treg.capacity), collected once at startup
    capacity_signatures: SignatureRegistry = field(default_factory=SignatureRegistry.empty)
    #: overflow aggregators by name (treg.overflow), collected once at startup
    aggregators: Mapping[str, Aggregator] = field(default_factory=dict)
    #: result classifiers by endpoint id (treg.results), collected once at startup
    result_classifiers: ClassifierRegistry = field(default_factory=ClassifierRegistry.empty)
    #: the session overflow's aggregator runs use (treg/call/overflow_stage.py ``setup``): operator-configured
    #: hosts, plain JSON exchanges, not the faithful upstream session
    aggregator_client: "aiohttp.ClientSession | None" = None
