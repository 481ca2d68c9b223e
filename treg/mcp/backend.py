"""The tools of one MCP caller, run through the one call pipeline (:func:`treg.call.service.execute`).

A ``tools/call`` of an own tool or of ``catalog_call`` becomes a :class:`~treg.call.types.CallInput` with
``surface: "mcp"`` and goes through exactly what ``/call/`` and ``/catalog/call/`` go through (ACL,
deny rules, money, idempotency, audit, evidence). The answer's body is read here, bounded by
``TREG_MCP_MAX_TEXT_BYTES``, and the outcome's ``finish`` called exactly once, as the HTTP edge does
after streaming.
"""

from __future__ import annotations

import logging
from typing import Any

from treg.call import service
from treg.call.drain import Sink, drain
from treg.call.service import CallOutcome
from treg.catalog import search as catalog_search
from treg.context import Services
from treg.errors import TregError
from treg.hub import store as hub_store
from treg.hub.model import HubTool
from treg.ids import new_call_id
from treg.mcp import results
from treg.mcp.protocol import INVALID_PARAMS, RpcError
from treg.org_data import load_org_credentials, org_tools, usable
from treg.mcp.tools import (CATALOG_CALL, CATALOG_SEARCH, PARAM_HEADERS, CallerContext, catalog_call_tool,
                            catalog_input, catalog_search_tool, hub_names, mcp_names, named_input, own_tool_input,
                            tool_list)
from treg.identity import Identity

log = logging.getLogger(__name__)

INSTRUCTIONS = (
    "treg relays HTTP calls to third-party APIs and injects the credentials, so never send keys. To do "
    "something with an API you do not know: call catalog_search with what you want in words (or a "
    "capability such as weather.forecast), then catalog_call with a match's id and its params. The other "
    "tools are your org's own APIs and hub tools other orgs published (each names its price): give method, "
    "path, query and body. Every result names its call id, "
    "cost (micro-USD) and credential tier; a refusal comes as an error result with a hint and did_you_mean.")

_SEARCH_MAX = 50


class _Bounded(Sink):
    """The first ``limit`` bytes of an answer's body, and one more to know it was longer."""

    __slots__ = ("limit", "parts", "size", "truncated")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0
        self.truncated = False

    async def whole(self, data: bytes) -> None:
        self.truncated = len(data) > self.limit
        self.parts = [data[:self.limit + 1]]

    async def chunk(self, data: bytes) -> bool:
        self.parts.append(data)
        self.size += len(data)
        self.truncated = self.size > self.limit  # then the rest is not read: the connection is dropped
        return self.truncated


async def read_answer(outcome: CallOutcome, limit: int) -> tuple[results.Answer | None, TregError | None]:
    """The first ``limit`` bytes of the answer's body, drained as the HTTP edge drains it (the outcome
    closed and finished exactly once). An upstream breaking mid-answer comes back as its TregError."""
    sink = _Bounded(limit)
    size, error = await drain(outcome, sink)
    if isinstance(error, TregError):
        return None, error
    known = outcome.content_length if outcome.content_length is not None else (None if sink.truncated else size)
    return results.Answer(status=outcome.status, reason=outcome.reason, headers=outcome.headers,
                          data=b"".join(sink.parts), truncated=sink.truncated, size=known), None


class PipelineBackend:
    """``/mcp`` (own tools and the catalog) or ``/catalog/mcp`` (``catalog_only``) for one caller."""

    instructions = INSTRUCTIONS

    def __init__(self, svc: Services, ident: Identity, ctx: CallerContext, *, catalog_only: bool) -> None:
        self.svc = svc
        self.ident = ident
        self.ctx = ctx
        self.catalog_only = catalog_only

    async def _named(self) -> list[tuple[str, Any]]:
        if self.catalog_only:
            return []
        return mcp_names([t for t in await org_tools(self.svc, self.ident.org_id) if usable(self.ident, t)])

    async def _hubs(self, named: list[tuple[str, Any]]) -> list[tuple[str, HubTool]]:
        """Other orgs' published tools (the org's own are listed as its own tools already). A ref the
        pipeline resolves to something else first (a tool of the caller's org of that name, usable or not,
        or a catalog id: resolution's order, treg/call/resolve.py) is not listed: calling it would not reach
        the hub tool."""
        if self.catalog_only:
            return []
        own = (await org_tools(self.svc, self.ident.org_id)).by_name
        others = [h for h in (await hub_store.index(self.svc)).values()
                  if h.org_id != self.ident.org_id and h.ref not in own and h.ref not in self.svc.catalog.endpoints]
        return hub_names(others, [n for n, _ in named])

    def param_headers(self, name: str) -> dict[str, str]:
        return PARAM_HEADERS.get(name, {})

    async def list_tools(self) -> list[dict[str, Any]]:
        if self.catalog_only:
            return [catalog_search_tool(), catalog_call_tool()]
        named = await self._named()
        return tool_list(named, await self._hubs(named))

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        if name == CATALOG_SEARCH:
            return await self._search(arguments)
        call_id = new_call_id()
        if name == CATALOG_CALL:
            return await self._run(catalog_input(self.ctx, call_id, self.svc.catalog, arguments))
        tool = None
        if not self.catalog_only:
            named = await self._named()
            tool = dict(named).get(name)
            if tool is None:
                # a tool of the org the caller may not use is not listed, but calling it by its own name is
                # refused by the pipeline's ACL (403, audited), exactly as /call/<name> would be
                tool = (await org_tools(self.svc, self.ident.org_id)).by_name.get(name)
            if tool is None:
                hub = dict(await self._hubs(named)).get(name)
                if hub is not None:  # another org's published tool: /call/<ref>/…, a hub call
                    return await self._run(named_input(self.ctx, call_id, hub.ref, arguments))
        if tool is None:
            named = await self._named()
            listed = [n for n, _ in named] + [n for n, _ in await self._hubs(named)] + [CATALOG_SEARCH, CATALOG_CALL]
            pointer = catalog_search.pointer(self.svc.catalog, name)
            raise RpcError(INVALID_PARAMS, f"Unknown tool: {name!r}; tools/list names this endpoint's tools "
                                           f"({', '.join(listed)}); for an API of the catalog use catalog_search "
                                           "then catalog_call",
                           {"tools": listed, **pointer})
        return await self._run(own_tool_input(self.ctx, call_id, tool, arguments))

    async def _run(self, inp: Any) -> dict[str, Any]:
        try:
            outcome = await service.execute(self.svc, inp)
        except TregError as exc:
            return results.refusal_result(exc, call_id=inp.call_id)
        limit = self.svc.settings.mcp_max_text_bytes
        answer, broken = await read_answer(outcome, limit)
        if broken is not None:
            return results.refusal_result(broken, call_id=inp.call_id)
        assert answer is not None
        return results.answer_result(answer, call_id=inp.call_id, limit=limit,
                                     fallback_tier=None if inp.catalog_form else "tool")

    async def _search(self, args: dict[str, Any]) -> dict[str, Any]:
        extra = sorted(set(args) - {"query", "capability", "limit"})
        if extra:
            raise RpcError(INVALID_PARAMS, f"catalog_search: unknown argument(s) {', '.join(extra)}; the arguments "
                                           "are query, capability, limit")
        query, capability, limit = args.get("query"), args.get("capability"), args.get("limit", 10)
        for key, value in (("query", query), ("capability", capability)):
            if value is not None and not isinstance(value, str):
                raise RpcError(INVALID_PARAMS, f"catalog_search: {key} must be a string")
        if isinstance(limit, float) and limit.is_integer():
            limit = int(limit)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= _SEARCH_MAX:
            raise RpcError(INVALID_PARAMS, f"catalog_search: limit must be an integer from 1 to {_SEARCH_MAX}")
        registry = self.svc.catalog
        ranked = catalog_search.scored(registry, query, capability)[:limit]
        found = [ep for ep, _ in ranked]
        providers = {ep.provider for ep in found}
        for ep in found:
            if ep.capability:
                providers |= {alt.provider for alt in registry.with_capability(ep.capability)}
        creds = await load_org_credentials(self.svc, self.ident, providers)
        rows = [catalog_search.describe(registry, ep, creds, self.svc.settings) for ep in found]
        # as good a match, what the caller can call now comes first (sorted is stable: the rank stays)
        order = {id(row): (-matched, not row["callable"]) for row, (_, matched) in zip(rows, ranked)}
        rows.sort(key=lambda row: order[id(row)])
        out: dict[str, Any] = {
            "query": query, "capability": capability, "endpoints": rows,
            "search_url": catalog_search.search_url(" ".join(filter(None, (query, capability)))),
        }
        if not found:
            out.update(catalog_search.no_match(registry))
        elif not (query or capability):
            out["capabilities"] = sorted(registry.capabilities)
        return results.search_result(out)
