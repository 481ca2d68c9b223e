"""Error rendering at the edge: every treg failure is the contract's error body; never a bare 500 page.

No aiohttp middleware does this. A middleware wraps every request in two more coroutine frames
(aiohttp adds its own ``current_app`` wrapper beside ours), and every resumption of a call (each
upstream read) passed through both (a measurable share of a call: docs/performance.md). Instead:

* the management routes are registered through :func:`add_routes`, which wraps each handler in
  :func:`rendering` (one frame, as a middleware would, but only where it is needed);
* the call surfaces catch in their own route function (treg/web/call.py), no extra frame at all;
* a catch-all route registered last (:func:`unrouted`) answers what the router found nothing for:
  404, or 405 with ``Allow`` when the path exists for other methods.
"""

from __future__ import annotations

import logging
from typing import Awaitable, Callable, Iterable

from aiohttp import hdrs, web

from treg.errors import BadRequest, TregError
from treg.keys import BODY_FIELDS, ERROR_HEADERS
from treg.web import openapi
from treg.web.jsonio import dumps

log = logging.getLogger("treg.web")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 409: "conflict", 413: "body_too_large", 414: "uri_too_long",
               415: "unsupported_media_type", 431: "headers_too_large"}


def error_response(exc: TregError, *, extra_headers: dict[str, str] | None = None) -> web.Response:
    headers = {"X-Treg-Error": "1", **exc.headers, **(extra_headers or {})}
    return web.Response(text=dumps(exc.body()), status=exc.status, content_type="application/json",
                        headers=headers)


def render_failure(request: web.Request, exc: Exception) -> web.StreamResponse:
    """The answer to a handler's exception: a TregError as itself, an aiohttp HTTP error (a body too
    large, …) in the same shape, anything else logged and answered 500. A non-error HTTPException (a
    redirect) is re-raised for aiohttp to send."""
    if isinstance(exc, TregError):
        return error_response(exc, extra_headers=request.get(ERROR_HEADERS))
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        code = _HTTP_CODES.get(exc.status, "http_error")
        detail = exc.reason if exc.status != 404 else f"no route for {request.method} {request.path}"
        if exc.status == 405:
            detail = f"{request.method} is not allowed on {request.path}"
        return error_response(TregError(detail, code=code, status=exc.status, blame="caller"),
                              extra_headers=request.get(ERROR_HEADERS))
    log.error("unexpected error on %s %s", request.method, request.path, exc_info=exc)
    err = TregError("treg failed unexpectedly; the error was logged", code="internal_error", status=500,
                    blame="treg")
    return error_response(err, extra_headers=request.get(ERROR_HEADERS))


def refuse_nul(request: web.Request) -> None:
    """A NUL character in a route's path parameter or query (``/api/v1/tools/%00``) is the caller's 400:
    PostgreSQL refuses NUL in text, which would surface as an unexpected error and a 500."""
    for name, value in request.match_info.items():
        if "\x00" in value:
            raise BadRequest(f"the path parameter {name} contains a NUL character (%00)", code="invalid_path")
    query = request.query if "%00" in request.raw_path.partition("?")[2] else {}
    if any("\x00" in k or "\x00" in v for k, v in query.items()):
        raise BadRequest("the query string contains a NUL character (%00)", code="invalid_query")


def rendering(handler: Handler, *, body_fields: frozenset[str] | None = None) -> Handler:
    """``handler`` with its failures rendered by :func:`render_failure`; ``body_fields``: the fields its
    JSON body may hold (its OpenAPI schema is closed), enforced when the handler reads the body."""
    async def rendered(request: web.Request) -> web.StreamResponse:
        try:
            refuse_nul(request)
            if body_fields is not None:
                request[BODY_FIELDS] = body_fields
            return await handler(request)
        except Exception as exc:  # noqa: BLE001 (rendered, and logged when unexpected)
            return render_failure(request, exc)

    rendered.__name__ = getattr(handler, "__name__", "handler")
    rendered.__doc__ = handler.__doc__
    return rendered


def add_routes(app: web.Application, table: Iterable[web.AbstractRouteDef]) -> None:
    """Register a route table with every handler wrapped in :func:`rendering`, each knowing from the
    OpenAPI document (treg/web/openapi.py) which body fields it takes: one rule for every route, so a
    route whose schema forbids unknown fields refuses them (400 ``invalid_field``) without code of its own."""
    for route in table:
        if isinstance(route, web.RouteDef):
            fields = openapi.body_fields(route.method, route.path)
            route = web.RouteDef(route.method, route.path, rendering(route.handler, body_fields=fields),  # type: ignore[arg-type]
                                 route.kwargs)
        route.register(app.router)


async def unrouted(request: web.Request) -> web.StreamResponse:
    """The catch-all route (registered last): 405 naming the allowed methods when another route has
    this path, else 404. The router gives up only here, so this scan runs only for misses."""
    allowed: set[str] = set()
    for resource in request.app.router.resources():
        if resource is request.match_info.route.resource:
            continue
        _, methods = await resource.resolve(request)
        allowed |= methods
    if allowed:
        detail = f"{request.method} is not allowed on {request.path}"
        err = TregError(detail, code="method_not_allowed", status=405, blame="caller",
                        headers={hdrs.ALLOW: ", ".join(sorted(allowed))})
    else:
        err = TregError(f"no route for {request.method} {request.path}", code="not_found", status=404,
                        blame="caller")
    return error_response(err, extra_headers=request.get(ERROR_HEADERS))


def add_unrouted(app: web.Application) -> None:
    """Register :func:`unrouted` for every method and path; call it after every other route."""
    app.router.add_route("*", "/{unrouted:[\\s\\S]*}", unrouted)
