"""JSON in and out of handlers: the error body on malformed input, datetimes as ISO 8601."""

from __future__ import annotations

import asyncio
import datetime
import json
from typing import Any

from aiohttp import ClientPayloadError, web
from aiohttp.http_exceptions import HttpProcessingError

from treg import json_text
from treg.errors import BadRequest, BodyTooLarge
from treg.keys import BODY_FIELDS

MAX_JSON_BYTES = 1024 * 1024


def _default(obj: Any) -> Any:
    if isinstance(obj, (datetime.datetime, datetime.date)):
        return obj.isoformat()
    if isinstance(obj, (bytes, bytearray, memoryview)):
        raise TypeError("bytes are never serialized")
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def dumps(obj: Any) -> str:
    return json.dumps(obj, default=_default, separators=(",", ":"))


def json_response(obj: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(text=dumps(obj), status=status, content_type="application/json", headers=headers)


#: JSON nested deeper than this is refused (api.md): no management body needs more
MAX_JSON_DEPTH = json_text.DEPTH_MAX

#: how a caller's body read fails when the caller hangs up mid-upload or breaks the framing
_BODY_BROKEN = (ConnectionError, asyncio.IncompleteReadError, HttpProcessingError, ClientPayloadError)


def _too_large(limit: int) -> BodyTooLarge:
    return BodyTooLarge(f"the request body is larger than {limit} bytes")


async def read_body(request: web.Request, limit: int = MAX_JSON_BYTES) -> bytes:
    """The whole body up to ``limit`` bytes, however it arrives (split TCP writes, chunked): one
    ``read(n)`` returns only what has arrived so far."""
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit)
    parts, size = [], 0
    try:
        async for chunk in request.content.iter_chunked(64 * 1024):
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            parts.append(chunk)
    except _BODY_BROKEN as exc:
        # the message of aiohttp's parser errors quotes the raw bytes: never in the answer
        raise BadRequest("the request body ended before it was complete or its framing is malformed",
                         code="body_incomplete") from exc
    return b"".join(parts)


def check_text(data: Any) -> None:
    """Refuse what no text column can hold, anywhere in a decoded JSON document: a NUL character
    (PostgreSQL refuses it in text), a lone surrogate (``\\udXXX``: not encodable as UTF-8), nesting
    deeper than :data:`MAX_JSON_DEPTH`. Iterative: the document may be as deep as the parser allowed."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            _check_string(node)
        elif isinstance(node, (dict, list)):
            if depth > MAX_JSON_DEPTH:
                raise BadRequest(f"the JSON body is nested deeper than {MAX_JSON_DEPTH} levels", code="invalid_json")
            if isinstance(node, dict):
                for k, v in node.items():
                    _check_string(k)
                    stack.append((v, depth + 1))
            else:
                stack.extend((v, depth + 1) for v in node)


def _check_string(text: str) -> None:
    if "\x00" in text:
        raise BadRequest("the JSON body contains a NUL character (\\u0000), which no text field may hold",
                         code="invalid_json")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest("the JSON body contains an unpaired surrogate escape (\\udXXX), which is not valid text",
                         code="invalid_json") from exc


async def read_json_object(request: web.Request) -> dict[str, Any]:
    raw = await read_body(request)
    if not raw.strip():
        raise BadRequest("send a JSON object as the request body", code="invalid_json")
    try:
        data = json_text.parse(raw)
    except json_text.TooDeep as exc:
        raise BadRequest(f"the JSON body is nested deeper than {MAX_JSON_DEPTH} levels", code="invalid_json") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise BadRequest(f"the body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object", code="invalid_json")
    check_text(data)
    allowed = request.get(BODY_FIELDS)
    if allowed is not None:
        refuse_unknown(data, allowed, f"{request.method} {request.match_info.route.resource.canonical}")
    return data


def refuse_unknown(body: dict[str, Any], allowed: frozenset[str], what: str) -> None:
    """400 on a field the route's schema does not name: a typo (``budget`` for ``budget_micro``)
    silently ignored would leave the caller believing a limit was set."""
    unknown = set(body) - allowed
    if unknown:
        raise BadRequest(f"unknown field(s) {sorted(unknown)} for {what}; it takes {sorted(allowed)}",
                         code="invalid_field")
