"""The application factory: one aiohttp app, its resources in ``cleanup_ctx`` (no singletons).

Order of startup: plugins and every registry they declare (:func:`treg.startup.invoke_startup`: the
injectors, aggregators, catalog, capacity signatures, result classifiers) are loaded and validated
when the app is built, so a bad plugin or row stops treg before it listens; then the database
(embedded or configured) is migrated and its pool opened; then the one shared upstream ``ClientSession``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, AsyncIterator, Iterable

from aiohttp import web

import treg.startup
from treg import tool_urls
from treg.catalog.load import warn_unknown_anonymous
from treg.factory import build_services
from treg.infra import crypto, dns, migrate, upstream
from treg.infra.database_url import resolve_dsn
from treg.infra.db import Database
from treg.keys import CLIENT, SERVICES, SETTINGS
from treg.settings import Settings
from treg.call import capacity_stage, overflow_stage, runtime as call_runtime
from treg import reaper
from treg.archive import store as archive_store
from treg import hub_runs, oauth_runtime
from treg.web import api, call as call_routes
from treg.web import capacity_api, catalog_api, metrics_api, money_api, openapi
from treg.web import caching, dashboard, errors, index as index_routes, mcp as mcp_routes, protocol
from treg.web import hub_api, oauth_api, oauth_pages, resources_api
from treg.web.access_log import AccessLogger, AccessSink

log = logging.getLogger("treg")

#: components set up after the core services exist, before the server listens: each is
#: ``async def setup(app, svc) -> (async close) | None`` (caches, audit writer, resolver, …)
COMPONENTS: tuple[Any, ...] = (dns.setup, call_runtime.setup, capacity_stage.setup, reaper.setup,
                               tool_urls.setup, archive_store.setup, overflow_stage.setup, oauth_runtime.setup,
                               hub_runs.setup)


def create_app(settings: Settings, *, dsn: str | None = None, extra_plugins: Iterable[Any] = ()) -> web.Application:
    # every registry, validated before anything else starts: a bad plugin or row raises a ConfigError
    startup = treg.startup.invoke_startup(settings, extra_plugins=extra_plugins)
    warn_unknown_anonymous(startup.catalog, settings)
    # no middleware: treg/web/errors.py says why; the protocol's logger never logs a request's bytes
    app = web.Application(client_max_size=1024 ** 3, handler_args={"logger": protocol.RedactingLog()})
    app[SETTINGS] = settings
    # an answer says whether a shared cache may keep it. The call surfaces' RelayResponse writes its head
    # without this signal and sets the same default itself (treg/web/call.py): a receiver added here does
    # not see relayed answers
    app.on_response_prepare.append(caching.not_shared)
    box = crypto.load_box(settings)
    state: dict[str, Database] = {}

    async def database_ctx(app: web.Application) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        the_dsn = dsn or await loop.run_in_executor(None, resolve_dsn, settings)
        await loop.run_in_executor(None, migrate.upgrade, the_dsn)
        db = await Database(the_dsn, minsize=settings.db_pool_min, maxsize=settings.db_pool_max,
                            statement_connections=settings.db_statement_connections,
                            timeout=settings.db_timeout_s).open()
        state["db"] = db
        yield
        await db.close()

    async def services_ctx(app: web.Application) -> AsyncIterator[None]:
        svc = build_services(settings, state["db"], startup=startup, box=box)
        app[SERVICES] = svc
        closers = []
        for setup in COMPONENTS:
            closer = await setup(app, svc)
            if closer is not None:
                closers.append(closer)
        session = upstream.create_session(settings, svc.resolver)
        svc.client = session
        app[CLIENT] = session
        yield
        svc.client = upstream.NotServing()  # a call still arriving is refused, never sent on a closed session
        for closer in reversed(closers):
            await closer()
        await session.close()

    app.cleanup_ctx.append(database_ctx)
    app.cleanup_ctx.append(services_ctx)

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app.router.add_get("/healthz", errors.rendering(healthz))
    errors.add_routes(app, api.routes)
    errors.add_routes(app, catalog_api.routes)
    errors.add_routes(app, money_api.routes)
    errors.add_routes(app, openapi.routes)
    errors.add_routes(app, metrics_api.routes)
    errors.add_routes(app, capacity_api.routes)
    errors.add_routes(app, resources_api.routes)
    errors.add_routes(app, index_routes.routes)
    errors.add_routes(app, oauth_api.routes)
    errors.add_routes(app, hub_api.routes)
    app.router.add_routes(oauth_pages.routes)  # the consent pages render their own refusals as pages
    app.router.add_routes(call_routes.routes)  # the call surfaces render their own failures
    app.router.add_routes(mcp_routes.routes)  # so do the MCP endpoints (as JSON-RPC where clients read it)
    dashboard.setup(app)  # /ui/: HTML pages, which render their own refusals as pages
    errors.add_unrouted(app)  # last: what no route above matched
    return app


def make_runner(app: web.Application, *, access_sink: AccessSink | None = None, **kw: Any) -> web.AppRunner:
    """The runner ``treg serve`` uses (tests that serve treg "as in production" use it too); its access
    lines go to ``access_sink`` when given, else to logging (treg/web/access_log.py).

    ``handler_cancellation``: a caller who hangs up cancels its call (its hold is released, its upstream
    closed, also while the upstream is silent, as in an SSE stream) instead of treg finishing a call
    nobody will read. Its connections answer what aiohttp's parser refuses with the error body
    (treg/web/protocol.py)."""
    return protocol.Runner(app, access_log_class=AccessLogger.writing_to(access_sink), handle_signals=False,
                           handler_cancellation=True, **kw)
