"""treg's suite: the fixtures of :mod:`treg.testing.pytest_plugin` (one PostgreSQL per session, a database
per test, apps on real sockets, recorders), and the few fixtures two of its modules share.

Test support lives in ``treg.testing`` (shipped); a test module never imports another
(tests/test_suite_layout.py checks it).
"""

from __future__ import annotations

import pytest

# treg.testing's asserts (check_books, assert_up_down_up…) explain their failures as a test's own do; so
# before anything imports treg.testing
pytest.register_assert_rewrite("treg.testing")

from treg.testing import Events, example_provider, http_response, raw_upstream, vendor_gateway  # noqa: E402
from treg.testing import browser as chromium_browser  # noqa: E402

pytest_plugins = ["treg.testing.pytest_plugin"]

#: what the ``env`` gateway's org is granted (test_call_exits.py's CREDITS)
ENV_CREDITS = 100_000


def free_download(base_url):
    return {"id": "files", "base_url": base_url, "auth": [{"location": "header", "name": "X-Key"}],
            "endpoints": [{"id": "files.get", "method": "GET", "path": "/files/{name}",
                           "params": [{"name": "name", "in": "path", "required": True}],
                           "price": {"per_call_micro": 0}},
                          {"id": "files.render", "method": "POST", "path": "/render", "params": [],
                           "price": {"usage": [{"path": "usage.pages", "micro_per_unit": 10}],
                                     "estimate_micro": 5000},
                           "spooled_response": True}]}


@pytest.fixture
async def env(aiohttp_client, make_app):
    """(gateway, upstream, events): a tool ``t`` and catalog providers on one raw upstream, with credits
    (``ENV_CREDITS``), a database pool of one connection and a 0.3 s pool timeout
    (tests/test_call_exits.py, test_call_stages.py)."""
    events = Events()
    async with raw_upstream(lambda ex: http_response(200, b'{"usage": {"pages": 3}}')) as up, \
            vendor_gateway(aiohttp_client, make_app,
                           [example_provider(up.url + "/v1"), free_download(up.url)],
                           plugins=(events,), slug="x", credits=ENV_CREDITS, db_pool_min=1, db_pool_max=1,
                           db_timeout_s=0.3, platform={"TREG_PLATFORM_KEY_ACME": "pk-acme",
                                                       "TREG_PLATFORM_KEY_FILES": "pk-files"}) as gw:
        await gw.tool("t", up.url + "/v1")
        yield gw, up, events


@pytest.fixture
async def browser():
    """Debian's chromium through Playwright, launched for the test (skipped, with the reason, when there
    is none): every dashboard test in a real browser."""
    if (why := chromium_browser.skip_reason()) is not None:
        pytest.skip(why)
    async with chromium_browser.chromium() as browser:
        yield browser


@pytest.fixture
async def fake_oauth():
    """A scripted OAuth provider on 127.0.0.1 counting its token requests (treg.testing.vendors.oauth):
    tests/test_oauth_connections.py, test_oauth_dashboard.py."""
    from treg.testing.vendors.oauth import FakeOAuth

    async with FakeOAuth() as server:
        yield server
