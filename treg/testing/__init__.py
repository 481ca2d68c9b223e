"""Test support shipped with treg: database provisioning, raw-socket upstreams, recorders, helpers.

Third-party plugin authors can use these too (``from treg.testing import RawUpstream``), and load the
fixtures of :mod:`treg.testing.pytest_plugin` with ``pytest_plugins = ["treg.testing.pytest_plugin"]``
in their top ``conftest.py``. Everything binds to 127.0.0.1 only. One module per concern; every name
is importable from here:

* ``databases``  — the test server (its data in RAM where there is room: ``server_dir``), the template
  database, a private clone (or empty database) per test, the next one cloned ahead (``TemplateClones``),
  one statement run from outside treg (``run_sql``);
* ``settings``   — ``make_settings(home)`` for a treg under test;
* ``services``   — ``open_services(dsn, settings)``: the domain services with no HTTP in front;
* ``upstreams``  — ``RawUpstream`` / ``raw_upstream()``, recording the exact bytes received; a pair;
* ``client``     — requests sent as exact bytes (``raw_request_bytes``, ``raw_exchange``);
* ``dns``        — ``FakeDns``, an authoritative DNS server on 127.0.0.1;
* ``gateway``    — ``Gateway``, a running treg with its first org; ``vendor_gateway``, ``audit_row``;
* ``providers``  — ``example_provider``, ``media_provider`` and ``ProviderPlugin`` for catalog tests;
* ``catalogs``   — catalog.md's example provider and catalogs built from rows, as the loader checks them;
* ``calls``      — ``call_input(...)``: a CallInput with every field defaulted, to drive the pipeline;
* ``events``     — ``Events``, a plugin recording every ``treg_event``;
* ``clock``      — ``Clock``, moved by hand;
* ``closes``     — ``Closes``: every upstream close of a test;
* ``books``      — ``check_books`` (the money totals recomputed), ``count_hold_closes``, ``org_holds``;
* ``migrations`` — a migration's tables against the schema, up-down-up on its own database;
* ``processes``  — real ``treg`` processes: the CLI, ``treg serve`` (``Served``), HTTP to them;
* ``mcp_client`` — ``Mcp`` and the JSON-RPC messages of both MCP revisions;
* ``dashboard``  — ``login`` to the dashboard as a browser does (``post_login``), its session cookie and
  CSRF token;
* ``tls``        — ``self_signed()``, a throwaway certificate for an https ``RawUpstream``;
* ``import_graph`` — ``import_circles(graph)``, the circles of an import graph (the suite's import checks).

Not imported here, each used by its module's name: ``browser`` (Debian's chromium through Playwright:
``async with browser.chromium() as b``), ``oauth_server`` (``DotServer``: Django OAuth Toolkit, a real
OAuth 2.0 authorization server, as a subprocess; ``consent_in_browser``), ``nginx`` (``Nginx``, Debian's
nginx in front of a treg: TLS with
a throwaway certificate, a path prefix, the location block docs/operations.md gives), ``pytest_plugin`` (it needs pytest), ``vendors``
(fake vendors, one module per feature: ``treg.testing.vendors.capacity``), ``error_codes`` (every error
code treg's source can produce, read from the source) and ``import_each`` (a script, run by its path).
"""

from treg.testing.books import check_books, count_hold_closes, hold_row, org_holds
from treg.testing.calls import call_input
from treg.testing.catalogs import build_catalog_of, catalog_problems, contract_provider, endpoint_row
from treg.testing.client import HeaderLookup, RawReply, raw_exchange, raw_request_bytes, read_reply
from treg.testing.clock import T0, Clock
from treg.testing.closes import Closes, record_closes
from treg.testing.dashboard import CSRF, FORM_TOKEN, login, login_form, own_origin, post_login, session_cookie
from treg.testing.databases import (TemplateClones, base_dsn, checkout_root, claim_ram_folder, drop_template,
                                    dsn_for, empty_database, fresh_database, hold_close_fault, prepare_template,
                                    run_sql, server_dir, template_db, test_home)
from treg.testing.dns import FakeDns
from treg.testing.events import Events
from treg.testing.gateway import (ACME_PLATFORM, Gateway, add_member, answering_acme, audit_row, open_org,
                                  vendor_gateway)
from treg.testing.import_graph import import_circles
from treg.testing.mcp_client import LEGACY, META, MODERN, Mcp, legacy_headers, modern_headers, modern_message
from treg.testing.migrations import (assert_schema_matches, assert_up_down_up, column_names, table_names,
                                     table_of)
from treg.testing.processes import (EXAMPLE_PLUGIN, PROPAGATION_S, Api, Served, assert_clean_exits, credited_org,
                                    example_provider_env, free_port, http, run_cli, run_treg, serve_pair, served_pair,
                                    sixteen_calls_on_credit_for_ten, stop_all, treg_env, within)
from treg.testing.providers import ProviderPlugin, example_provider, media_provider
from treg.testing.services import open_services
from treg.testing.settings import make_settings
from treg.testing.tls import SelfSigned, self_signed
from treg.testing.upstreams import (ALLOW_ONE, BoundUpstream, Exchange, RawUpstream, Responder, http_response,
                                    raw_upstream, upstream_pair)

__all__ = [
    "ACME_PLATFORM", "ALLOW_ONE", "EXAMPLE_PLUGIN", "Api", "BoundUpstream", "CSRF", "FORM_TOKEN", "Clock", "Closes",
    "Events", "Exchange", "FakeDns",
    "Gateway", "HeaderLookup", "LEGACY", "META", "MODERN", "Mcp", "PROPAGATION_S", "ProviderPlugin",
    "RawReply", "RawUpstream", "Responder", "SelfSigned", "Served", "T0", "TemplateClones", "add_member", "answering_acme",
    "assert_clean_exits",
    "assert_schema_matches", "assert_up_down_up", "audit_row", "base_dsn", "build_catalog_of", "call_input",
    "catalog_problems", "check_books", "checkout_root", "claim_ram_folder", "column_names", "contract_provider",
    "count_hold_closes", "credited_org", "drop_template", "dsn_for", "empty_database", "endpoint_row", "example_provider", "example_provider_env",
    "free_port", "fresh_database", "hold_close_fault", "hold_row", "http", "http_response", "import_circles", "legacy_headers", "login", "login_form", "make_settings",
    "media_provider", "modern_headers", "modern_message", "open_org", "open_services", "own_origin", "post_login", "org_holds",
    "prepare_template", "raw_exchange", "raw_request_bytes", "raw_upstream", "read_reply", "record_closes",
    "run_cli", "run_sql", "run_treg", "self_signed", "serve_pair", "served_pair", "server_dir", "session_cookie",
    "sixteen_calls_on_credit_for_ten", "stop_all", "table_names", "table_of",
    "template_db", "test_home", "treg_env", "upstream_pair", "vendor_gateway", "within"
]
