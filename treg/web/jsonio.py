"""JSON in and out of handlers: the error body on malformed input, datetimes as ISO 8601."""

from __future__ import annotations

import datetime
import json
from typing import Any

from aiohttp import web

from treg.errors import BadRequest

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


async def read_json_object(request: web.Request) -> dict[str, Any]:
    if request.content_length is not None and request.content_length > MAX_JSON_BYTES:
        raise BadRequest(f"the JSON body is larger than {MAX_JSON_BYTES} bytes", code="body_too_large")
    raw = await request.content.read(MAX_JSON_BYTES + 1)
    if len(raw) > MAX_JSON_BYTES:
        raise BadRequest(f"the JSON body is larger than {MAX_JSON_BYTES} bytes", code="body_too_large")
    if not raw.strip():
        raise BadRequest("send a JSON object as the request body", code="invalid_json")
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the body is not valid JSON: {exc}", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object", code="invalid_json")
    try:
        # a \udXXX escape decodes to a lone surrogate, which no UTF-8 store can hold
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise BadRequest("the JSON body contains an unpaired surrogate escape (\\udXXX), which is not valid text",
                         code="invalid_json") from exc
    return data
