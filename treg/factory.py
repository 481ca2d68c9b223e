"""The one place a :class:`~treg.context.Services` is built: the app factory, the CLI's operator
commands and the tests all call :func:`build_services`, so what a process runs with cannot drift
between them (a component added here is there for all three). The plugins and every registry they
declare come from one :class:`~treg.startup.Startup` (:func:`treg.startup.invoke_startup`).

What only a serving process has (live caches and their listener, the batching audit writer, the
upstream sessions, the resolver) is attached later by the app's components; until then the null
objects :class:`~treg.context.Services` defaults to stand in for them.
"""

from __future__ import annotations

from typing import Any, Iterable

import treg.startup
from treg.capacity.breaker import BreakerStore, LockView
from treg.capacity.spacer import Spacer
from treg.context import Services
from treg.cookie_names import HostCookies
from treg.infra import crypto
from treg.infra.crypto import SecretBox
from treg.infra.db import Database
from treg.infra.ssrf import SsrfPolicy
from treg.metrics import Metrics
from treg.money.settler import InlineSettler
from treg.redaction import RedactorMemo
from treg.settings import Settings


def build_services(settings: Settings, db: Database, *, startup: treg.startup.Startup | None = None,
                   box: SecretBox | None = None, extra_plugins: Iterable[Any] = ()) -> Services:
    """Services on an open ``db``; ``startup`` (the plugins and their registries) and ``box`` are
    loaded from ``settings`` unless the caller loaded them already (the app and the CLI do, before they
    open the database, so a bad plugin, row or key stops them first)."""
    if startup is None:
        startup = treg.startup.invoke_startup(settings, extra_plugins=extra_plugins)
    # the store refreshes the view after this process's own writes (its NOTIFY reaches the others)
    lock_view = LockView(db, settings)
    metrics = Metrics()  # this process's own registry (two apps in one process never share one)
    metrics.bind(db)
    return Services(settings=settings, db=db, box=box if box is not None else crypto.load_box(settings),
                    pm=startup.pm, injectors=startup.injectors, catalog=startup.catalog,
                    aggregators=startup.aggregators, capacity_signatures=startup.capacity_signatures,
                    result_classifiers=startup.result_classifiers,
                    ssrf=SsrfPolicy.from_settings(settings.proxy_ssrf_check, settings.ssrf_allow),
                    platform_redactors=RedactorMemo(),
                    host_cookies=HostCookies.of(settings.host_cookies), settler=InlineSettler(db),
                    breaker=BreakerStore(db, settings, view=lock_view), lock_view=lock_view,
                    spacer=Spacer(settings.smoothing_max_wait_ms), metrics=metrics)
