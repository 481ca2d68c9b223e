"""The tools a caller sees over MCP, and how a ``tools/call`` becomes the pipeline's :class:`CallInput`.

``/mcp`` lists one tool per own tool the caller may use (sorted by tool name, then id, so the order is
stable), then one per hub tool other orgs published (sorted by ref, its price in its description and
``_meta``), then ``catalog_search`` and ``catalog_call``; ``/catalog/mcp`` lists only the two catalog
tools. A tool name is made valid for MCP (``[A-Za-z0-9_.-]{1,128}``): other characters become ``_``;
a name that collides with an earlier one (or with a catalog tool) gets ``-<the tool id's tail>``.

Arguments are checked here against the tool's own schema (an unknown key, a wrong type: -32602, the
message naming the argument); what the endpoint itself accepts is the pipeline's business, so a
refused parameter comes back as treg's error body in an ``isError`` result the model can act on.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Sequence
from urllib.parse import quote

from treg import json_text
from treg.call.types import CallInput
from treg.catalog.model import Endpoint
from treg.catalog.registry import CatalogRegistry
from treg.hub.model import HubTool
from treg.http_grammar import TOKEN
from treg.identity import Credential, Identity
from treg.mcp.protocol import INVALID_PARAMS, RpcError
from treg.org_data import ToolRef
from treg.redaction import MASK, mask_userinfo

CATALOG_SEARCH = "catalog_search"
CATALOG_CALL = "catalog_call"
CATALOG_TOOLS = (CATALOG_SEARCH, CATALOG_CALL)
#: tool name → {argument: x-mcp-header token}
PARAM_HEADERS = {CATALOG_CALL: {"endpoint": "Endpoint"}}

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
_INVALID = re.compile(r"[^A-Za-z0-9_.-]")
#: characters a path keeps as the agent wrote them (a valid %HH included); anything else is encoded
_PATH_SAFE = "/%:@!$&'()*+,;=-._~"
_SCALAR = {"type": ["string", "number", "integer", "boolean"]}


class Authenticated(Credential):
    """The caller the MCP endpoint authenticated for this request, as the credential its calls run with:
    the pipeline's identify asks it rather than looking the token up a second time (one authentication per
    request; the org hint is still checked against it). A Credential, not a token: no token cache is
    asked for it."""

    __slots__ = ("ident",)
    ident: Identity

    def __init__(self, ident: Identity) -> None:
        self.ident = ident

    async def identity(self, svc: Any) -> Identity:
        return self.ident


@dataclass(frozen=True)
class CallerContext:
    """What the MCP request itself says about the caller; ``token``, the credential its calls run with,
    is the identity the endpoint authenticated (:class:`Authenticated`)."""

    token: str | Credential
    org_hint: str | None
    tag: str | None
    user_agent: str | None


# -- names and schemas -------------------------------------------------------------------------------

def mcp_names(tools: Sequence[ToolRef]) -> list[tuple[str, ToolRef]]:
    """``(mcp name, tool)`` for ``tools``, sorted by name then id, each name unique and valid."""
    taken = set(CATALOG_TOOLS)
    out = []
    for tool in sorted(tools, key=lambda t: (t.name, t.id)):
        # a name taken already gets the tool id's tail, then a number
        name = _first_free(_INVALID.sub("_", tool.name)[:128] or "tool", taken, _INVALID.sub("_", tool.id)[-8:])
        taken.add(name)
        out.append((name, tool))
    return out


def _first_free(base: str, taken: set[str], mark: str) -> str:
    """``base`` if it is not taken, else ``base-<mark>``, then ``base-<mark>-2``, ``-3``…: the first one not
    taken, ``base`` cut so each fits 128 characters (bounded by the number of names taken)."""
    name, n = base, 1
    while name in taken:
        suffix = f"-{mark}" if n == 1 else f"-{mark}-{n}"
        name, n = f"{base[:128 - len(suffix)]}{suffix}", n + 1
    return name


def hub_names(hubs: Sequence[HubTool], taken: Sequence[str]) -> list[tuple[str, HubTool]]:
    """``(mcp name, hub tool)`` for ``hubs``, sorted by ref: the ref made valid, unique beside ``taken``
    (the own tools' and catalog tools' names: an own tool keeps its name, a ref colliding with it gets
    ``-hub``, then a number)."""
    used = set(taken) | set(CATALOG_TOOLS)
    out = []
    for hub in sorted(hubs, key=lambda h: h.ref):
        name = _first_free(_INVALID.sub("_", hub.ref)[:128], used, "hub")
        used.add(name)
        out.append((name, hub))
    return out


def _request_schema(where: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "method": {"type": "string", "enum": list(METHODS), "default": "GET", "description": "HTTP method"},
            "path": {"type": "string", "default": "", "description": where},
            "query": {"type": "object", "additionalProperties": {
                "anyOf": [_SCALAR, {"type": "array", "items": _SCALAR}]},
                "description": "query parameters by name (a list repeats the parameter)"},
            "headers": {"type": "object", "additionalProperties": {"type": "string"},
                        "description": "extra request headers (no credentials: treg injects them)"},
            "body": {"description": "request body: an object or array is sent as JSON, a string as is"},
        },
        "additionalProperties": False,
    }


def hub_tool(name: str, hub: HubTool) -> dict[str, Any]:
    """Another org's published tool: its ref, its description and its price (never its base URL)."""
    usd = f"{hub.price_micro // 1_000_000}.{hub.price_micro % 1_000_000:06d}"  # integers: no float near money
    price = (f"costs {hub.price_micro} micro-USD (USD {usd}) per successful call, charged to your org"
             if hub.price_micro else "free")
    return {
        "name": name,
        "title": f"{hub.ref} (hub)",
        "description": (
            f"{hub.description or 'A tool published by ' + hub.org_slug}. A hub tool of the org {hub.org_slug!r}: "
            f"{price}; treg adds its publisher's credentials, so send none. Answers the upstream's status and body."),
        "inputSchema": _request_schema("path after the tool's base URL, e.g. /items/7; empty: the base URL itself"),
        "annotations": {"title": f"{hub.ref} (hub)", "openWorldHint": True},
        "_meta": {"treg/hub_ref": hub.ref, "treg/price_micro": hub.price_micro},
    }


def own_tool(name: str, tool: ToolRef) -> dict[str, Any]:
    # the base URL as listings show it: its user-info (``user:password@``) is a credential (treg/tool_urls.py)
    base_url = mask_userinfo(tool.base_url, MASK)
    return {
        "name": name,
        "title": tool.name,
        "description": (
            f"An HTTP request to the org's tool {tool.name!r} ({base_url}); treg adds the tool's "
            "credentials, so send none. Answers the upstream's status and body. Path and query are appended "
            "to the base URL."),
        "inputSchema": _request_schema(f"path after the base URL, e.g. /items/7 (relayed to {base_url}"
                                       "/items/7); empty: the base URL itself"),
        "annotations": {"title": tool.name, "openWorldHint": True},
    }


def catalog_search_tool() -> dict[str, Any]:
    return {
        "name": CATALOG_SEARCH,
        "title": "Search the API catalog",
        "description": (
            "Find an API endpoint of treg's catalog by words (e.g. 'weather forecast', 'geocode a city') or by "
            "capability (e.g. 'weather.forecast'). Each match names its id, parameters, price (micro-USD), the "
            "credential tier you would get (null: not callable yet, with how to get one) and same-capability "
            "alternatives. Call a match with catalog_call. No arguments: every endpoint and capability."),
        "inputSchema": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "what you want, in words"},
                "capability": {"type": "string",
                               "description": "a capability such as weather.forecast, or its first part (weather)"},
                "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10,
                          "description": "most endpoints to return"},
            },
            "additionalProperties": False,
        },
        "annotations": {"title": "Search the API catalog", "readOnlyHint": True, "openWorldHint": False},
    }


def catalog_call_tool() -> dict[str, Any]:
    return {
        "name": CATALOG_CALL,
        "title": "Call a catalog endpoint",
        "description": (
            "Call an endpoint of treg's catalog by id (find ids with catalog_search). Parameters go in params by "
            "name, path, query and body ones alike; treg picks the credential (your team's, or the platform's, "
            "which is billed) and answers the upstream's status and body with the call id, cost and tier."),
        "inputSchema": {
            "type": "object",
            "properties": {
                # mirrored in Mcp-Param-Endpoint (2026-07-28): gateways and balancers can route or limit by
                # endpoint without reading the body; treg checks the header against the argument
                "endpoint": {"type": "string", "description": "endpoint id, e.g. open-meteo.forecast",
                             "x-mcp-header": "Endpoint"},
                "params": {"type": "object", "description": "the endpoint's parameters by name"},
                "body": {"description": "request body (an object or array is sent as JSON); body parameters "
                                        "may go in params instead"},
                "idempotency_key": {"type": "string",
                                    "description": "a label: a retry with the same label and request is not "
                                                   "charged twice"},
            },
            "required": ["endpoint"],
            "additionalProperties": False,
        },
        "annotations": {"title": "Call a catalog endpoint", "openWorldHint": True},
    }


def tool_list(named: Sequence[tuple[str, ToolRef]],
              hubs: Sequence[tuple[str, HubTool]] = ()) -> list[dict[str, Any]]:
    return ([own_tool(name, tool) for name, tool in named] + [hub_tool(name, hub) for name, hub in hubs]
            + [catalog_search_tool(), catalog_call_tool()])


# -- arguments ---------------------------------------------------------------------------------------

def _bad(message: str, **data: Any) -> RpcError:
    return RpcError(INVALID_PARAMS, message, data or None)


def _only(args: dict[str, Any], allowed: Sequence[str], tool: str) -> None:
    extra = sorted(set(args) - set(allowed))
    if extra:
        raise _bad(f"{tool}: unknown argument(s) {', '.join(extra)}; the arguments are {', '.join(allowed)}",
                   allowed=list(allowed))


def _scalar(value: Any, what: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    raise _bad(f"{what} must be a string, a number or a boolean")


def encode_query(query: Any, what: str = "query") -> str:
    """A raw query string from an object of scalars or lists of scalars (a string: taken as it is)."""
    if query is None:
        return ""
    if isinstance(query, str):
        return query.lstrip("?")
    if not isinstance(query, dict):
        raise _bad(f"{what} must be an object of parameter names to values")
    pairs = []
    for key, value in query.items():
        values = value if isinstance(value, list) else [value]
        for v in values:
            if v is None:
                continue
            pairs.append(f"{quote(str(key), safe='')}={quote(_scalar(v, f'{what}.{key}'), safe='')}")
    return "&".join(pairs)


def encode_body(body: Any, headers: list[tuple[str, str]]) -> bytes | None:
    """The body's bytes, and its Content-Type added when the caller named none."""
    if body is None:
        return None
    has_type = any(k.lower() == "content-type" for k, _ in headers)
    if isinstance(body, str):
        data = body.encode("utf-8", "surrogatepass")
        if not has_type:
            headers.append(("Content-Type", "application/json" if _is_json(body) else "text/plain; charset=utf-8"))
        return data
    if not has_type:
        headers.append(("Content-Type", "application/json"))
    return json.dumps(body, separators=(",", ":")).encode()


def _is_json(text: str) -> bool:
    stripped = text.strip()
    if not stripped or stripped[0] not in "[{":
        return False
    try:
        json_text.parse(stripped)
    except ValueError:  # not JSON, or nested too deeply (treg/json_text.py)
        return False
    return True


def _headers(value: Any) -> list[tuple[str, str]]:
    if value is None:
        return []
    if not isinstance(value, dict):
        raise _bad("headers must be an object of header names to values")
    out = []
    for k, v in value.items():
        if not TOKEN.match(k):
            raise _bad(f"headers: {k!r} is not a valid header name")
        text = _scalar(v, f"headers.{k}")
        if any(c in text for c in "\r\n\0"):
            raise _bad(f"headers.{k}: a header value cannot contain CR, LF or NUL")
        out.append((k, text))
    return out


def _input(ctx: CallerContext, call_id: str, *, method: str, rest: str, raw_query: str,
           headers: list[tuple[str, str]], body: bytes | None, form: str | None,
           idempotency_key: str | None) -> CallInput:
    # treg reads the answer itself (a tool result is text for the model): it asks for the identity
    # encoding, as a routed call's children do (the relay adds no Accept-Encoding of its own)
    headers = [(k, v) for k, v in headers if k.lower() != "accept-encoding"] + [("Accept-Encoding", "identity")]
    return CallInput(call_id=call_id, surface="mcp", method=method, rest=rest, raw_query=raw_query,
                     headers=tuple(headers), token=ctx.token, org_hint=ctx.org_hint, body=body,
                     content_length=None if body is None else len(body), tag=ctx.tag,
                     idempotency_key=idempotency_key, user_agent=ctx.user_agent, form=form)


def own_tool_input(ctx: CallerContext, call_id: str, tool: ToolRef, args: dict[str, Any]) -> CallInput:
    """``/call/<tool>/<path>?<query>`` as the tool's arguments describe it."""
    return named_input(ctx, call_id, tool.name, args)


def named_input(ctx: CallerContext, call_id: str, call_name: str, args: dict[str, Any]) -> CallInput:
    """``/call/<call_name>/<path>?<query>`` (an own tool's name, a hub tool's ref) as the arguments say."""
    _only(args, ("method", "path", "query", "headers", "body"), call_name)
    method = args.get("method", "GET")
    if not isinstance(method, str) or method.upper() not in METHODS:
        raise _bad(f"method must be one of {', '.join(METHODS)}")
    path = args.get("path", "") or ""
    if not isinstance(path, str):
        raise _bad("path must be a string, e.g. /items/7")
    path, _, path_query = path.partition("?")
    raw_query = "&".join(q for q in (path_query, encode_query(args.get("query"))) if q)
    headers = _headers(args.get("headers"))
    body = encode_body(args.get("body"), headers)
    rest = quote(call_name, safe="")
    if path.strip("/") or path == "/":
        rest += "/" + quote(path.lstrip("/"), safe=_PATH_SAFE)
    key = next((v for k, v in headers if k.lower() == "idempotency-key"), None)
    return _input(ctx, call_id, method=method.upper(), rest=rest, raw_query=raw_query, headers=headers, body=body,
                  form=None, idempotency_key=key)


def catalog_input(ctx: CallerContext, call_id: str, registry: CatalogRegistry, args: dict[str, Any]) -> CallInput:
    """``/catalog/call/<endpoint>?<params>`` with the endpoint's body parameters in a JSON body."""
    _only(args, ("endpoint", "params", "body", "idempotency_key"), CATALOG_CALL)
    endpoint_id = args.get("endpoint")
    if not isinstance(endpoint_id, str) or not endpoint_id.strip():
        raise _bad("catalog_call needs endpoint, an endpoint id such as open-meteo.forecast (see catalog_search)")
    endpoint_id = endpoint_id.strip()
    params = args.get("params") or {}
    if not isinstance(params, dict):
        raise _bad("params must be an object of parameter names to values")
    key = args.get("idempotency_key")
    if key is not None and (not isinstance(key, str) or not key or any(c in key for c in "\r\n\0")):
        raise _bad("idempotency_key must be a non-empty single-line string")
    ep: Endpoint | None = registry.get(endpoint_id)
    body_names = {p.name for p in ep.params_in("body")} if ep is not None else set()
    query = {k: v for k, v in params.items() if k not in body_names}
    in_body = {k: v for k, v in params.items() if k in body_names}
    body_arg = args.get("body")
    if in_body:
        if body_arg is not None and not isinstance(body_arg, dict):
            raise _bad("body parameters in params need body to be an object (or absent)")
        body_arg = {**(body_arg or {}), **in_body}
    headers: list[tuple[str, str]] = []
    body = encode_body(body_arg, headers)
    if key is not None:
        headers.append(("Idempotency-Key", key))
    method = ep.method if ep is not None else ("POST" if body is not None else "GET")
    return _input(ctx, call_id, method=method, rest=quote(endpoint_id, safe="._~-"),
                  raw_query=encode_query(query, "params"), headers=headers, body=body, form="catalog",
                  idempotency_key=key)
