"""The edge's reading of a trusted proxy's ``X-Forwarded-*`` (the rules: treg/forwarded.py): the
connection's peer and the request's headers handed to the plain functions, with the app's
``TREG_TRUSTED_PROXIES``."""

from __future__ import annotations

from aiohttp import web

from treg import forwarded
from treg.keys import SETTINGS


def _trusted(request: web.BaseRequest) -> tuple[forwarded.Network, ...]:
    try:
        settings = request.app.get(SETTINGS)  # type: ignore[attr-defined]
    except (AttributeError, AssertionError):
        # a request aiohttp's parser refused was never routed: it has no app (aiohttp asserts that), and
        # its access line names the peer
        return ()
    return forwarded.trusted_networks(settings.trusted_proxies) if settings is not None else ()


def client(request: web.BaseRequest) -> str | None:
    """The client's address: the peer's, or what a trusted proxy says it is."""
    peer = request.remote
    trusted = _trusted(request)
    return forwarded.client_address(peer, request.headers.items(), trusted) if trusted else peer


def scheme(request: web.BaseRequest) -> str:
    """``https`` when the connection is TLS or a trusted proxy says the client's was, else ``http``."""
    if request.secure:
        return "https"
    trusted = _trusted(request)
    if trusted and forwarded.forwarded_proto(request.remote, request.headers.items(), trusted) == "https":
        return "https"
    return "http"
