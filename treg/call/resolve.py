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

Both are scoped to the caller's org. A named miss is offered to the catalog (when one is loaded)
before the 404.
"""

from __future__ import annotations

import re
from typing import Any, Awaitable, Callable, Iterable
from urllib.parse import unquote

from sqlalchemy import and_, select
from yarl import URL

from treg.bindings import Binding
from treg.call.target import DialKey, dial_key, parse_passthrough
from treg.call.types import CallInput, ResolvedTarget, ToolRef, split_query
from treg.catalog.search import with_pointer
from treg.context import Services
from treg.domain.access import tool_usable
from treg.errors import BadRequest, Conflict, Forbidden, NotFound, TregError
from treg.infra.schema import secrets, tools
from treg.tenancy import Identity

_PASSTHROUGH = re.compile(r"^(https?):/+(.*)$", re.I | re.S)

#: the catalog half on a named miss: ``async (svc, ident, inp, name, path) -> (inp, target) | None``
CatalogFallback = Callable[[Services, Identity, CallInput, str, str | None],
                           Awaitable["tuple[CallInput, ResolvedTarget] | None"]]
#: the final dotted lookup once every shape missed: ``(svc, name) -> TregError | None``
FinalMiss = Callable[[Services, str], "TregError | None"]


class OrgTools(tuple):  # type: ignore[type-arg]
    """An org's tools (a tuple of :class:`ToolRef`), with an index by name built once per load: a named
    call then costs one dict lookup however many tools the org has."""

    by_name: dict[str, ToolRef]
    #: passthrough candidates by the (scheme, host, port) their base URL dials
    by_dial: dict[DialKey, list[tuple[ToolRef, str]]]

    def __new__(cls, items: Iterable[ToolRef]) -> "OrgTools":
        self = super().__new__(cls, items)
        self.by_name = {}
        for tool in self:
            self.by_name.setdefault(tool.name, tool)  # the first of a name, as a scan would find
        self.by_dial = _by_dial(self)
        return self


def cached_org_tools(svc: Services, org_id: str) -> OrgTools | None:
    """The org's tools when the cache has them (no coroutine on the hot path), else None."""
    cache = svc.extras.get("tools_cache")
    return cache.get(("tools", org_id)) if cache is not None else None


async def org_tools(svc: Services, org_id: str) -> OrgTools:
    """Every tool of an org (cached; invalidated by LISTEN/NOTIFY on any tool or secret change)."""
    cache = svc.extras.get("tools_cache")

    async def load() -> OrgTools:
        async with svc.db.tx() as tx:
            rows = await tx.fetch_all(select(tools).where(tools.c.org_id == org_id))
            provider_secrets = {r["id"] for r in await tx.fetch_all(
                select(secrets.c.id).where(and_(secrets.c.org_id == org_id, secrets.c.provider.isnot(None))))}
        out = []
        for r in rows:
            bindings = tuple(Binding.from_json(b) for b in r["bindings"])
            out.append(ToolRef(id=r["id"], org_id=org_id, name=r["name"], base_url=r["base_url"], host=r["host"],
                               bindings=bindings, project_id=r["project_id"],
                               allowed_member_ids=tuple(r["allowed_member_ids"])
                               if r["allowed_member_ids"] is not None else None,
                               provider_backed=any(b.secret_id in provider_secrets for b in bindings)))
        return OrgTools(out)

    if cache is None:
        return await load()
    return cache.get(("tools", org_id)) or await cache.get_or_load(("tools", org_id), org_id, load)


def usable(ident: Identity, tool: ToolRef) -> bool:
    return tool_usable(role=ident.role, member_id=ident.member_id, member_projects=ident.project_ids,
                       tool_project_id=tool.project_id, allowed_member_ids=tool.allowed_member_ids)


def named_target(tool: ToolRef, path: str | None, raw_query: str) -> ResolvedTarget:
    if path is None:
        upstream = tool.base  # a tool pinned to a full resource relays as-is (no trailing slash)
    else:
        upstream = tool.base_slash + path
    query = tool.base_query + tuple(split_query(raw_query)) if raw_query else tool.base_query
    return ResolvedTarget(upstream_url=upstream, query=query, tool=tool, bindings=tool.bindings, provider=tool.host,
                          credential_tier="tool")


def prefix_matches(norm: str, base: str) -> bool:
    """Segment-boundary prefix: .../v1 matches .../v1 and .../v1/x, never .../v10/x."""
    return norm == base or norm.startswith(base + "/")


def _by_dial(tools_: Iterable[ToolRef]) -> dict[DialKey, list[tuple[ToolRef, str]]]:
    """The tools by the (scheme, host, port) their base URL dials, each with its path (no trailing
    ``/``): parsed by the same rules as a passthrough target, so both sides of the match are one parse.
    A base URL yarl cannot parse cannot be dialled either: it serves no passthrough."""
    out: dict[DialKey, list[tuple[ToolRef, str]]] = {}
    for tool in tools_:
        try:
            url = URL(tool.base, encoded=True)
            key = dial_key(url)
        except (ValueError, TypeError):
            continue
        out.setdefault(key, []).append((tool, url.raw_path.rstrip("/")))
    return out


def passthrough_target(ident: Identity, all_tools: tuple[ToolRef, ...], scheme: str, remainder: str,
                       raw_query: str) -> ResolvedTarget:
    url = parse_passthrough(scheme, remainder)  # refuses an ambiguous target before any tool is looked at
    key = dial_key(url)
    index = all_tools.by_dial if isinstance(all_tools, OrgTools) else _by_dial(all_tools)
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
                           candidates=[{"name": t.name, "id": t.id, "base_url": t.base_url} for t in best],
                           hint=f"/call/{names[0]}/<path>")
    tool = best[0]
    # the text as the caller wrote it (validated: re-parsing it yields ``key`` again; the relay checks)
    return ResolvedTarget(upstream_url=f"{scheme}://{remainder}", query=tuple(split_query(raw_query)), tool=tool,
                          bindings=tool.bindings, provider=tool.host, credential_tier="tool", dial=key)


def parse_rest(rest: str) -> tuple[str, Any, Any]:
    """("url", scheme, remainder) or ("named", name, path|None)."""
    if rest[:4].lower() == "http":  # the regex only where a URL could start (a named call skips it)
        m = _PASSTHROUGH.match(rest)
        if m:
            return "url", m.group(1).lower(), m.group(2)
    name, sep, path = rest.partition("/")
    return "named", unquote(name), (path if sep else None)


async def resolve(svc: Services, ident: Identity, inp: CallInput, catalog_fallback: CatalogFallback | None = None,
                  final_miss: FinalMiss | None = None) -> tuple[CallInput, ResolvedTarget]:
    """The target of ``/call/<rest>`` (the input comes back too: the catalog may have buffered its body)."""
    rest = inp.rest
    if "\r" in rest or "\n" in rest or "\0" in rest:  # three scans in C, cheaper than the regex engine
        raise BadRequest("the call target contains control characters", code="invalid_target")
    if not rest:
        raise BadRequest("name a tool: /call/<tool>/<path> or /call/https://host/path", code="invalid_target")
    shape, a, b = parse_rest(rest)
    all_tools = cached_org_tools(svc, ident.org_id) or await org_tools(svc, ident.org_id)
    if shape == "url":
        try:
            return inp, passthrough_target(ident, all_tools, a, b, inp.raw_query)
        except NotFound as exc:  # no tool serves that URL: point at the catalog (its host and path's words)
            raise with_pointer(svc.catalog, exc, b.partition("?")[0]) from None
    name, path = a, b
    tool = all_tools.by_name.get(name)
    if tool is not None:
        return inp, named_target(tool, path, inp.raw_query)
    if catalog_fallback is not None:
        found = await catalog_fallback(svc, ident, inp, name, path)
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
