"""Catalog providers for tests: provider dicts (``example_provider``, ``media_provider``) and a plugin
declaring providers (``ProviderPlugin``)."""

from __future__ import annotations

from typing import Any

from treg import hookimpl


def example_provider(base_url: str, **over: Any) -> dict[str, Any]:
    """A provider dict (the plugin contract) named ``acme`` whose endpoints cover every price form,
    a retired row, an anonymous row and a strict-query row; ``base_url`` is the test upstream."""
    row = {
        "id": "acme",
        "base_url": base_url,
        "auth": [{"location": "header", "name": "Authorization", "format": "Bearer {secret}"}],
        "required_headers": {"X-Api-Version": "2025-11-01"},
        "endpoints": [
            {"id": "acme.items.get", "method": "GET", "path": "/items/{item_id}",
             "params": [{"name": "item_id", "in": "path", "required": True},
                        {"name": "fields", "in": "query", "enum": ["id", "all"]}],
             "price": {"per_call_micro": 2000}, "capability": "items.lookup"},
            {"id": "acme.items.cheap", "method": "GET", "path": "/cheap/{item_id}",
             "params": [{"name": "item_id", "in": "path", "required": True}],
             "price": {"per_call_micro": 500}, "capability": "items.lookup"},
            {"id": "acme.items.old", "method": "GET", "path": "/old", "params": [], "price": {"per_call_micro": 1},
             "status": "retired", "status_note": "v0 is gone", "superseded_by": "acme.items.get"},
            {"id": "acme.status", "method": "GET", "path": "/status", "params": [], "price": {"per_call_micro": 0},
             "platform_auth": "anonymous"},
            {"id": "acme.chat", "method": "POST", "path": "/chat", "params": [],
             "price": {"usage": [{"path": "usage.total_tokens", "micro_per_unit": 3}], "estimate_micro": 9000}},
            {"id": "acme.search", "method": "GET", "path": "/search",
             "params": [{"name": "q", "in": "query", "required": True}], "price": {"per_call_micro": 100},
             "strict_query": True},
            {"id": "acme.items.create", "method": "POST", "path": "/items",
             "params": [{"name": "name", "in": "body", "required": True},
                        {"name": "tags", "in": "body", "type": "array", "max_items": 2, "item_enum": ["a", "b"]}],
             "price": {"per_call_micro": 300}, "body_allowlist": True},
            {"id": "acme.items.legacy", "method": "GET", "path": "/legacy", "params": [],
             "price": {"per_call_micro": 50}, "capability": "items.lookup", "status": "broken",
             "status_note": "the provider turned it off"},
        ],
    }
    row.update(over)
    return row


class ProviderPlugin:
    """A plugin object declaring the given provider dicts (``make_app(extra_plugins=(ProviderPlugin([...]),))``)."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    @hookimpl
    def treg_register_providers(self) -> list[dict[str, Any]]:
        return self.rows


def media_provider(base_url: str) -> dict[str, Any]:
    """``gem.generate``: a usage-priced answer (2 micro a token), spooled, keyed by ``X-Goog-Api-Key``."""
    return {"id": "gem", "base_url": base_url, "auth": [{"location": "header", "name": "X-Goog-Api-Key"}],
            "endpoints": [{"id": "gem.generate", "method": "POST", "path": "/generate", "params": [],
                           "price": {"usage": [{"path": "usageMetadata.totalTokenCount", "micro_per_unit": 2}],
                                     "estimate_micro": 50_000},
                           "spooled_response": True}]}
