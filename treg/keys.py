"""Every typed application key, in one module (aiohttp's "no singletons": state lives on the app)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

if TYPE_CHECKING:
    from treg.context import Services
    from treg.settings import Settings

SETTINGS: web.AppKey["Settings"] = web.AppKey("settings")
SERVICES: web.AppKey["Services"] = web.AppKey("services")
CLIENT: web.AppKey[aiohttp.ClientSession] = web.AppKey("client")

#: extra headers treg.web.errors adds to a refusal of this request (X-Treg-Call-Id on call surfaces)
ERROR_HEADERS: web.RequestKey[dict[str, str]] = web.RequestKey("error_headers", dict)

#: the fields a management route's JSON body may hold, when its OpenAPI schema is closed
#: (``additionalProperties: false``): set by treg.web.errors.add_routes, enforced by read_json_object
BODY_FIELDS: web.RequestKey[frozenset[str]] = web.RequestKey("body_fields", frozenset)
