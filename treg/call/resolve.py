"""Resolve stage: which upstream a call goes to, through which tool.

Two shapes (the seed's "Tool resolution"):

* named: ``/call/<tool>/<path>`` → the org's tool of that name; upstream = base URL + ``/<path>``
  (no path: the base URL itself, no trailing slash added);
* URL passthrough: ``/call/https://host/path`` → parsed once by the rules of the connection that will
  send it (:mod:`treg.call.target`; an ambiguous host is a 400 before any tool is looked at), then the
  org's tools dialling the same (scheme, host, port), filtered by what the caller may use, then the
  longest base-URL path prefix on a path-segment boundary. A tie prefers the one provider-backed tool;
  otherwise 409 naming the colliding tools. Candidates removed only by the ACL give 403 naming just
  the host.

Both are scoped to the caller's org. A named miss is offered to the catalog (when one is loaded),
then, for a top-level call, to the hub (another org's published tool ``<org-slug>.<name>``), before the
404.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable

from treg import tool_urls
from treg.call import catalog_stage, demo, hub_stage, redirects, table
from treg.call.state import CallState
from treg.call.target import parse_passthrough, parse_rest
from treg.call.types import ResolvedTarget
from treg.catalog.search import with_pointer
from treg.context import Services
from treg.errors import BadRequest, Conflict, Forbidden, NotFound, TregError
from treg.identity import Identity
from treg.infra.upstream import dial_key
from treg.org_data import OrgTools, ToolRef, by_dial, cached_org_tools, org_tools, usable
from treg.query import split_query

__all__ = ["parse_rest", "resolve", "resolve_target"]

#: the catalog half on a named miss: ``async (svc, ident, state, name, path) -> target | None``
CatalogFallback = Callable[[Services, Identity, CallState, str, str | None], Awaitable["ResolvedTarget | None"]]
#: the final dotted lookup once every shape missed: ``(svc, name) -> TregError | None``
FinalMiss = Callable[[Services, str], "TregError | None"]


def named_target(tool: ToolRef, path: str | None, raw_query: str) -> ResolvedTarget:
    if path is None:
        upstream = tool.base  # a tool pinned to a full resource relays as-is (no trailing slash)
    else:
        upstream = tool.base_slash + path
    query = tool.base_query + tuple(split_query(raw_query)) if raw_query else tool.base_query
    # positional where ResolvedTarget's order allows (every call builds one: keyword matching costs)
    return ResolvedTarget(upstream, query, tool, tool.bindings, tool.host, "tool", plan=tool.plan)


def prefix_matches(norm: str, base: str) -> bool:
    """Segment-boundary prefix: .../v1 matches .../v1 and .../v1/x, never .../v10/x."""
    return norm == base or norm.startswith(base + "/")


def passthrough_target(ident: Identity, all_tools: tuple[ToolRef, ...], scheme: str, remainder: str,
                       raw_query: str) -> ResolvedTarget:
    url = parse_passthrough(scheme, remainder)  # refuses an ambiguous target before any tool is looked at
    key = dial_key(url)
    index = all_tools.by_dial if isinstance(all_tools, OrgTools) else by_dial(all_tools)
    path = url.raw_path.rstrip("/")
    matching = [(t, base) for t, base in index.get(key, ()) if prefix_matches(path, base)]
    allowed = [(t, base) for t, base in matching if usable(ident, t)]
    host = url.raw_authority.lower()
    if not allowed:
        if matching:
            raise Forbidden(f"you may not use the tools of this org for {host}", code="tool_forbidden",
                            refused_by="acl")
        first = path.lstrip("/").split("/")[0]
        raise NotFound(f"no tool of this org serves {scheme}://{host}/{first}; "
                       "register one with POST /api/v1/tools", code="tool_not_found")
    longest = max(len(base) for _, base in allowed)
    best = [t for t, base in allowed if len(base) == longest]
    if len(best) > 1:
        backed = [t for t in best if t.provider_backed]
        if len(backed) == 1:
            best = backed
        else:
            names = sorted(t.name for t in best)
            raise Conflict(f"{len(best)} tools serve this URL equally well: {', '.join(names)}; "
                           f"call one by name: /call/{names[0]}/<path>", code="ambiguous_tool",
                           candidates=[{"name": t.name, "id": t.id, "base_url": tool_urls.masked(t.base_url)}
                                       for t in best],
                           hint=f"/call/{names[0]}/<path>")
    tool = best[0]
    # the text as the caller wrote it (validated: re-parsing it yields ``key`` again; the relay checks)
    return ResolvedTarget(upstream_url=f"{scheme}://{remainder}", query=tuple(split_query(raw_query)), tool=tool,
                          bindings=tool.bindings, provider=tool.host, credential_tier="tool", dial=key,
                          plan=tool.plan)


async def resolve(svc: Services, ident: Identity, state: CallState, catalog_fallback: CatalogFallback | None = None,
                  final_miss: FinalMiss | None = None) -> ResolvedTarget:
    """The target of ``/call/<rest>`` (the catalog may read the call's body into ``state.inp``)."""
    inp = state.inp
    rest = inp.rest
    if "\r" in rest or "\n" in rest or "\0" in rest:  # three scans in C, cheaper than the regex engine
        raise BadRequest("the call target contains control characters", code="invalid_target")
    if not rest:
        raise BadRequest("name a tool: /call/<tool>/<path> or /call/https://host/path", code="invalid_target")
    shape, a, b = parse_rest(rest)
    all_tools = cached_org_tools(svc, ident.org_id) or await org_tools(svc, ident.org_id)
    if shape == "url":
        try:
            return passthrough_target(ident, all_tools, a, b, inp.raw_query)
        except NotFound as exc:  # no tool serves that URL: point at the catalog (its host and path's words)
            raise with_pointer(svc.catalog, exc, b.partition("?")[0]) from None
    name, path = a, b
    tool = all_tools.by_name.get(name)
    if tool is not None:
        return named_target(tool, path, inp.raw_query)
    if catalog_fallback is not None:
        found = await catalog_fallback(svc, ident, state, name, path)
        if found is not None:
            return found
    hint = _near_tool_hint(ident, all_tools, name)
    err = final_miss(svc, name) if final_miss is not None else None
    # catalog near-id matching is provider-local and wins for genuine misspellings; then the hint at
    # a connected tool sharing the first segment; then a catalog-shaped 404
    if err is not None and (err.extra.get("did_you_mean") or not hint):
        raise with_pointer(svc.catalog, err, name)
    raise with_pointer(svc.catalog, NotFound(f"no tool named {name!r} in this org", code="tool_not_found", **hint),
                       name)


def _near_tool_hint(ident: Identity, all_tools: tuple[ToolRef, ...], name: str) -> dict[str, Any]:
    """A dotted operation name sharing its first segment with a usable tool points at that tool."""
    first = name.split(".", 1)[0]
    if "." in name:
        for tool in all_tools:
            if tool.name == first and usable(ident, tool):
                return {"hint": f"{first} is a tool of this org: call /call/{first}/<path>",
                        "did_you_mean": [f"/call/{first}/<path>"]}
    return {}


async def resolve_target(svc: Services, ident: Identity, state: CallState) -> ResolvedTarget:
    """The resolve stage: the target by the surface the call came in on (the catalog may read the call's
    body into ``state.inp``; a redirect hop's input becomes its grant's)."""
    inp = state.inp
    if ident.is_demo:  # a public demo's token: a listed endpoint by its exact id, nothing else (demo.py)
        demo.screen(svc, inp)
    table.check_endpoint(svc, inp)  # /table/ of an endpoint that declares no rows: refused before anything
    if inp.catalog_form or ident.is_demo:  # (a demo's /call/<id> too: never an org tool)
        return await catalog_stage.resolve_catalog_surface(svc, ident, state)
    if inp.surface == "redirect":
        state.inp, target = redirects.redirect_target(svc, ident, inp)
        return target
    return await resolve(svc, ident, state, named_miss, catalog_stage.final_miss)


async def named_miss(svc: Services, ident: Identity, state: CallState, name: str,
                     path: str | None) -> ResolvedTarget | None:
    """``/call/<name>`` found no org tool: a catalog id, else (a top-level call only) a hub ref
    ``<org-slug>.<name>`` of a published tool (treg/call/hub_stage.py); None: the 404."""
    found = await catalog_stage.named_miss(svc, ident, state, name, path)
    if found is None and (hub := await hub_stage.published(svc, state.inp, name)) is not None:
        published, tool = hub
        return hub_stage.target(ident, state.inp, published, named_target(tool, path, state.inp.raw_query))
    return found
