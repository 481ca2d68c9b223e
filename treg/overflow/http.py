"""The one HTTP exchange an aggregator plugin makes, with every transport failure mapped to a value.

An aggregator's key goes in the Authorization header only; nothing here logs a header, a URL's query or
a body, so no key reaches a log.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiohttp

from treg import json_text
from treg.errors import TregError

if TYPE_CHECKING:
    from treg.settings import SecretStr

#: an aggregator answer treg reads is an envelope: a bigger one is not what it asked for
MAX_ANSWER_BYTES = 16 * 1024 * 1024
NOT_JSON = object()


@dataclass(frozen=True)
class Exchange:
    """What came back: the status (None: transport error), the JSON (``NOT_JSON`` when it is not)."""

    status: int | None
    data: Any
    error: str | None = None


async def exchange(session: aiohttp.ClientSession, method: str, url: str, key: "SecretStr",
                   payload: Any = None, timeout_s: float = 60.0) -> Exchange:
    headers = {"Authorization": f"Bearer {key.reveal()}", "Accept": "application/json"}
    try:
        async with session.request(method, url, json=payload, headers=headers, allow_redirects=False,
                                   timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            raw = await resp.content.read(MAX_ANSWER_BYTES + 1)
            status = resp.status
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
        return Exchange(None, NOT_JSON, f"transport error ({type(exc).__name__})")
    except TregError as exc:  # the session's connector refused the host (SSRF guard) or could not resolve it
        return Exchange(None, NOT_JSON, f"refused by treg ({exc.code})")
    if len(raw) > MAX_ANSWER_BYTES:
        return Exchange(status, NOT_JSON, "answer too large")
    try:
        data = json_text.parse(raw)
    except ValueError:  # not JSON, or nested too deeply (treg/json_text.py)
        return Exchange(status, NOT_JSON, "not JSON")
    return Exchange(status, data)


def message_of(data: Any) -> str | None:
    """The aggregator's own error words, cut short (never the vendor's body)."""
    if isinstance(data, dict):
        for key in ("error", "message", "detail"):
            value = data.get(key)
            if isinstance(value, str):
                return value[:500]
            if isinstance(value, dict) and isinstance(value.get("message"), str):
                return value["message"][:500]
    return None
