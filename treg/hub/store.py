"""Publishing, listing and unpublishing hub tools, and the index of refs the resolver reads.

The management functions take ``(svc, ident, …)`` like every other (treg/tools.py): the API
(``/api/v1/hub/tools``), the dashboard's Hub page and MCP's ``tools/list`` call the same ones.

* **publish** (owner or admin): one of the org's own tools under a name; its ref ``<org-slug>.<name>``
  must not be a catalog endpoint id (the catalog always wins a name, so the ref could never be called:
  409 ``hub_ref_taken``), nor a ref the org published already. The publishing org's account row is
  created here (``ensure_account``): a call's settlement credits it in the statement that closes the
  caller's hold, which updates that row and would find none otherwise.
* **list** (any member of any org): every published tool, with what a caller needs to decide (ref,
  description, price, max runs) and nothing of the publisher's setup: never the base URL, secrets,
  bindings, nor (for another org's tool) its tool id.
* **unpublish** (owner or admin of the publishing org): the ref is gone at once (404 ``tool_not_found``
  for the next call); deleting the tool unpublishes it too (foreign key).

The index (every ref → :class:`HubTool`) is one cached entry in the tools cache, tagged
:data:`HUB_TAG`: a publish or unpublish NOTIFYs ``hub:*hub`` and every process drops it, as an org's
change drops that org's entries (docs/architecture.md "Caches and LISTEN/NOTIFY").
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, delete, insert, select

from treg.context import Services
from treg.errors import BadRequest, Conflict, IntegrityError, NotFound
from treg.hub.model import HubTool, check_description, check_max_runs, check_name, check_price, ref_of
from treg.identity import Identity, require_manager
from treg.ids import new_id
from treg.infra.schema import hub_tools, orgs, tools
from treg.management import refuse_unknown_fields
from treg.money.ledger import ensure_account
from treg.org_changes import changes

#: the cache tag of the hub's index (no org id can be: ids are ``org_…``)
HUB_TAG = "*hub"
_INDEX_KEY = ("hub", HUB_TAG)
PUBLISH_FIELDS = ("tool_id", "name", "description", "price_micro", "max_runs")

_COLUMNS = (hub_tools.c.id, hub_tools.c.org_id, orgs.c.slug.label("org_slug"), hub_tools.c.name,
            hub_tools.c.tool_id, hub_tools.c.description, hub_tools.c.price_micro, hub_tools.c.max_runs,
            hub_tools.c.created_at)
_FROM = hub_tools.join(orgs, orgs.c.id == hub_tools.c.org_id)


def _json(row: dict[str, Any], viewer_org_id: str) -> dict[str, Any]:
    out = {"id": row["id"], "ref": ref_of(row["org_slug"], row["name"]), "org_slug": row["org_slug"],
           "name": row["name"], "description": row["description"], "price_micro": row["price_micro"],
           "max_runs": row["max_runs"], "created_at": row["created_at"], "own": row["org_id"] == viewer_org_id}
    if out["own"]:
        out["tool_id"] = row["tool_id"]  # the publisher's own id, for its own listing only
    return out


async def publish(svc: Services, ident: Identity, body: dict[str, Any]) -> dict[str, Any]:
    require_manager(ident)
    refuse_unknown_fields(body, PUBLISH_FIELDS, "a hub tool")
    tool_id = body.get("tool_id")
    if not isinstance(tool_id, str) or not tool_id:
        raise BadRequest("tool_id must name one of this org's tools (GET /api/v1/tools)", code="invalid_tool_id")
    name, description = check_name(body.get("name")), check_description(body.get("description"))
    price, max_runs = check_price(body.get("price_micro")), check_max_runs(body.get("max_runs"))
    ref = ref_of(ident.org_slug, name)
    if svc.catalog.get(ref) is not None:
        raise Conflict(f"{ref} is a catalog endpoint id: the catalog always wins a name, so this ref could never "
                       "be called; publish it under another name", code="hub_ref_taken", ref=ref)
    hub_id = new_id("hub")
    try:
        async with changes(svc, "hub", HUB_TAG) as tx:
            found = await tx.scalar(select(tools.c.id).where(and_(tools.c.id == tool_id,
                                                                  tools.c.org_id == ident.org_id)))
            if found is None:
                raise NotFound(f"no tool {tool_id!r} in this org", code="tool_not_found")
            await tx.execute(insert(hub_tools).values(id=hub_id, org_id=ident.org_id, tool_id=tool_id, name=name,
                                                      description=description, price_micro=price, max_runs=max_runs,
                                                      created_by=ident.member_id))
            # the account a settled call credits: it must exist before the first call settles
            await ensure_account(tx, ident.org_id, svc.settings.trial_micro)
            row = await tx.fetch_one(select(*_COLUMNS).select_from(_FROM).where(hub_tools.c.id == hub_id))
    except IntegrityError as exc:
        if exc.constraint == "uq_hub_tools_org_id_name":
            raise Conflict(f"this org already published {ref}", code="hub_ref_taken", ref=ref) from exc
        raise
    assert row is not None
    return _json(row, ident.org_id)


async def list_published(svc: Services, ident: Identity) -> list[dict[str, Any]]:
    """Every published tool of every org, by ref (any member may read it)."""
    async with svc.db.tx() as tx:
        rows = await tx.fetch_all(select(*_COLUMNS).select_from(_FROM).order_by(orgs.c.slug, hub_tools.c.name))
    return [_json(r, ident.org_id) for r in rows]


async def unpublish(svc: Services, ident: Identity, hub_id: str) -> None:
    require_manager(ident)
    async with changes(svc, "hub", HUB_TAG) as tx:
        gone = await tx.execute(delete(hub_tools).where(and_(hub_tools.c.id == hub_id,
                                                             hub_tools.c.org_id == ident.org_id)))
    if not gone:
        raise NotFound("no hub tool with that id published by this org", code="hub_tool_not_found")


async def index(svc: Services) -> dict[str, HubTool]:
    """Every published tool by ref (cached: one dict lookup per hub call on a warm cache)."""
    cache = svc.caches.tools
    hit = cache.get(_INDEX_KEY)
    if hit is not None:
        return hit  # type: ignore[no-any-return]

    async def load() -> dict[str, HubTool]:
        async with svc.db.tx() as tx:
            rows = await tx.fetch_all(select(*_COLUMNS).select_from(_FROM))
        found = (HubTool(r["id"], r["org_id"], r["org_slug"], r["name"], r["tool_id"], r["description"],
                         r["price_micro"], r["max_runs"]) for r in rows)
        return {t.ref: t for t in found}

    return await cache.get_or_load(_INDEX_KEY, HUB_TAG, load)  # type: ignore[no-any-return]


async def lookup(svc: Services, ref: str) -> HubTool | None:
    """The published tool ``ref`` names, or None (a name with no dot is never a ref)."""
    if "." not in ref:
        return None
    return (await index(svc)).get(ref)
