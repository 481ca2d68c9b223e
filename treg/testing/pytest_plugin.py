"""treg's test fixtures as a pytest plugin: one PostgreSQL per session (embedded unless
``TREG_TEST_DATABASE_URL``), a database per test, treg apps on real 127.0.0.1 sockets, and the recorders
a test asks for by name (mitmproxy's ``test/taddons.py`` is the model: the fixtures hand out recording
parts of the real thing, not mocks).

Load it from the suite's top ``conftest.py``::

    pytest_plugins = ["treg.testing.pytest_plugin"]

treg's own ``tests/conftest.py`` does exactly that, in a checkout and when the suite runs against an
installed wheel alike. It is deliberately not a ``pytest11`` entry point: an entry point would load it
into every pytest run of every project that installs treg, where fixtures named ``client``,
``settings`` or ``svc`` would silently stand in for that project's own (pytest-django's ``client`` and
``settings``, say), and a suite that names it in ``pytest_plugins`` as well would register it twice. A
plugin author's suite opts in with the same line.

Async fixtures are ``pytest_asyncio`` fixtures, so they work in pytest-asyncio's strict mode too.
"""

from __future__ import annotations

import logging
from typing import Any, AsyncIterator, Callable, Iterator

import pytest
import pytest_asyncio
from aiohttp import web

from treg import membership
from treg.app import create_app
from treg.keys import SERVICES
from treg.settings import Settings
from treg.testing.books import count_hold_closes
from treg.testing.clock import Clock
from treg.testing.closes import Closes, record_closes
from treg.testing.databases import TemplateClones, base_dsn, drop_template, prepare_template
from treg.testing.dns import FakeDns
from treg.testing.events import Events
from treg.testing.gateway import Gateway
from treg.testing.services import open_services
from treg.testing.settings import make_settings
from treg.testing.upstreams import RawUpstream, raw_upstream


def pytest_configure(config: pytest.Config) -> None:
    # the embedded server's and the migrations' chatter would drown a failing test's log
    logging.getLogger("pgserver").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def pg_base() -> Iterator[str]:
    """The test server's maintenance DSN, with this session's migrated template database on it."""
    base = base_dsn()
    prepare_template(base)
    yield base
    drop_template(base)


@pytest.fixture(scope="session")
def template_clones(pg_base: str) -> Iterator[TemplateClones]:
    """The session's test databases, the next one cloned ahead while a test runs."""
    clones = TemplateClones(pg_base)
    yield clones
    clones.close()


@pytest.fixture
def dsn(template_clones: TemplateClones) -> Iterator[str]:
    """A private database of this test, cloned from the template (dropped after the test)."""
    with template_clones.database() as d:
        yield d


@pytest_asyncio.fixture
async def fake_dns() -> AsyncIterator[FakeDns]:
    """treg's upstream resolver asks this server on 127.0.0.1 (tests never ask real DNS): unknown
    names are NXDOMAIN; a test adds ``fake_dns.records["name"] = [("127.0.0.1", ttl)]``."""
    async with FakeDns() as server:
        yield server


@pytest.fixture
def settings(tmp_path: Any, fake_dns: FakeDns) -> Settings:
    return make_settings(tmp_path / "home", dns_nameservers=(fake_dns.nameserver,))


@pytest.fixture
def make_app(dsn: str, settings: Settings) -> Callable[..., web.Application]:
    """``make_app(extra_plugins=(...), **setting_overrides)``: a treg app on this test's database."""
    def build(extra_plugins: tuple[Any, ...] = (), **overrides: Any) -> web.Application:
        return create_app(settings.replace(**overrides) if overrides else settings, dsn=dsn,
                          extra_plugins=extra_plugins)
    return build


@pytest_asyncio.fixture
async def client(make_app: Callable[..., web.Application], aiohttp_client: Any) -> Any:
    """A treg served on a real 127.0.0.1 socket (aiohttp's TestServer), with an aiohttp client."""
    # make_app (so dsn) before aiohttp_client: teardown runs in reverse, so the app closes its pool
    # before its database is dropped (the other order costs ~1 s per test in pool teardown)
    return await aiohttp_client(make_app())


@pytest_asyncio.fixture
async def owner(client: Any) -> dict[str, Any]:
    """An org (slug ``acme``) and its owner; ``headers`` authenticate as the owner."""
    svc = client.app[SERVICES]
    org = await membership.create_org(svc, slug="acme", email="owner@acme.test")
    org["headers"] = {"X-Treg-Token": org["token"]}
    return org


@pytest_asyncio.fixture
async def gateway(make_app: Callable[..., web.Application], aiohttp_client: Any) -> AsyncIterator[Gateway]:
    """A treg that may relay to 127.0.0.0/8 (tests' upstreams), with org ``acme`` and its owner."""
    client = await aiohttp_client(make_app(ssrf_allow=("127.0.0.0/8",)))
    org = await membership.create_org(client.app[SERVICES], slug="acme", email="owner@acme.test")
    yield Gateway(client, org)
    await client.close()  # closing here, inside the test's loop, is ~1 s faster than aiohttp_client's teardown


@pytest_asyncio.fixture
async def up() -> AsyncIterator[RawUpstream]:
    """A raw-socket upstream on 127.0.0.1 that records the exact bytes it receives (answers 200 ``ok``)."""
    async with raw_upstream() as server:
        yield server


@pytest_asyncio.fixture
async def tool(gateway: Gateway, up: RawUpstream) -> dict[str, Any]:
    """The tool ``up`` of the gateway's org: base URL ``<up>/v1``, no bindings."""
    return await gateway.tool("up", up.url + "/v1")


@pytest_asyncio.fixture
async def svc(dsn: str, settings: Settings) -> AsyncIterator[Any]:
    """The services on their own, no HTTP (the money and idempotency suites drive them directly)."""
    s = await open_services(dsn, settings)
    yield s
    await s.db.close()


@pytest.fixture
def events() -> Events:
    """A recorder of every ``treg_event``: hand it to the app, ``make_app(extra_plugins=(events,))``."""
    return Events()


@pytest.fixture
def clock() -> Clock:
    """A hand-moved wall clock at :data:`treg.testing.clock.T0`, for a store's ``clock=``."""
    return Clock()


@pytest.fixture
def closes(monkeypatch: pytest.MonkeyPatch) -> Closes:
    """Every upstream response's CloseOnce of this test and each close() on it."""
    return record_closes(monkeypatch)


@pytest.fixture
def hold_closes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Every effective close of a hold (a settle or release that changed it), as (kind, call id)."""
    return count_hold_closes(monkeypatch)
