"""Catalogs built from provider rows, as the loader checks them at startup: catalog.md's example provider
(``contract_provider``), a catalog of given rows with the built-in injectors (``build_catalog_of``) and the
problems the loader names for a mutated example (``catalog_problems``)."""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

from treg import plugins
from treg.catalog.errors import CatalogError
from treg.catalog.load import build_catalog


def contract_provider() -> dict[str, Any]:
    """catalog.md's example provider, plus a POST endpoint to mutate."""
    return {
        "id": "acme",
        "base_url": "https://api.acme.example/v1",
        "auth": [{"location": "header", "name": "Authorization", "format": "Bearer {secret}"}],
        "required_headers": {"X-Api-Version": "2025-11-01"},
        "catalog_hosts": ["https://eu.api.acme.example/v1"],
        "rate_limit": {"limit": 120, "window_s": 60},
        "endpoints": [
            {
                "id": "acme.items.get",
                "method": "GET",
                "path": "/items/{item_id}",
                "params": [
                    {"name": "item_id", "in": "path", "required": True},
                    {"name": "fields", "in": "query", "enum": ["id", "all"]},
                ],
                "price": {"per_call_micro": 2000},
                "capability": "items.lookup",
                "status": "live",
                "status_note": None, "superseded_by": None,
                "platform_auth": None,
                "strict_query": False, "body_allowlist": False, "spooled_response": False,
            },
            {
                "id": "acme.items.create",
                "method": "POST",
                "path": "/items",
                "params": [{"name": "name", "in": "body", "required": True},
                           {"name": "tags", "in": "body", "type": "array", "max_items": 3}],
                "price": {"per_call_micro": 5000},
            },
        ],
    }


@functools.cache
def _builtin_injectors() -> Mapping[str, Any]:
    # the registry a treg with no plugin of its own has (header, query, json), collected once per process
    return plugins.collect_injectors(plugins.create_manager(None))


def build_catalog_of(*providers: dict[str, Any], plugin: str = "acme-plugin") -> Any:
    """The catalog registry of ``providers``, declared by one plugin named ``plugin``."""
    return build_catalog([(plugin, list(providers))], _builtin_injectors())


def catalog_problems(mutate: Callable[[dict[str, Any]], Any]) -> list[Any]:
    """The problems the loader names for :func:`contract_provider` changed by ``mutate`` (which must
    break it)."""
    data = contract_provider()
    mutate(data)
    try:
        build_catalog_of(data)
    except CatalogError as exc:
        return list(exc.problems)
    raise AssertionError("the mutated provider row was accepted")


def endpoint_row(data: dict[str, Any], i: int = 0) -> dict[str, Any]:
    """The ``i``-th endpoint row of a provider row."""
    return data["endpoints"][i]
