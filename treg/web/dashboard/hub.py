"""The dashboard's **Hub** page (docs/dashboard.md, docs/sharing.md "Hub"): every tool published on this
treg, by any org (its ref, description, price and max runs: what a caller needs, never a base URL or a
credential); an owner or admin publishes one of the org's tools under a name and a price, and
unpublishes its own. The same functions as ``/api/v1/hub/tools``."""

from __future__ import annotations

from aiohttp import web

from treg import tools
from treg.errors import TregError
from treg.hub import store
from treg.web.dashboard.base import Page, field_error, form_int, page, see_other

routes = web.RouteTableDef()

#: which form field a refusal is shown under, by its code
FIELDS = {"tool_id": ("tool_not_found", "invalid_tool_id"), "name": ("invalid_name", "hub_ref_taken"),
          "description": ("invalid_description",), "price_micro": ("invalid_price",),
          "max_runs": ("invalid_max_runs",)}


async def _hub_page(p: Page, *, status: int = 200, errors: dict[str, str] | None = None) -> web.StreamResponse:
    published = await store.list_published(p.svc, p.ident)
    own_tools = await tools.list_tools(p.svc, p.ident) if p.ident.is_manager else []
    return p.render("hub.html", "hub", status=status, published=published, own_tools=own_tools,
                    errors=errors or {})


@routes.get("/ui/hub")
@page
async def hub_list(p: Page) -> web.StreamResponse:
    return await _hub_page(p)


@routes.post("/ui/hub")
@page
async def hub_publish(p: Page) -> web.StreamResponse:
    body = {"tool_id": p.form.get("tool_id", ""), "name": p.form.get("name", "").strip(),
            "description": p.form.get("description", ""),
            "price_micro": form_int(p.form.get("price_micro", "")) or 0,
            "max_runs": form_int(p.form.get("max_runs", ""))}
    try:
        created = await store.publish(p.svc, p.ident, body)
    except TregError as exc:
        return await _hub_page(p, status=exc.status, errors=field_error(exc, FIELDS))
    return see_other(p.request, "/ui/hub", done=f"Published {created['ref']}.")


@routes.post("/ui/hub/{hub_tool_id}/delete")
@page
async def hub_unpublish(p: Page) -> web.StreamResponse:
    await store.unpublish(p.svc, p.ident, p.request.match_info["hub_tool_id"])
    return see_other(p.request, "/ui/hub", done="Unpublished.")
