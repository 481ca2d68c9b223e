"""The dashboard's **Connections** page (docs/dashboard.md, docs/oauth.md): the OAuth connections the viewer
may see, each pending one with its connect link; **Connect** creates one and sends the browser to its
consent page; **Refresh** and **Revoke** act on one (its creator, an owner or an admin). The same
functions as ``/api/v1/connections``."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from treg.errors import TregError
from treg.keys import SETTINGS
from treg.oauth import manage, store
from treg.origin import own_base, own_origins
from treg.web.dashboard.base import Page, field_error, finish, page, see_other

routes = web.RouteTableDef()


def _sockname(p: Page) -> Any:
    return p.request.transport.get_extra_info("sockname") if p.request.transport is not None else None


def _base(p: Page) -> str:
    return own_base(p.request.app[SETTINGS], _sockname(p))


async def _connections_page(p: Page, *, status: int = 200, errors: dict[str, str] | None = None) -> web.StreamResponse:
    rows = await store.list_connections(p.svc, p.ident, _base(p))
    providers = sorted((pr for pr in p.svc.catalog.providers.values() if pr.oauth is not None), key=lambda pr: pr.id)
    for row in rows:
        row["manageable"] = store.may_manage(p.ident, row)
    return p.render("connections.html", "connections", status=status, connections=rows, providers=providers,
                    errors=errors or {})


@routes.get("/ui/connections")
@page
async def connections_list(p: Page) -> web.StreamResponse:
    return await _connections_page(p)


@routes.post("/ui/connections")
@page
async def connections_create(p: Page) -> web.StreamResponse:
    """Connect: a new connection, and the browser sent to its consent page (back here once connected)."""
    base = _base(p)
    body: dict[str, Any] = {"provider": p.form.get("provider", ""), "redirect_after": f"{base}/ui/connections"}
    if p.form.get("name", "").strip():
        body["name"] = p.form["name"].strip()
    if p.form.get("scopes", "").strip():
        body["scopes"] = p.form["scopes"].split()
    if p.form.get("shared"):
        body["shared"] = True
    try:
        created = await store.create_connection(p.svc, p.ident, body, base=base,
                                                own=own_origins(p.request.app[SETTINGS], _sockname(p)))
    except TregError as exc:
        return await _connections_page(p, status=exc.status, errors=field_error(exc, {
            "provider": ("oauth_provider_unknown", "oauth_app_missing"), "name": ("invalid_name",),
            "scopes": ("invalid_scopes",), "shared": ("forbidden_role",)}))
    return finish(web.Response(status=303, headers={"Location": created["connect_url"]}))


@routes.post("/ui/connections/{connection_id}/refresh")
@page
async def connections_refresh(p: Page) -> web.StreamResponse:
    cid = p.request.match_info["connection_id"]
    try:
        await manage.refresh_connection(p.svc, p.ident, cid, _base(p))
    except TregError as exc:
        return await _connections_page(p, status=exc.status, errors={"_form": exc.detail})
    return see_other(p.request, "/ui/connections", done=f"Connection {cid} refreshed.")


@routes.post("/ui/connections/{connection_id}/delete")
@page
async def connections_delete(p: Page) -> web.StreamResponse:
    cid = p.request.match_info["connection_id"]
    await manage.delete_connection(p.svc, p.ident, cid)
    return see_other(p.request, "/ui/connections", done=f"Connection {cid} revoked and deleted.")
