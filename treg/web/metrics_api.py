"""``GET /metrics``: the Prometheus scrape (treg/metrics.py), guarded by ``TREG_METRICS_TOKEN``.

Set: only a request with ``Authorization: Bearer <that token>`` is answered (else 401). Unset: only a
request from a loopback address (else 403), so a treg listening on a public address does not publish
its traffic figures to anyone who asks.
"""

from __future__ import annotations

import hmac
import ipaddress

from aiohttp import web

from treg.errors import Forbidden, Unauthorized
from treg.keys import SERVICES
from treg.metrics import CONTENT_TYPE
from treg.settings import Settings

routes = web.RouteTableDef()


def admit(request: web.Request, settings: Settings) -> None:
    token = settings.metrics_token
    if token is not None:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        # compare_digest on bytes: a non-ASCII header must be refused like any wrong token, not raise
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"),
                                                                 token.reveal().encode()):
            raise Unauthorized("GET /metrics needs Authorization: Bearer <TREG_METRICS_TOKEN>",
                               code="metrics_unauthorized", headers={"WWW-Authenticate": "Bearer"})
        return
    if not _loopback(request.remote):
        raise Forbidden("GET /metrics answers only loopback addresses when TREG_METRICS_TOKEN is unset",
                        code="metrics_forbidden")


def _loopback(remote: str | None) -> bool:
    try:
        addr = ipaddress.ip_address(remote or "")
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


@routes.get("/metrics")
async def scrape(request: web.Request) -> web.Response:
    svc = request.app[SERVICES]
    admit(request, svc.settings)
    metrics = svc.metrics
    await metrics.refresh()
    return web.Response(body=metrics.exposition(), headers={"Content-Type": CONTENT_TYPE})
