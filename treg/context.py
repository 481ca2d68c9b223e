"""The services one treg process runs with, built by the app factory (no import-time singletons).

Plain-Python stages (management operations, the call pipeline) take a :class:`Services` and never
touch aiohttp's request objects, so tests can drive them without HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

import pluggy

from treg.bindings import Injector
from treg.catalog.registry import CatalogRegistry
from treg.infra.crypto import SecretBox
from treg.infra.db import Database
from treg.infra.ssrf import SsrfPolicy
from treg.settings import Settings

if TYPE_CHECKING:
    import aiohttp

    from treg.metrics import Metrics


@dataclass
class Services:
    settings: Settings
    db: Database
    box: SecretBox
    pm: pluggy.PluginManager
    injectors: Mapping[str, Injector]
    ssrf: SsrfPolicy
    #: the one shared upstream ClientSession (set by the app's cleanup context)
    client: "aiohttp.ClientSession | None" = None
    #: resolver used for SSRF checks (treg.infra.dns.VettingResolver), when running
    resolver: Any = None
    #: extra components later stages attach (caches, audit writer, catalog…)
    extras: dict[str, Any] = field(default_factory=dict)
    #: the validated endpoint catalog (treg.catalog), built by the app factory before anything starts
    catalog: CatalogRegistry = field(default_factory=CatalogRegistry.empty)
    #: the app's Prometheus metrics (treg.metrics), fed where each audit row is queued; None outside a server
    metrics: "Metrics | None" = None
