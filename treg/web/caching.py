"""No cache between treg and its callers keeps an answer for somebody else.

treg's own answers (the API's JSON, the error body, MCP, /table/'s refusals, OAuth pages) are one
caller's: its org's tools, keys and balance, its token's refusals. A cache in front of treg (a CDN,
nginx's ``proxy_cache``) keys on the URL alone and does not know ``X-Treg-Token`` is a credential; with
``proxy_cache_valid`` it stores any 200 that does not forbid it. So an answer that says nothing of caching
gets ``Cache-Control: no-store``. A relayed answer already carries its own, made ``private`` by
treg/call/headers.py; a page that chose one (the dashboard's ``no-store``, its assets' ``no-cache``) keeps
it.
"""

from __future__ import annotations

from aiohttp import hdrs, web


#: what treg's own answers say
NOT_STORED = "no-store"


async def not_shared(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: runs as each answer's head is about to be written (but a call surface's,
    whose ``RelayResponse`` does the same itself without the signal: treg/web/call.py)."""
    if hdrs.CACHE_CONTROL not in response.headers:
        response.headers[hdrs.CACHE_CONTROL] = NOT_STORED
