"""``did_you_mean`` for a catalog miss: near ids, provider-local (pure, no I/O).

Matching stays inside the provider named by the id's first segment, because a misspelt operation of
one provider must not be "corrected" into another provider's endpoint (another account, another price).
Only when the provider segment itself is unknown are the closest provider ids tried in its place.
"""

from __future__ import annotations

import difflib
from typing import Sequence

from treg.catalog.registry import CatalogRegistry

MAX_SUGGESTIONS = 5


def did_you_mean(registry: CatalogRegistry, name: str, limit: int = MAX_SUGGESTIONS) -> list[str]:
    """Live endpoint ids near ``name`` (an id that is not in the catalog)."""
    provider_id, _, _ = name.partition(".")
    if provider_id in registry.providers:
        providers = [provider_id]
    else:
        providers = difflib.get_close_matches(provider_id, list(registry.providers), n=2, cutoff=0.75)
    out: list[str] = []
    for pid in providers:
        ops = [e.operation for e in registry.endpoints_of(pid) if e.is_live]
        wanted = name[len(provider_id) + 1:]
        # "github.repos" → every "github.repos.*": a prefix is the commonest near miss
        out.extend(f"{pid}.{op}" for op in ops if wanted and op.startswith(wanted + "."))
        # compare operations, not whole ids: a shared provider prefix would make everything look near
        out.extend(f"{pid}.{op}" for op in difflib.get_close_matches(wanted, ops, n=limit, cutoff=0.65))
    return list(dict.fromkeys(out))[:limit]


def near_tools(name: str, tool_names: Sequence[str]) -> list[str]:
    """Own tools whose name is the dotted ``name``'s first segment (``google-analytics.report`` beside a
    ``google-analytics`` tool): the caller probably meant ``/call/<tool>/<path>``."""
    head = name.partition(".")[0]
    return [t for t in tool_names if t == head]
