"""Managing connections beyond the store's reads: delete (RFC 7009 revocation first) and the forced
refresh (docs/oauth.md "Managing connections"). The creator, an owner or an admin."""

from __future__ import annotations

import logging
from typing import Any

from treg.context import Services
from treg.errors import NotFound
from treg.identity import Identity
from treg.oauth import apps, refresh, store, token_client

log = logging.getLogger("treg.oauth")


async def delete_connection(svc: Services, ident: Identity, connection_id: str) -> None:
    """Revokes at the provider's ``revoke_url`` when it declares one (the refresh token, with
    ``token_type_hint=refresh_token``; the access token when there is none), then deletes the connection
    and its tokens. A failed revocation is logged and the delete goes on: the grant is still gone from
    treg. A tool binding that names it answers 409 ``connection_missing`` from then on."""
    await store.manageable(svc, ident, connection_id)
    row = await store.fresh_row(svc, ident.org_id, connection_id)
    provider = svc.catalog.providers.get(row["provider"]) if row is not None else None
    block = provider.oauth if provider is not None else None
    if row is not None and row["tokens_blob"] is not None and block is not None and block.revoke_url:
        tokens = store.open_tokens(svc, ident.org_id, connection_id, row["tokens_blob"])
        client = await apps.client_for(svc, ident.org_id, row["provider"])
        if client is None:
            log.warning("oauth: connection %s not revoked: no OAuth app at %s any more", connection_id,
                        row["provider"])
        elif tokens.refresh_token:
            await token_client.revoke(svc, block, client, token=tokens.refresh_token, hint="refresh_token")
        else:
            await token_client.revoke(svc, block, client, token=tokens.access_token, hint="access_token")
    if not await store.delete_row(svc, ident.org_id, connection_id):
        raise NotFound("no such connection visible to you", code="connection_not_found")


async def refresh_connection(svc: Services, ident: Identity, connection_id: str, base: str) -> dict[str, Any]:
    """``POST /api/v1/connections/{id}/refresh``: one refresh now; the connection's detail."""
    await store.manageable(svc, ident, connection_id)
    await refresh.force_refresh(svc, ident.org_id, connection_id)
    return await store.get_connection(svc, ident, connection_id, base)
