"""An org's tools as the call pipeline reads them: loaded once per cache entry, indexed by name and by
the (scheme, host, port) their base URL dials, each with its injection plan compiled
(:mod:`treg.call.injection`). Shared by the resolve stage and its catalog half."""

from __future__ import annotations

from typing import Iterable

from sqlalchemy import and_, select
from yarl import URL

from treg.bindings import Binding
from treg.call.injection import compile_plan
from treg.call.target import DialKey, dial_key
from treg.call.types import ToolRef
from treg.context import Services
from treg import tool_urls
from treg.domain.access import tool_usable
from treg.identity import Identity
from treg.infra.schema import secrets, tools


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
        self.by_dial = by_dial(self)
        return self


def cached_org_tools(svc: Services, org_id: str) -> OrgTools | None:
    """The org's tools when the cache has them (no coroutine on the hot path), else None."""
    return svc.caches.tools.get(("tools", org_id))


async def org_tools(svc: Services, org_id: str) -> OrgTools:
    """Every tool of an org (cached; invalidated by LISTEN/NOTIFY on any tool or secret change)."""
    cache = svc.caches.tools

    async def load() -> OrgTools:
        async with svc.db.tx() as tx:
            rows = await tx.fetch_all(select(tools).where(tools.c.org_id == org_id))
            provider_secrets = {r["id"] for r in await tx.fetch_all(
                select(secrets.c.id).where(and_(secrets.c.org_id == org_id, secrets.c.provider.isnot(None))))}
        out = []
        for r in rows:
            bindings = tuple(Binding.from_json(b) for b in r["bindings"])
            base_url = tool_urls.unseal(svc, org_id, r["id"], r["base_url"], r["base_url_sealed"])
            out.append(ToolRef(id=r["id"], org_id=org_id, name=r["name"], base_url=base_url, host=r["host"],
                               bindings=bindings, project_id=r["project_id"],
                               allowed_member_ids=tuple(r["allowed_member_ids"])
                               if r["allowed_member_ids"] is not None else None,
                               provider_backed=any(b.secret_id in provider_secrets for b in bindings),
                               plan=compile_plan(svc.injectors, bindings)))
        return OrgTools(out)

    return cache.get(("tools", org_id)) or await cache.get_or_load(("tools", org_id), org_id, load)


def usable(ident: Identity, tool: ToolRef) -> bool:
    return tool_usable(role=ident.role, member_id=ident.member_id, member_projects=ident.project_ids,
                       tool_project_id=tool.project_id, allowed_member_ids=tool.allowed_member_ids)


def by_dial(tools_: Iterable[ToolRef]) -> dict[DialKey, list[tuple[ToolRef, str]]]:
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
