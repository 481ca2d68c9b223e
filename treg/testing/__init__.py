"""Test support shipped with treg: database provisioning, a raw-socket upstream recorder, helpers.

Third-party plugin authors can use these too (``from treg.testing import RawUpstream``). Everything
binds to 127.0.0.1 only. One module per concern; every name is importable from here as before:

* ``databases`` — the test server, the template database, a private clone per test;
* ``settings``  — ``make_settings(home)`` for a treg under test;
* ``upstreams`` — ``RawUpstream`` / ``raw_upstream()``, recording the exact bytes received;
* ``client``    — requests sent as exact bytes (``raw_request_bytes``, ``raw_exchange``);
* ``dns``       — ``FakeDns``, an authoritative DNS server on 127.0.0.1;
* ``gateway``   — ``Gateway``, a running treg with its first org;
* ``providers`` — ``example_provider`` and ``ProviderPlugin`` for catalog tests;
* ``browser``   — Debian's chromium through Playwright (``async with browser.chromium() as b``);
* ``nginx``     — ``Nginx``, Debian's nginx in front of a treg: TLS with a throwaway certificate, a path
  prefix, the location block docs/operations.md gives (these two are imported as modules:
  ``from treg.testing import nginx``).
"""

from treg.testing.client import RawReply, raw_exchange, raw_request_bytes, read_reply
from treg.testing.databases import (base_dsn, drop_template, dsn_for, fresh_database, prepare_template,
                                    template_db, test_home)
from treg.testing.dns import FakeDns
from treg.testing.gateway import Gateway
from treg.testing.providers import ProviderPlugin, example_provider
from treg.testing.settings import make_settings
from treg.testing.upstreams import Exchange, RawUpstream, Responder, http_response, raw_upstream

__all__ = [
    "Exchange", "FakeDns", "Gateway", "ProviderPlugin", "RawReply", "RawUpstream", "Responder", "base_dsn",
    "drop_template", "dsn_for", "example_provider", "fresh_database", "http_response", "make_settings",
    "prepare_template", "raw_exchange", "raw_request_bytes", "raw_upstream", "read_reply", "template_db",
    "test_home",
]
