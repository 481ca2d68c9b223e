"""Edge middlewares: every treg failure rendered as the contract's error body; never a bare 500 page."""

from __future__ import annotations

import logging
from typing import Awaitable, Callable

from aiohttp import web

from treg.errors import TregError
from treg.keys import ERROR_HEADERS
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


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except TregError as exc:
        return error_response(exc, extra_headers=request.get(ERROR_HEADERS))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _HTTP_CODES.get(exc.status, "http_error")
        detail = exc.reason if exc.status != 404 else f"no route for {request.method} {request.path}"
        if exc.status == 405:
            detail = f"{request.method} is not allowed on {request.path}"
        err = TregError(detail, code=code, status=exc.status, blame="caller")
        return error_response(err, extra_headers=request.get(ERROR_HEADERS))
    except Exception:
        log.exception("unexpected error on %s %s", request.method, request.path)
        err = TregError("treg failed unexpectedly; the error was logged", code="internal_error", status=500,
                        blame="treg")
        return error_response(err, extra_headers=request.get(ERROR_HEADERS))
