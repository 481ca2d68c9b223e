"""A trailing newline is never a valid name, id, tag, method or label (issue 20 item 11): with ``re.match``
a pattern ending in ``$`` accepts ``"acme\\n"`` (``$`` also matches before a final newline), so every
validating pattern in treg is anchored with ``\\A…\\Z`` and applied with ``fullmatch``."""

from __future__ import annotations

import importlib
import re

import pytest

#: (module, pattern name, a value it accepts)
PATTERNS = [
    ("treg.names", "TOOL_NAME", "stripe"), ("treg.tools", "_SETTING_NAME", "TREG_PLATFORM_ADS"),
    ("treg.membership", "_SLUG", "acme"), ("treg.membership", "_EMAIL", "o@acme.test"),
    ("treg.deny_rules", "_HOST", "api.example.com:443"), ("treg.deny_rules", "_METHOD", "DELETE"),
    ("treg.secrets_store", "_PROVIDER", "acme"), ("treg.money.limits", "_TAG", "team-a"),
    ("treg.idempotency", "_LABEL", "order-42"), ("treg.results", "_PATH", "data.emails"),
    ("treg.metrics", "_LABEL", "orthogonal"), ("treg.overflow.aggregator", "NAME", "orthogonal"),
    ("treg.catalog.async_jobs", "_PATH", "data.id"), ("treg.catalog.async_jobs", "_PARAM", "task_id"),
    ("treg.catalog.load", "PROVIDER_ID", "acme"), ("treg.catalog.load", "_CAPABILITY", "items.lookup"),
    ("treg.catalog.load", "_PATH_CHARS", "/items"), ("treg.catalog.load", "_QUERY_CHARS", "a=1"),
    ("treg.catalog.managed", "_KIND", "webhook"), ("treg.catalog.managed", "_PATH_PART", "id"),
    ("treg.capacity.signatures", "_JSON_PATH", "error.code"), ("treg.call.target", "_HOST_OK", "api.test"),
    ("treg.mcp.protocol", "_HEADER_SAFE", "plain value"), ("treg.mcp.protocol", "_SENTINEL", "=?base64?YQ==?="),
]


@pytest.mark.parametrize("module, name, good", PATTERNS)
def test_no_validating_pattern_takes_a_trailing_newline(module, name, good):
    pattern: re.Pattern[str] = getattr(importlib.import_module(module), name)
    assert pattern.fullmatch(good)
    assert pattern.match(good + "\n") is None and pattern.fullmatch(good + "\n") is None  # \Z, not $


# -- through the API ------------------------------------------------------------------------------

async def _refused(resp, code):
    body = await resp.json()
    assert resp.status == 400 and body["error"] == code and resp.headers["X-Treg-Error"] == "1", body


async def test_a_tool_name_with_a_trailing_newline_is_refused(gateway):
    c, h = gateway.client, gateway.owner
    await _refused(await c.post("/api/v1/tools", json={"name": "t\n", "base_url": "https://93.184.216.34/"},
                                headers=h), "invalid_name")
    tool = await gateway.tool("t", "https://93.184.216.34/")
    await _refused(await c.patch(f"/api/v1/tools/{tool['id']}", json={"name": "t\n"}, headers=h), "invalid_name")
    await _refused(await c.post("/api/v1/tools", headers=h, json={
        "name": "u", "base_url": "https://93.184.216.34/",
        "bindings": [{"location": "header", "name": "X-K", "platform_setting": "TREG_PLATFORM_X\n"}]}),
        "invalid_binding")


async def test_a_deny_rule_method_with_a_trailing_newline_is_refused(gateway):
    # stored, it was a rule that could never fire ("DELETE\n" is no request's method)
    await _refused(await gateway.client.post("/api/v1/deny-rules", headers=gateway.owner,
                                             json={"host": "api.example.com", "method": "DELETE\n"}),
                   "invalid_method")


async def test_a_secret_provider_with_a_trailing_newline_is_refused(gateway):
    await _refused(await gateway.client.post("/api/v1/secrets", headers=gateway.owner,
                                             json={"name": "k", "value": "v", "provider": "acme\n"}),
                   "invalid_provider")


async def test_a_tag_with_a_trailing_newline_is_refused(gateway):
    await _refused(await gateway.client.put("/api/v1/limits/tags/team%0A", headers=gateway.owner,
                                            json={"budget_micro": 5}), "invalid_tag")
    r = await gateway.client.put("/api/v1/limits/tags/team", headers=gateway.owner, json={"budget_micro": 5})
    assert r.status == 200
