"""The one place a :class:`~treg.context.Services` is built: the app factory, the CLI's operator
commands and the tests all call :func:`build_services`, so what a process runs with cannot drift
between them (a component added here is there for all three).

What only a serving process has (live caches and their listener, the batching audit writer, the
upstream session, the resolver) is attached later by the app's components; until then the null
objects :class:`~treg.context.Services` defaults to stand in for them.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import pluggy

from treg import plugins
from treg.bindings import Injector
from treg.call.relay import OrgSecrets
from treg.capacity.breaker import BreakerStore, LockView
from treg.capacity.spacer import Spacer
from treg.catalog.registry import CatalogRegistry
from treg.context import Services
from treg.infra import crypto
from treg.infra.crypto import SecretBox
from treg.infra.db import Database
from treg.infra.ssrf import SsrfPolicy
from treg.settings import Settings


def build_services(settings: Settings, db: Database, *, pm: pluggy.PluginManager | None = None,
                   injectors: Mapping[str, Injector] | None = None, box: SecretBox | None = None,
                   catalog: CatalogRegistry | None = None, extra_plugins: Iterable[Any] = ()) -> Services:
    """Services on an open ``db``; ``pm``/``injectors``/``box`` are loaded from ``settings`` unless the
    caller loaded them already (the app does, before it opens the database, so a bad plugin or key
    stops it first)."""
    if pm is None:
        pm = plugins.create_manager(settings.plugins_dir, extra=extra_plugins)
    # the store refreshes the view after this process's own writes (its NOTIFY reaches the others)
    lock_view = LockView(db, settings)
    return Services(settings=settings, db=db, box=box if box is not None else crypto.load_box(settings), pm=pm,
                    injectors=injectors if injectors is not None else plugins.collect_injectors(pm),
                    ssrf=SsrfPolicy.from_settings(settings.proxy_ssrf_check, settings.ssrf_allow),
                    platform_redactors=OrgSecrets({}),
                    breaker=BreakerStore(db, settings, view=lock_view), lock_view=lock_view,
                    spacer=Spacer(settings.smoothing_max_wait_ms),
                    catalog=catalog if catalog is not None else CatalogRegistry.empty())
