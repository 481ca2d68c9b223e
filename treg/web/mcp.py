"""The MCP endpoints at the edge: ``POST /mcp`` (the caller's tools and the catalog) and
``POST /catalog/mcp`` (the catalog only). Streamable HTTP answered as ``application/json``, stateless.

The edge does what only HTTP knows: the Origin check (DNS rebinding), the caller's identity (401 with
``WWW-Authenticate: Bearer``), 405 on GET/DELETE (no SSE stream, no session to end), the body read
(bounded), and CORS for the origins ``TREG_MCP_ALLOWED_ORIGINS`` lists. The protocol is
:mod:`treg.mcp.protocol`; tool calls run through the same pipeline as ``/call/`` (:mod:`treg.mcp.backend`),
as the caller identified here: a request is authenticated once.
"""

from __future__ import annotations

from aiohttp import web

from treg import __version__, authentication
from treg.errors import BodyTooLarge, Forbidden, TregError, Unauthorized
from treg.keys import SERVICES
from treg.mcp.backend import PipelineBackend
from treg.mcp.protocol import INVALID_REQUEST, Endpoint, Reply, ServerInfo
from treg.mcp.tools import Authenticated, CallerContext
from treg.origin import normalized_origin, note_listen, own_origins
from treg.settings import Settings
from treg.web.errors import error_response, render_failure
from treg.web.jsonio import dumps, read_body

routes = web.RouteTableDef()

SERVER = ServerInfo(name="treg", version=__version__, title="treg API gateway")
_CORS_HEADERS = ("Authorization, Content-Type, Accept, MCP-Protocol-Version, Mcp-Method, Mcp-Name, "
                 "X-Treg-Token, X-Treg-Org, X-Treg-Tag")


def origin_allowed(request: web.Request, settings: Settings) -> bool | None:
    """None: no Origin header (not a browser); else whether the origin may use the endpoint."""
    raw = request.headers.get("Origin")
    if raw is None:
        return None
    origin = normalized_origin(raw)
    if origin is None:
        return False  # "null" (a sandboxed page, a file://) or garbage
    allowed = {normalized_origin(o) for o in settings.mcp_allowed_origins}
    sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
    return origin in allowed or origin in own_origins(settings, sockname)


def _token(request: web.Request) -> str | None:
    auth = request.headers.get("Authorization", "")
    scheme, _, value = auth.strip().partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return request.headers.get("X-Treg-Token")


def _rpc_refusal(status: int, exc: TregError, code: int = INVALID_REQUEST) -> web.Response:
    """A refusal of the HTTP layer as a JSON-RPC error without id (what MCP clients read), treg's error body
    in ``error.data``."""
    body = {"jsonrpc": "2.0", "id": None, "error": {"code": code, "message": exc.detail, "data": exc.body()}}
    return web.Response(text=dumps(body), status=status, content_type="application/json",
                        headers={"X-Treg-Error": "1", **exc.headers})


def _cors(origin: str | None) -> dict[str, str]:
    if origin is None:
        return {}
    return {"Access-Control-Allow-Origin": origin, "Vary": "Origin",
            "Access-Control-Expose-Headers": "WWW-Authenticate, X-Treg-Error"}


def _accepts_json(accept: str | None) -> bool:
    if accept is None or not accept.strip():
        return True
    for item in accept.split(","):
        media = item.split(";", 1)[0].strip().lower()
        if media in ("application/json", "application/*", "*/*"):
            return True
    return False


def _render(reply: Reply, cors: dict[str, str]) -> web.Response:
    if reply.message is None:
        return web.Response(status=reply.status, headers=cors)
    headers = dict(cors)
    if reply.status >= 400:
        headers["X-Treg-Error"] = "1"
    return web.Response(text=dumps(reply.message), status=reply.status, content_type="application/json",
                        headers=headers)


async def serve(request: web.Request, *, catalog_only: bool) -> web.StreamResponse:
    svc = request.app[SERVICES]
    settings = svc.settings
    allowed = origin_allowed(request, settings)
    if allowed is False:
        return _rpc_refusal(403, Forbidden(
            f"the Origin {request.headers.get('Origin')!r} may not use this MCP endpoint (DNS-rebinding "
            "protection); an operator can allow it with TREG_MCP_ALLOWED_ORIGINS", code="origin_not_allowed",
            refused_by="origin"))
    cors = _cors(normalized_origin(request.headers["Origin"])) if allowed else {}
    if request.method == "OPTIONS" and allowed:
        return web.Response(status=204, headers={**cors, "Access-Control-Allow-Methods": "POST",
                                                 "Access-Control-Allow-Headers": _CORS_HEADERS,
                                                 "Access-Control-Max-Age": "600"})
    if request.method != "POST":
        return error_response(TregError(
            f"{request.method} is not allowed on {request.path}: send each JSON-RPC message as its own POST "
            "(treg answers with JSON; there is no SSE stream and no session)", code="method_not_allowed",
            status=405, blame="caller", headers={"Allow": "POST"}), extra_headers=cors)
    try:
        ident = await authentication.authenticate(svc, _token(request), request.headers.get("X-Treg-Org"))
    except Unauthorized as exc:
        if not _token(request):  # no token at all: say how an MCP client sends one
            exc.detail = "send your treg token as Authorization: Bearer <token> (or X-Treg-Token)"
        return error_response(exc, extra_headers={"WWW-Authenticate": "Bearer", **cors})
    if not _accepts_json(request.headers.get("Accept")):
        return _rpc_refusal(406, TregError("this endpoint answers application/json: list it in Accept",
                                           code="not_acceptable", status=406, blame="caller"))
    ctype = request.headers.get("Content-Type")
    if ctype is not None and ctype.split(";", 1)[0].strip().lower() != "application/json":
        return _rpc_refusal(415, TregError("send the JSON-RPC message as Content-Type: application/json",
                                           code="unsupported_media_type", status=415, blame="caller"))
    body = await read_body(request, settings.json_body_max_bytes)
    # the calls of this request run as the caller identified above: it is not looked up again
    ctx = CallerContext(token=Authenticated(ident), org_hint=request.headers.get("X-Treg-Org"),
                        tag=request.headers.get("X-Treg-Tag"), user_agent=request.headers.get("User-Agent"))
    backend = PipelineBackend(svc, ident, ctx, catalog_only=catalog_only)
    if request.transport is not None:  # the address a connect_url names, without TREG_PUBLIC_URL
        note_listen(request.transport.get_extra_info("sockname"))
    reply = await Endpoint(backend, SERVER).handle(body, tuple(request.headers.items()))
    return _render(reply, cors)


async def _guarded(request: web.Request, catalog_only: bool) -> web.StreamResponse:
    try:
        return await serve(request, catalog_only=catalog_only)
    except BodyTooLarge as exc:
        return _rpc_refusal(413, exc)
    except Exception as exc:  # noqa: BLE001 (the contract's error body; logged when unexpected)
        return render_failure(request, exc)


@routes.route("*", "/mcp")
async def mcp(request: web.Request) -> web.StreamResponse:
    return await _guarded(request, False)


@routes.route("*", "/catalog/mcp")
async def catalog_mcp(request: web.Request) -> web.StreamResponse:
    return await _guarded(request, True)

