"""The refusals of OAuth connections (docs/errors.md, docs/oauth.md "What each status means").

Classes where other code must tell them apart (the call pipeline renders them all alike); plain codes of
the general classes elsewhere (``connection_not_found`` is a ``NotFound``)."""

from __future__ import annotations

from typing import Any

from treg.errors import Conflict, GatewayFailed, NotFound, Unprocessable


class ConnectionNeedsReauth(Conflict):
    """409: the grant was revoked or expired (the token endpoint said ``invalid_grant``); a person must open
    ``connect_url`` to consent again (the same connection: its id and every binding naming it stay)."""

    code, blame = "connection_needs_reauth", "caller"

    def __init__(self, detail: str, *, connect_url: str | None, **kw: Any) -> None:
        hint = ("a person must open connect_url in a browser and consent again; then retry the call"
                if connect_url else "the org has no OAuth app for this provider any more: an owner or admin must "
                "register one (PUT /api/v1/oauth-apps/<provider>)")
        super().__init__(detail, refused_by="credential", connect_url=connect_url, hint=hint, **kw)


class ConnectionMissing(Conflict):
    """409: a tool binding names a connection that was deleted."""

    code, blame = "connection_missing", "org_connection"


class ConnectionNotActive(Conflict):
    """409: the connection is pending (nobody consented yet) or denied."""

    code, blame = "connection_not_active", "org_connection"


class OAuthRefreshFailed(GatewayFailed):
    """502: the token endpoint could not refresh the token (unreachable, 5xx, not JSON, or refused for
    another reason than ``invalid_grant``); the connection stays ``active`` and the next call tries again."""

    code = "oauth_refresh_failed"


class OAuthAppMissing(Unprocessable):
    """422 (404 on ``GET /api/v1/oauth-apps/<provider>``): neither the org nor the deployment has an OAuth
    client at this provider."""

    code = "oauth_app_missing"


class ProviderNotOAuth(NotFound):
    """404 (422 in a request body): no catalog provider of that id declares ``oauth``."""

    code = "oauth_provider_unknown"
