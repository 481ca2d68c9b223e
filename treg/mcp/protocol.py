"""MCP's JSON-RPC envelope over streamable HTTP, answered as ``application/json``, stateless.

Both protocol revisions in use are served on one endpoint, chosen per request (no session is ever
issued, so any treg process can answer any request):

* ``2025-11-25`` ("legacy"): ``initialize`` (answered with that version), ``notifications/initialized``
  (202), ``ping``, ``tools/list``, ``tools/call``. A request that carries no per-request ``_meta``
  version and no ``MCP-Protocol-Version`` of the modern revision is legacy; JSON-RPC errors of a
  method travel in a 200 answer, as in that revision.
* ``2026-07-28`` ("modern"): ``server/discover``, ``tools/list``, ``tools/call``; every request carries
  ``_meta`` (protocol version, client capabilities) and the ``MCP-Protocol-Version``, ``Mcp-Method``
  and ``Mcp-Name`` headers, checked in the revision's order (``_meta`` shape → -32602, header agreement
  → -32020, version support → -32022, all HTTP 400); an unknown method is HTTP 404 with -32601.

Plain Python: the edge hands in the body and headers; the tools themselves are a :class:`Backend`.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from treg import json_text

log = logging.getLogger(__name__)

LEGACY = "2025-11-25"
MODERN = "2026-07-28"
#: newest first, as ``server/discover`` and -32022 list them
SUPPORTED = (MODERN, LEGACY)

PROTOCOL_VERSION_KEY = "io.modelcontextprotocol/protocolVersion"
CLIENT_CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO_KEY = "io.modelcontextprotocol/serverInfo"

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
HEADER_MISMATCH = -32020
UNSUPPORTED_VERSION = -32022

#: modern revision: the HTTP status of a JSON-RPC error (streamable-http.mdx, basic/index.mdx)
_MODERN_STATUS = {PARSE_ERROR: 400, INVALID_REQUEST: 400, INVALID_PARAMS: 400, HEADER_MISMATCH: 400,
                  UNSUPPORTED_VERSION: 400, METHOD_NOT_FOUND: 404, INTERNAL_ERROR: 500}
#: legacy revision: only an envelope treg cannot read is an HTTP error; a method's error is a 200 answer
_LEGACY_STATUS = {PARSE_ERROR: 400, INVALID_REQUEST: 400, UNSUPPORTED_VERSION: 400, HEADER_MISMATCH: 400,
                  INTERNAL_ERROR: 500}

#: methods whose ``params`` field is mirrored in ``Mcp-Name``
_NAMED = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}
_SENTINEL = re.compile(r"\A=\?base64\?(.*)\?=\Z", re.S)
_HEADER_SAFE = re.compile(r"\A[\x20-\x7E\t]*\Z")


class RpcError(Exception):
    """A JSON-RPC error answer: ``code``, ``message`` and optional ``data``."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def error(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            out["data"] = self.data
        return out


class Backend(Protocol):
    """The tools of one caller on one endpoint (``/mcp`` or ``/catalog/mcp``)."""

    instructions: str

    async def list_tools(self) -> list[dict[str, Any]]: ...

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """A ``CallToolResult``; :class:`RpcError` (-32602) for an unknown tool or bad arguments."""
        ...

    def param_headers(self, name: str) -> dict[str, str]:
        """The tool's arguments mirrored in ``Mcp-Param-<token>`` headers (its ``x-mcp-header``s)."""
        ...


@dataclass(frozen=True)
class Reply:
    """What the edge sends: an HTTP status and a JSON-RPC message (None: no body, as for 202)."""

    status: int
    message: dict[str, Any] | None
    #: the request's revision, when it was read that far ("legacy" | "modern")
    era: str | None = None


@dataclass(frozen=True)
class ServerInfo:
    name: str
    version: str
    title: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "version": self.version, "title": self.title}


def error_reply(status: int, err: RpcError, request_id: Any = None) -> Reply:
    return Reply(status, {"jsonrpc": "2.0", "id": request_id, "error": err.error()})


def decode_header_value(value: str | None) -> str | None:
    """``Mcp-Name`` after the base64 sentinel (``=?base64?…?=``); None for a malformed sentinel."""
    if value is None:
        return None
    m = _SENTINEL.fullmatch(value)
    if m is None:
        return value
    try:
        raw = base64.b64decode(m.group(1), validate=True)
        if base64.b64encode(raw).decode("ascii") != m.group(1):
            return None  # non-canonical: never equal to a body value by accident
        return raw.decode("utf-8")
    except (binascii.Error, ValueError):
        return None


class _Headers:
    """The request headers by lower-case name (first value), and which routing headers came twice."""

    def __init__(self, raw: Sequence[tuple[str, str]]) -> None:
        self.first: dict[str, str] = {}
        self.twice: set[str] = set()
        for k, v in raw:
            name = k.lower()
            if name in self.first:
                self.twice.add(name)
            else:
                self.first[name] = v.strip(" \t")

    def get(self, name: str) -> str | None:
        return self.first.get(name)


def _parse(body: bytes) -> dict[str, Any]:
    try:
        msg = json_text.parse(body)
    except json_text.TooDeep as exc:
        raise RpcError(PARSE_ERROR, "the JSON body is nested too deeply") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise RpcError(PARSE_ERROR, f"the body is not valid JSON: {exc}") from exc
    if isinstance(msg, list):
        raise RpcError(INVALID_REQUEST, "JSON-RPC batches are not supported: send one message per POST")
    if not isinstance(msg, dict) or msg.get("jsonrpc") != "2.0":
        raise RpcError(INVALID_REQUEST, 'a JSON-RPC 2.0 message is an object with "jsonrpc": "2.0"')
    return msg


def _check_headers(msg: dict[str, Any], params: dict[str, Any], headers: _Headers, *, required: bool) -> None:
    """``Mcp-Method`` / ``Mcp-Name`` agree with the body (always when present; required when modern)."""
    for name in ("mcp-protocol-version", "mcp-method", "mcp-name"):
        if name in headers.twice:
            raise RpcError(HEADER_MISMATCH, f"Header mismatch: {name} was sent more than once")
    method = msg["method"]
    sent = headers.get("mcp-method")
    if sent is None and required:
        raise RpcError(HEADER_MISMATCH, "Header mismatch: the Mcp-Method header is missing")
    if sent is not None and sent != method:
        raise RpcError(HEADER_MISMATCH, f"Header mismatch: Mcp-Method header value {sent!r} does not match "
                                        f"body value {method!r}")
    key = _NAMED.get(method)
    if key is None or params.get(key) is None:
        return
    raw = headers.get("mcp-name")
    if raw is None and not required:
        return
    if raw is None:
        raise RpcError(HEADER_MISMATCH, "Header mismatch: the Mcp-Name header is missing")
    if decode_header_value(raw) != params[key]:
        raise RpcError(HEADER_MISMATCH, f"Header mismatch: Mcp-Name header value {raw!r} does not match "
                                        f"body value {params[key]!r}")


def _rendered(value: Any) -> str | None:
    """An argument as a client mirrors it into a header (None: a value no header can carry)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int)):
        return str(value)
    return None


def _check_param_headers(mirrored: dict[str, str], arguments: dict[str, Any], headers: _Headers, *,
                         required: bool) -> None:
    """``Mcp-Param-<token>`` headers agree with the arguments they mirror (streamable-http.mdx, "Custom
    Headers from Tool Parameters"): present together and equal after the base64 sentinel, or both absent."""
    for argument, token in mirrored.items():
        name = f"mcp-param-{token.lower()}"
        raw, value = headers.get(name), arguments.get(argument)
        if name in headers.twice:
            raise RpcError(HEADER_MISMATCH, f"Header mismatch: Mcp-Param-{token} was sent more than once")
        if raw is not None and not _HEADER_SAFE.fullmatch(raw):
            raise RpcError(HEADER_MISMATCH, f"Header mismatch: Mcp-Param-{token} carries characters a header "
                                            "value may not (use the =?base64?…?= form)")
        rendered = _rendered(value) if value is not None else None
        if rendered is None:
            if raw is not None:
                raise RpcError(HEADER_MISMATCH, f"Header mismatch: Mcp-Param-{token} is present but the "
                                                f"argument {argument!r} is not")
            continue
        if raw is None:
            if required:
                raise RpcError(HEADER_MISMATCH, f"Header mismatch: Mcp-Param-{token} is missing but the argument "
                                                f"{argument!r} is present")
            continue
        decoded = decode_header_value(raw)
        if decoded is None:
            raise RpcError(HEADER_MISMATCH, f"Header mismatch: Mcp-Param-{token} carries a malformed base64 value")
        if decoded != rendered:
            raise RpcError(HEADER_MISMATCH, f"Header mismatch: Mcp-Param-{token} header value {raw!r} does not "
                                            f"match body value {rendered!r}")


def _unsupported(requested: Any) -> RpcError:
    return RpcError(UNSUPPORTED_VERSION, "Unsupported protocol version",
                    {"supported": list(SUPPORTED), "requested": requested})


def _speaks_modern(params: dict[str, Any], headers: _Headers) -> bool:
    """A request of the modern revision: its header says so, or it carries a per-request ``_meta``
    version. Anything else is legacy (a 2025-11-25 client, or a bare JSON-RPC POST)."""
    meta = params.get("_meta")
    return headers.get("mcp-protocol-version") == MODERN or (isinstance(meta, dict) and PROTOCOL_VERSION_KEY in meta)


def _check_envelope(era: str, msg: dict[str, Any], params: dict[str, Any], headers: _Headers) -> None:
    """The revision's envelope checks, in its order (first failure wins)."""
    version_header = headers.get("mcp-protocol-version")
    if era == "legacy":
        if version_header is not None and version_header != LEGACY:
            raise _unsupported(version_header)
        _check_headers(msg, params, headers, required=False)
        return
    meta = params.get("_meta")
    if not isinstance(meta, dict):
        raise RpcError(INVALID_PARAMS, f"params._meta must be an object carrying {PROTOCOL_VERSION_KEY!r} and "
                                       f"{CLIENT_CAPABILITIES_KEY!r}")
    missing = [k for k in (PROTOCOL_VERSION_KEY, CLIENT_CAPABILITIES_KEY) if k not in meta]
    if missing:
        raise RpcError(INVALID_PARAMS, f"params._meta is missing the required key(s): {', '.join(missing)}")
    requested = meta[PROTOCOL_VERSION_KEY]
    if version_header is None or version_header != requested:
        raise RpcError(HEADER_MISMATCH, f"Header mismatch: MCP-Protocol-Version header value {version_header!r} "
                                        f"does not match body value {requested!r}")
    _check_headers(msg, params, headers, required=True)
    if not isinstance(requested, str):
        raise RpcError(INVALID_PARAMS, "the protocol version in params._meta must be a string")
    if requested != MODERN:
        raise _unsupported(requested)
    if not isinstance(meta[CLIENT_CAPABILITIES_KEY], dict):
        raise RpcError(INVALID_PARAMS, f"params._meta[{CLIENT_CAPABILITIES_KEY!r}] must be an object")


class Endpoint:
    """One endpoint's method table: answers one POSTed JSON-RPC message."""

    def __init__(self, backend: Backend, server: ServerInfo) -> None:
        self.backend = backend
        self.server = server

    async def handle(self, body: bytes, headers: Sequence[tuple[str, str]]) -> Reply:
        hs = _Headers(headers)
        try:
            msg = _parse(body)
        except RpcError as err:
            return error_reply(400, err)
        if "method" not in msg:
            # a response (we never send requests) or garbage: nothing treg could accept
            return error_reply(400, RpcError(INVALID_REQUEST, "expected a JSON-RPC request or notification"),
                               _safe_id(msg.get("id")))
        if not isinstance(msg["method"], str):
            return error_reply(400, RpcError(INVALID_REQUEST, "method must be a string"), _safe_id(msg.get("id")))
        if "id" not in msg:
            # a notification (notifications/initialized, notifications/cancelled, …): accepted, no answer
            return Reply(202, None)
        request_id = msg["id"]
        if isinstance(request_id, bool) or not isinstance(request_id, (str, int)):
            return error_reply(400, RpcError(INVALID_REQUEST, "id must be a string or an integer"))
        params = msg.get("params", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            return error_reply(400, RpcError(INVALID_PARAMS, "params must be an object"), request_id)
        era = "modern" if _speaks_modern(params, hs) else "legacy"
        try:
            _check_envelope(era, msg, params, hs)
            result = await self._dispatch(era, msg["method"], params, hs)
        except RpcError as err:
            table = _MODERN_STATUS if era == "modern" else _LEGACY_STATUS
            return Reply(table.get(err.code, 200), {"jsonrpc": "2.0", "id": request_id, "error": err.error()}, era)
        except Exception as exc:  # noqa: BLE001 (a JSON-RPC answer, never a bare 500 page)
            err = _internal(exc)
            return Reply(500, {"jsonrpc": "2.0", "id": request_id, "error": err.error()}, era)
        if era == "modern":
            result = {"resultType": "complete", **result}
            meta = dict(result.get("_meta") or {})
            meta[SERVER_INFO_KEY] = self.server.to_json()
            result["_meta"] = meta
        return Reply(200, {"jsonrpc": "2.0", "id": request_id, "result": result}, era)

    async def _dispatch(self, era: str, method: str, params: dict[str, Any], headers: _Headers) -> dict[str, Any]:
        if era == "legacy":
            if method == "initialize":
                return self._initialize()
            if method == "ping":
                return {}
        elif method == "server/discover":
            return self._discover()
        if method == "tools/list":
            cursor = params.get("cursor")
            if cursor is not None:
                raise RpcError(INVALID_PARAMS, "invalid cursor: treg lists every tool in one page")
            result: dict[str, Any] = {"tools": await self.backend.list_tools()}
            if era == "modern":
                # per caller (it follows the ACL), and a tool added now must show at once
                result.update(ttlMs=0, cacheScope="private")
            return result
        if method == "tools/call":
            name = params.get("name")
            if not isinstance(name, str) or not name:
                raise RpcError(INVALID_PARAMS, "tools/call needs params.name, the tool's name")
            arguments = params.get("arguments", {})
            if arguments is None:
                arguments = {}
            if not isinstance(arguments, dict):
                raise RpcError(INVALID_PARAMS, "params.arguments must be an object")
            _check_param_headers(self.backend.param_headers(name), arguments, headers, required=era == "modern")
            return await self.backend.call_tool(name, arguments)
        raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}", {"method": method})

    def _capabilities(self) -> dict[str, Any]:
        return {"tools": {"listChanged": False}}

    def _initialize(self) -> dict[str, Any]:
        # the handshake names the one legacy revision treg speaks, whatever was asked: the client decides
        return {"protocolVersion": LEGACY, "capabilities": self._capabilities(), "serverInfo": self.server.to_json(),
                "instructions": self.backend.instructions}

    def _discover(self) -> dict[str, Any]:
        return {"supportedVersions": list(SUPPORTED), "capabilities": self._capabilities(),
                "instructions": self.backend.instructions, "ttlMs": 0, "cacheScope": "private"}


def _internal(exc: Exception) -> RpcError:
    from treg.errors import TregError

    if isinstance(exc, TregError):  # e.g. the database is unavailable: treg's own error body as data
        return RpcError(INTERNAL_ERROR, exc.detail, exc.body())
    log.error("unexpected error answering an MCP request", exc_info=exc)
    return RpcError(INTERNAL_ERROR, "treg failed unexpectedly; the error was logged")


def _safe_id(value: Any) -> Any:
    return value if isinstance(value, (str, int)) and not isinstance(value, bool) else None
