"""The consent flow's pages (docs/oauth.md): opened by a person without a treg login.

* ``GET /oauth/connect/<opaque>``: the page naming the org, the member who asked, the provider and the
  scopes, with one button (its form carries the page's token);
* ``POST /oauth/connect/<opaque>``: from that page only (a foreign ``Origin``/``Referer``, or no form
  token: a 403 page), it uses the link up and answers 302 to the provider's authorization URL, setting
  the ``treg_oauth_state`` cookie that binds the sign-in to this browser;
* ``GET /oauth/callback``: the provider sends the browser back here; the page says the connection is
  made (or 303 to ``redirect_after``), or why not.

Every refusal is a page with the refusal's status (never a redirect to the provider, never a 500); plain
Python below (treg/oauth/consent.py) decides.
"""

from __future__ import annotations

import logging
import urllib.parse
from typing import Any

import aiohttp_jinja2
from aiohttp import web

from treg.errors import Forbidden, TregError
from treg.keys import SERVICES, SETTINGS
from treg.oauth import consent, links
from treg.origin import normalized_origin, origin_of_url, own_base, own_origins
from treg.web.dashboard.base import SECURITY_HEADERS, cookie_kwargs, read_form

log = logging.getLogger("treg.web.oauth")

routes = web.RouteTableDef()


def _sockname(request: web.Request) -> Any:
    return request.transport.get_extra_info("sockname") if request.transport is not None else None


def _page(request: web.Request, template: str, http_status: int = 200, *, form_action: str | None = None,
          **context: Any) -> web.Response:
    context.update(ident=None, csrf="", nav=(), active="", flash=None, error=None)
    resp = aiohttp_jinja2.render_template(template, request, context, status=http_status)
    resp.headers.update(SECURITY_HEADERS)
    if form_action:
        # a form's redirect is checked against form-action too: the button's 302 goes to the provider
        resp.headers["Content-Security-Policy"] = SECURITY_HEADERS["Content-Security-Policy"].replace(
            "form-action 'self'", f"form-action 'self' {form_action}")
    return resp


def _refusal(request: web.Request, exc: TregError) -> web.Response:
    title = {403: "Not allowed", 404: "Link not found", 410: "Link expired"}.get(exc.status, "Not connected")
    return _page(request, "oauth_result.html", exc.status, ok=False, title=title, message=exc.detail,
                 error_code=exc.code, status=exc.status, ident_page=False)


def _unexpected(request: web.Request) -> web.Response:
    log.exception("oauth page %s failed", request.rel_url.path)
    return _page(request, "oauth_result.html", 500, ok=False, title="Something went wrong",
                 message="treg failed to finish this step; the log says why", error_code="internal_error", status=500,
                 ident_page=False)


@routes.get("/oauth/connect/{opaque}")
async def connect_page(request: web.Request) -> web.StreamResponse:
    svc = request.app[SERVICES]
    opaque = request.match_info["opaque"]
    try:
        page = await consent.open_link(svc, opaque)
    except TregError as exc:
        return _refusal(request, exc)
    except Exception:  # noqa: BLE001 (a page never answers a bare 500)
        return _unexpected(request)
    block = svc.catalog.providers[page.provider_id].oauth
    authorize_origin = normalized_origin(urllib.parse.urlsplit(block.authorize_url)._replace(
        path="", query="", fragment="").geturl()) if block is not None else None
    return _page(request, "oauth_consent.html", page=page, opaque=opaque, form_action=authorize_origin)


def _foreign(request: web.Request) -> bool:
    """A consent posted from another site (a page that auto-submits a link it got): its ``Origin`` (or,
    without one, its ``Referer``) is not treg's own. A client that sends neither is no browser (browsers
    send ``Origin`` on every cross-site POST), so no person's browser is being driven."""
    own = own_origins(request.app[SETTINGS], _sockname(request))
    sent_origin, referer = request.headers.get("Origin"), request.headers.get("Referer")
    if sent_origin is not None:
        return normalized_origin(sent_origin) not in own
    if referer is not None:
        return origin_of_url(referer) not in own
    return False


@routes.post("/oauth/connect/{opaque}")
async def press_button(request: web.Request) -> web.StreamResponse:
    svc = request.app[SERVICES]
    settings = request.app[SETTINGS]
    try:
        if _foreign(request):
            raise Forbidden("this consent was posted from another site; open the link yourself and press the button "
                            "on treg's own page", code="consent_form_invalid")
        form = await read_form(request)
        browser = links.well_formed(request.cookies.get(links.STATE_COOKIE)) or links.random_value()
        location = await consent.press_button(svc, request.match_info["opaque"], form.get("consent_token"), browser,
                                              own_base(settings, _sockname(request)))
    except TregError as exc:
        return _refusal(request, exc)
    except Exception:  # noqa: BLE001
        return _unexpected(request)
    resp = web.Response(status=302, headers={"Location": location, **SECURITY_HEADERS})
    flags = cookie_kwargs(request, settings.oauth_connect_ttl_s + 60, path="/oauth/")
    flags["samesite"] = "Lax"  # the provider's redirect back is a cross-site navigation: Strict would not send it
    resp.set_cookie(links.STATE_COOKIE, browser, **flags)
    return resp


@routes.get("/oauth/callback")
async def callback(request: web.Request) -> web.StreamResponse:
    svc = request.app[SERVICES]
    try:
        done = await consent.callback(svc, request.query, request.cookies.get(links.STATE_COOKIE))
    except TregError as exc:
        return _refusal(request, exc)
    except Exception:  # noqa: BLE001
        return _unexpected(request)
    if done.redirect_after:
        return web.Response(status=303, headers={"Location": done.redirect_after, **SECURITY_HEADERS})
    return _page(request, "oauth_result.html", ok=True, title=f"{done.provider_name} connected",
                 message=f"{done.provider_name} is connected (connection {done.connection_id}): the agent that "
                         "asked can retry its call now.", error_code="", status=200, ident_page=True)
