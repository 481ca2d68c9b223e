"""What every dashboard page shares: the session from the cookie, CSRF on every POST, forms read
within a limit, rendering (and a refusal re-rendered on its page, never a 500), and treg's own URLs:
every path handed to a browser (links, form actions, redirects, the cookie's Path) starts with
``TREG_PUBLIC_URL``'s path prefix (treg/origin.py), since a proxy serving treg under ``/treg/`` strips
it before treg sees the request."""

from __future__ import annotations

import logging
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import aiohttp_jinja2
from aiohttp import web

from treg import ui_sessions
from treg.context import Services
from treg.errors import BadRequest, TregError
from treg.identity import Identity
from treg.keys import SERVICES, SETTINGS
from treg.origin import path_prefix, public_https
from treg.settings import Settings
from treg.ui_sessions import COOKIE, Session
from treg.web import forwarded
from treg.web.jsonio import read_body

log = logging.getLogger("treg.web.dashboard")

STATIC_FILES = {"treg.css": "text/css", "tryit.js": "application/javascript"}
FORM_MAX_BYTES = 256 * 1024

#: every dashboard answer: nothing from another origin, never framed, never cached
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Frame-Options": "DENY", "Referrer-Policy": "same-origin", "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}

NAV = (("overview", "/ui/", "Overview"), ("tools", "/ui/tools", "Tools"), ("secrets", "/ui/secrets", "Secrets"),
       ("connections", "/ui/connections", "Connections"), ("hub", "/ui/hub", "Hub"),
       ("members", "/ui/members", "Members and tokens"), ("deny", "/ui/deny-rules", "Deny rules"),
       ("activity", "/ui/activity", "Activity"), ("catalog", "/ui/catalog", "Catalog"),
       ("capacity", "/ui/capacity", "Capacity"), ("org", "/ui/org", "Org"), ("try", "/ui/try", "Try it"))


@dataclass(frozen=True)
class Page:
    """One request of a logged-in user: the services, the session, and the form of a POST."""

    request: web.Request
    svc: Services
    session: Session
    form: dict[str, str] = field(default_factory=dict)

    @property
    def ident(self) -> Identity:
        return self.session.identity

    def render(self, template: str, nav: str, status: int = 200, **context: Any) -> web.Response:
        context.update(ident=self.ident, csrf=self.session.csrf, nav=NAV, active=nav,
                       flash=self.request.query.get("done"))
        context.setdefault("error", None)
        context.setdefault("form", self.form)
        return finish(aiohttp_jinja2.render_template(template, self.request, context, status=status))


def finish(resp: web.StreamResponse) -> web.StreamResponse:
    resp.headers.update(SECURITY_HEADERS)
    return resp


def root(request: web.Request) -> str:
    """The path prefix of every URL treg hands a browser (``""`` without one)."""
    return path_prefix(request.app[SETTINGS])


def see_other(request: web.Request, location: str, done: str | None = None) -> web.Response:
    """Post/redirect/get: a reload never repeats the form; ``done`` is the page's one-line confirmation.
    ``location`` is a dashboard path as treg routes it (``/ui/tools``); the answer carries the prefix."""
    if done:
        location += ("&" if "?" in location else "?") + urllib.parse.urlencode({"done": done})
    return finish(web.Response(status=303, headers={"Location": root(request) + location}))  # type: ignore[return-value]


async def read_form(request: web.Request) -> dict[str, str]:
    """A url-encoded form, read whole up to its limit (however it arrives); the first value of each name."""
    ctype = request.content_type
    if ctype not in ("application/x-www-form-urlencoded", "application/octet-stream", ""):
        raise BadRequest("the dashboard takes url-encoded forms", code="invalid_form")
    raw = await read_body(request, FORM_MAX_BYTES)
    try:
        pairs = urllib.parse.parse_qsl(raw.decode("utf-8"), keep_blank_values=True, strict_parsing=False,
                                       max_num_fields=500)
    except (UnicodeDecodeError, ValueError) as exc:
        raise BadRequest("the form is not valid UTF-8 url-encoded text", code="invalid_form") from exc
    out: dict[str, str] = {}
    for k, v in pairs:
        if "\x00" in v or "\x00" in k:  # PostgreSQL refuses NUL in text: a 400 here, not a 500 there
            raise BadRequest("a form field holds a NUL character", code="invalid_form")
        out.setdefault(k, v)
    return out


async def current_session(request: web.Request) -> Session | None:
    return await ui_sessions.lookup(request.app[SERVICES], request.cookies.get(COOKIE))


PageHandler = Callable[[Page], Awaitable[web.StreamResponse]]


def page(handler: PageHandler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A page behind the login: no session → the login form (303); a POST without the session's CSRF
    token → 403; a refusal the handler did not turn into a message on its form → an error page with the
    refusal's status and detail (never a 500 for bad input)."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        svc = request.app[SERVICES]
        try:
            session = await current_session(request)
            if session is None:
                if request.method == "GET":
                    return see_other(request, "/ui/login?" + urllib.parse.urlencode({"next": request.rel_url.path_qs}))
                return see_other(request, "/ui/login")
            form: dict[str, str] = {}
            if request.method == "POST":
                form = await read_form(request)
                if not ui_sessions.csrf_ok(session, form.get("csrf")):
                    return error_page(request, 403, "csrf_failed",
                                      "this form was sent without this session's CSRF token; reload the page "
                                      "and send it again", session)
            return await handler(Page(request, svc, session, form))
        except TregError as exc:
            return error_page(request, exc.status, exc.code, exc.detail, None)
        except Exception:  # noqa: BLE001 (a page never answers a bare 500)
            log.exception("dashboard page %s failed", request.rel_url.path)
            return error_page(request, 500, "internal_error", "treg failed to render this page; the log says why",
                              None)

    return wrapped


def error_page(request: web.Request, status: int, code: str, detail: str, session: Session | None) -> web.StreamResponse:
    context = {"status": status, "code": code, "detail": detail, "ident": session.identity if session else None,
               "csrf": session.csrf if session else "", "nav": NAV, "active": "", "flash": None, "error": None}
    return finish(aiohttp_jinja2.render_template("error.html", request, context, status=status))


def field_error(exc: TregError, fields: dict[str, tuple[str, ...]]) -> dict[str, str]:
    """The refusal's detail under the form field it is about (by error code), else under ``_form``."""
    # display only (where the sentence is printed): nothing behaves differently by code
    under = {code: name for name, codes in fields.items() for code in codes}.get(exc.code, "_form")
    return {under: exc.detail}


def served_over_https(request: web.Request, settings: Settings) -> bool:
    """Whether the browser is on https: treg's own origin is (whatever the hop from a TLS-terminating
    proxy is), the connection itself is TLS, or a trusted proxy says so (``X-Forwarded-Proto``)."""
    return public_https(settings) or forwarded.scheme(request) == "https"


def cookie_kwargs(request: web.Request, max_age: int | None, *, path: str = "/") -> dict[str, Any]:
    """A dashboard cookie's flags: never readable by scripts, never sent cross-site, ``Secure`` whenever the
    browser is on https, and ``Path`` within treg's own prefix (``/treg/`` behind a proxy: the cookie is
    not sent to whatever else the same host serves)."""
    settings = request.app[SETTINGS]
    return {"httponly": True, "samesite": "Strict", "secure": served_over_https(request, settings),
            "path": path_prefix(settings) + path, "max_age": max_age}


def form_int(text: str) -> Any:
    """A form field meant as a whole number: the int, None when blank, else the text as typed, for the
    domain check to refuse with its code under its field (never a 500: a number longer than Python
    converts is text too)."""
    text = text.strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        return text
