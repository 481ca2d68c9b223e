"""The OAuth client of a provider (oauth.md): the org's own (``PUT /api/v1/oauth-apps/<provider>``,
owner or admin; the secret sealed with the secret box, never returned), else the deployment's
(``TREG_OAUTH_CLIENT_ID_<PROVIDER>`` / ``TREG_OAUTH_CLIENT_SECRET_<PROVIDER>``). Read when a consent
starts, a code is exchanged, a token refreshed or revoked: rare enough to go to the database each time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from sqlalchemy import and_, delete, func, select
from sqlalchemy.dialects.postgresql import insert as pg_insert

from treg.catalog.model import Provider
from treg.context import Services
from treg.errors import BadRequest, NotFound
from treg.http_grammar import CTL
from treg.identity import Identity, require_manager
from treg.infra.schema import oauth_apps
from treg.management import refuse_unknown_fields
from treg.oauth.errors import OAuthAppMissing, ProviderNotOAuth

APP_FIELDS = ("client_id", "client_secret")


@dataclass(frozen=True)
class OAuthClient:
    client_id: str
    client_secret: str = field(repr=False)
    source: Literal["org", "deployment"]


def oauth_provider(svc: Services, provider_id: Any, *, status: int = 404) -> Provider:
    """The catalog provider ``provider_id`` when it declares ``oauth``, else 404 (``status``: 422 when the
    id came in a request body)."""
    provider = svc.catalog.providers.get(provider_id) if isinstance(provider_id, str) else None
    if provider is None or provider.oauth is None:
        oauth_ids = sorted(p.id for p in svc.catalog.providers.values() if p.oauth is not None)
        raise ProviderNotOAuth(f"no catalog provider {provider_id!r} declares OAuth; these do: "
                               f"{', '.join(oauth_ids) or '(none)'}", status=status)
    return provider


def _seal_id(provider: str) -> str:
    return f"oauth-app:{provider}"


def _client_field(body: dict[str, Any], key: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value.strip() or len(value) > 2000 or CTL.search(value):
        raise BadRequest(f"{key} must be a non-empty string without control characters (at most 2000)",
                         code="invalid_oauth_app")
    return value.strip()


async def put_app(svc: Services, ident: Identity, provider_id: str, body: dict[str, Any]) -> dict[str, Any]:
    require_manager(ident)
    provider = oauth_provider(svc, provider_id)
    refuse_unknown_fields(body, APP_FIELDS, "an OAuth app")
    client_id, secret = _client_field(body, "client_id"), _client_field(body, "client_secret")
    blob = svc.box.encrypt(secret.encode(), org_id=ident.org_id, secret_id=_seal_id(provider.id))
    stmt = pg_insert(oauth_apps).values(org_id=ident.org_id, provider=provider.id, client_id=client_id,
                                        client_secret_blob=blob, key_id=svc.box.blob_key_id(blob))
    stmt = stmt.on_conflict_do_update(index_elements=[oauth_apps.c.org_id, oauth_apps.c.provider],
                                      set_={"client_id": client_id, "client_secret_blob": blob,
                                            "key_id": svc.box.blob_key_id(blob), "updated_at": func.now()})
    async with svc.db.tx() as tx:
        await tx.execute(stmt)
    return {"provider": provider.id, "client_id": client_id, "source": "org"}


async def get_app(svc: Services, ident: Identity, provider_id: str) -> dict[str, Any]:
    """``{provider, client_id, source}`` (any member: a client id is no secret), 404 when neither the org
    nor the deployment has one."""
    provider = oauth_provider(svc, provider_id)
    client = await client_for(svc, ident.org_id, provider.id)
    if client is None:
        raise OAuthAppMissing(f"neither this org nor the deployment has an OAuth app at {provider.id}; an owner "
                              f"or admin registers one with PUT /api/v1/oauth-apps/{provider.id}", status=404)
    return {"provider": provider.id, "client_id": client.client_id, "source": client.source}


async def delete_app(svc: Services, ident: Identity, provider_id: str) -> None:
    require_manager(ident)
    provider = oauth_provider(svc, provider_id)
    async with svc.db.tx() as tx:
        n = await tx.execute(delete(oauth_apps).where(and_(oauth_apps.c.org_id == ident.org_id,
                                                           oauth_apps.c.provider == provider.id)))
    if not n:
        raise NotFound(f"this org has no OAuth app of its own at {provider.id}", code="oauth_app_missing")


async def client_for(svc: Services, org_id: str, provider: str) -> OAuthClient | None:
    """The org's app at ``provider``, else the deployment's, else None."""
    async with svc.db.tx() as tx:
        row = await tx.fetch_one(select(oauth_apps.c.client_id, oauth_apps.c.client_secret_blob).where(
            and_(oauth_apps.c.org_id == org_id, oauth_apps.c.provider == provider)))
    if row is not None:
        secret = svc.box.decrypt(row["client_secret_blob"], org_id=org_id, secret_id=_seal_id(provider)).decode()
        return OAuthClient(row["client_id"], secret, "org")
    deployment = svc.settings.oauth_client(provider)
    if deployment is not None:
        return OAuthClient(deployment[0], deployment[1].reveal(), "deployment")
    return None
