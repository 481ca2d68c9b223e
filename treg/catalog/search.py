"""Finding endpoints by words (pure, no I/O): for ``catalog_search`` and for every not-found answer.

An agent that knows nothing of the catalog says what it wants in words ("weather forecast",
``weather.forecast``, "geocode a city"). Each word is matched against an endpoint's id, capability,
description, provider, path and parameter names (a word matches a token it equals, or that starts
with it or it starts with, from four letters: "forecasts" finds "forecast"); endpoints are ranked by
how many of the words they match, ids and capabilities weighing more than descriptions. Retired and
broken endpoints are never suggested.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Sequence
from urllib.parse import quote_plus

from treg.catalog.model import Endpoint
from treg.catalog.alternatives import alternatives
# tiers, not the ladder: the ladder imports this module's alternatives
from treg.catalog.tiers import OrgCredentials, how_to_get_credential, needed_tier, offer_tier
from treg.catalog.registry import CatalogRegistry
from treg.errors import TregError
from treg.settings import Settings

#: where a caller searches the catalog over plain HTTP (api.md, surfaces.md "Discovery")
SEARCH_PATH = "/api/v1/catalog/endpoints"

_SPLIT = re.compile(r"[^a-z0-9]+")
#: words that say nothing about which endpoint is meant
_STOP = frozenset({"a", "an", "the", "for", "of", "to", "in", "on", "at", "by", "with", "and", "or", "from", "me",
                   "my", "i", "is", "what", "get", "api", "call", "please", "find", "show", "some", "v1", "v2",
                   "http", "https", "www", "com", "org", "net", "io"})


def words(text: str) -> list[str]:
    """The meaningful lower-case words of ``text`` (a name such as ``weather.forecast``, or a sentence)."""
    return list(dict.fromkeys(w for w in _SPLIT.split(text.lower()) if len(w) > 1 and w not in _STOP))


def search_url(text: str) -> str:
    """The plain-HTTP catalog search for the words of ``text``."""
    return f"{SEARCH_PATH}?q={quote_plus(' '.join(words(text)))}"


def _strong(registry: CatalogRegistry, ep: Endpoint) -> set[str]:
    provider = registry.providers.get(ep.provider)
    return set(words(" ".join(filter(None, (ep.id, ep.capability, provider.name if provider else None)))))


def _weak(ep: Endpoint) -> set[str]:
    return set(words(" ".join(filter(None, (ep.description, ep.path, " ".join(p.name for p in ep.params))))))


def _hit(word: str, tokens: Iterable[str]) -> bool:
    for t in tokens:
        if t == word:
            return True
        if min(len(t), len(word)) >= 4 and (t.startswith(word) or word.startswith(t)):
            return True
    return False


def scored(registry: CatalogRegistry, query: str | None = None,
           capability: str | None = None) -> list[tuple[Endpoint, int]]:
    """``(endpoint, how many of the query's words it matched)`` for the live endpoints of ``query`` (words)
    and/or ``capability`` (exact, or a part such as ``weather`` for ``weather.*``), best first; neither:
    every live endpoint, by id."""
    wanted = words(query or "")
    cap = (capability or "").strip().lower()
    out: list[tuple[tuple[int, int, str], Endpoint, int]] = []
    for ep in registry.endpoints.values():
        if not ep.is_live:
            continue
        if cap:
            own = (ep.capability or "").lower()
            if not (own == cap or own.startswith(cap + ".") or cap in own.split(".")):
                continue
        matched = score = 0
        if wanted:
            strong, weak = _strong(registry, ep), _weak(ep)
            for w in wanted:
                if _hit(w, strong):
                    matched, score = matched + 1, score + 3
                elif _hit(w, weak):
                    matched, score = matched + 1, score + 1
            if not matched:
                continue
        out.append(((-matched, -score, ep.id), ep, matched))
    out.sort(key=lambda item: item[0])
    return [(ep, matched) for _, ep, matched in out]


def rank(registry: CatalogRegistry, query: str | None = None, capability: str | None = None,
         limit: int = 10) -> list[Endpoint]:
    """The endpoints of :func:`scored`, best first, at most ``limit``."""
    return [ep for ep, _ in scored(registry, query, capability)[:max(0, limit)]]


def by_words(registry: CatalogRegistry, name: str, limit: int = 5) -> list[str]:
    """Live endpoint ids that share the most words with ``name`` (across providers), best first; an id
    must match at least half of the name's words, so one shared word of a long name is not a match."""
    wanted = words(name)
    if not wanted:
        return []
    need = max(1, (len(wanted) + 1) // 2)
    return [ep.id for ep, matched in scored(registry, name) if matched >= need][:limit]


def pointer(registry: CatalogRegistry, name: str, first: Sequence[str] = (), limit: int = 5) -> dict[str, object]:
    """``hint`` (the catalog search URL for the words of ``name``) and ``did_you_mean``: ``first`` (the
    provider-local misspellings, or a connected tool), then the best matches by words across providers."""
    url = search_url(name)
    merged = list(dict.fromkeys([*first, *by_words(registry, name, limit)]))[:max(limit, len(first))]
    return {"hint": f"search the catalog for it: GET {url} (or the MCP tool catalog_search); call an endpoint "
                    "with /catalog/call/<endpoint-id>?<param>=<value>",
            "did_you_mean": merged}


def no_match(registry: CatalogRegistry) -> dict[str, Any]:
    """What a search that found nothing adds, on every surface (the plain-HTTP listing and MCP's
    ``catalog_search`` alike): a ``hint`` at the next step and the ``capabilities`` to search by."""
    return {"hint": "no live endpoint matches; try other or fewer words, or search by one of the capabilities "
                    "listed (capability)",
            "capabilities": sorted(registry.capabilities)}


def example_query(ep: Endpoint) -> str:
    """``/catalog/call/<id>?<required>=<…>``: the plain-HTTP form of a call with its required parameters."""
    required = [p.name for p in ep.params if p.required and p.location != "body"]
    query = "&".join(f"{name}=<{name}>" for name in required)
    return f"/catalog/call/{ep.id}" + (f"?{query}" if query else "")


def describe(registry: CatalogRegistry, ep: Endpoint, creds: OrgCredentials | None,
             settings: Settings) -> dict[str, Any]:
    """One match for a caller: parameters, price, the tier the caller would get (or what it needs),
    same-capability alternatives, and how to call it (MCP arguments and the plain-HTTP form)."""
    provider = registry.provider_of(ep)
    tier = offer_tier(provider, ep, creds, settings)
    row: dict[str, Any] = {"id": ep.id, "description": ep.description, "provider": ep.provider,
                 "provider_name": provider.name, "method": ep.method, "capability": ep.capability,
                 "price_micro": ep.price.list_micro, "price": ep.price.to_json(),
                 "params": [p.to_json() for p in ep.params], "credential_tier": tier, "callable": tier is not None,
                 "billed": tier == "platform",
                 # what treg's own key bounds (and fills in) on this endpoint: an agent sizes its request by it
                 "guards": [g.to_json() for g in ep.guards]}
    if tier is None:
        row["needs"] = needed_tier(provider, ep)
        row["how_to_get_credential"] = how_to_get_credential(provider, ep)
    row["alternatives"] = alternatives(registry, ep, settings, creds)
    if ep.route is not None:  # a routed treg.<capability>: the children it tries, in order
        row.update(kind="routed", children=ep.route.children_json(creds, settings))
    row["call"] = {"tool": "catalog_call", "arguments": {
        "endpoint": ep.id, "params": {p.name: f"<{p.name}>" for p in ep.params if p.required}}}
    row["http"] = f"{ep.method} {example_query(ep)}"
    return row


def with_pointer(registry: CatalogRegistry, exc: TregError, name: str) -> TregError:
    """``exc`` (a tool_not_found or endpoint_not_found for ``name``) pointing at the catalog: the search
    URL for the name's words in ``hint`` (after any hint it had), and ``did_you_mean`` extended with the
    best matches by words across providers (what it named first stays first)."""
    p = pointer(registry, name, exc.extra.get("did_you_mean") or ())
    exc.extra["did_you_mean"] = p["did_you_mean"]
    exc.extra["hint"] = f"{exc.extra['hint']}; or {p['hint']}" if exc.extra.get("hint") else p["hint"]
    return exc
