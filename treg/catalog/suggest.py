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
        ids = [e.id for e in registry.endpoints_of(pid) if e.is_live]
        wanted = name if pid == provider_id else pid + name[len(provider_id):]
        # "github.repos" → every "github.repos.*": a prefix is the commonest near miss
        out.extend(i for i in ids if i.startswith(wanted + "."))
        out.extend(difflib.get_close_matches(wanted, ids, n=limit, cutoff=0.6))
    return list(dict.fromkeys(out))[:limit]


def near_tools(name: str, tool_names: Sequence[str]) -> list[str]:
    """Own tools whose name is the dotted ``name``'s first segment (``google-analytics.report`` beside a
    ``google-analytics`` tool): the caller probably meant ``/call/<tool>/<path>``."""
    head = name.partition(".")[0]
    return [t for t in tool_names if t == head]
