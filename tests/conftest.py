"""Fixtures: one PostgreSQL per session (embedded unless TREG_TEST_DATABASE_URL), a database per test."""

from __future__ import annotations

import logging
from typing import Any, AsyncIterator, Callable

import pytest
from aiohttp import web

from treg import tenancy, testing
from treg.app import create_app
from treg.keys import SERVICES

logging.getLogger("pgserver").setLevel(logging.WARNING)
logging.getLogger("alembic").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def pg_base():
    base = testing.base_dsn()
    testing.prepare_template(base)
    yield base
    testing.drop_template(base)


@pytest.fixture
def dsn(pg_base: str):
    with testing.fresh_database(pg_base) as d:
        yield d


@pytest.fixture
async def fake_dns():
    """treg's upstream resolver asks this server on 127.0.0.1 (tests never ask real DNS): unknown
    names are NXDOMAIN; a test adds ``fake_dns.records["name"] = [("127.0.0.1", ttl)]``."""
    async with testing.FakeDns() as server:
        yield server


@pytest.fixture
def settings(tmp_path, fake_dns):
    return testing.make_settings(tmp_path / "home", dns_nameservers=(fake_dns.nameserver,))


@pytest.fixture
def make_app(dsn: str, settings) -> Callable[..., web.Application]:
    def build(extra_plugins: tuple[Any, ...] = (), **overrides: Any) -> web.Application:
        return create_app(settings.replace(**overrides) if overrides else settings, dsn=dsn,
                          extra_plugins=extra_plugins)
    return build


@pytest.fixture
async def client(make_app, aiohttp_client):
    """A treg served on a real 127.0.0.1 socket (aiohttp's TestServer), with an aiohttp client."""
    # make_app (so dsn) before aiohttp_client: teardown runs in reverse, so the app closes its pool
    # before its database is dropped (the other order costs ~1 s per test in pool teardown)
    return await aiohttp_client(make_app())


@pytest.fixture
async def owner(client) -> dict[str, Any]:
    """An org (slug ``acme``) and its owner; ``headers`` authenticate as the owner."""
    svc = client.app[SERVICES]
    org = await tenancy.create_org(svc, slug="acme", email="owner@acme.test")
    org["headers"] = {"X-Treg-Token": org["token"]}
    return org


@pytest.fixture
async def gateway(make_app, aiohttp_client):
    """A treg that may relay to 127.0.0.0/8 (tests' upstreams), with org ``acme`` and its owner."""
    client = await aiohttp_client(make_app(ssrf_allow=("127.0.0.0/8",)))
    org = await tenancy.create_org(client.app[SERVICES], slug="acme", email="owner@acme.test")
    yield testing.Gateway(client, org)
    await client.close()  # closing here, inside the test's loop, is ~1 s faster than aiohttp_client's teardown


@pytest.fixture
async def up():
    """A raw-socket upstream on 127.0.0.1 that records the exact bytes it receives (answers 200 ``ok``)."""
    async with testing.raw_upstream() as server:
        yield server


@pytest.fixture
async def tool(gateway, up):
    """The tool ``up`` of the gateway's org: base URL ``<up>/v1``, no bindings."""
    return await gateway.tool("up", up.url + "/v1")


@pytest.fixture
async def svc(dsn: str, settings) -> AsyncIterator[Any]:
    """The services on their own, no HTTP (the money and idempotency suites drive them directly)."""
    from test_money_helpers import open_services

    s = await open_services(dsn, settings)
    yield s
    await s.db.close()
