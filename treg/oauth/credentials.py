"""The thin hooks through which the call pipeline and the catalog use connections (docs/oauth.md "Using a
connection"): each is one call at one place, so the stages stay as they are.

* the relay's injection step: :func:`connection_tokens` (``treg/call/relay.py`` ``prepare``), the access
  token of each connection the bindings name, refreshed first when due, with no database connection held
  across the token endpoint; :func:`mark_stale` after an upstream 401 (``relay.send``);
* the audit row: :func:`credential_kind` (``treg/call/record.py``);
* the catalog ladder's dead end: :func:`no_credential` (``treg/call/catalog_stage.py``), a ``connect_url``
  on a ``no_credential`` refusal for a provider that declares OAuth (or the re-consent of a connection
  that needs one).
"""

from __future__ import annotations

from typing import Iterable

from treg import origin
from treg.bindings import Binding
from treg.context import Services
from treg.errors import TregError
from treg.identity import Identity
from treg.oauth import store
from treg.oauth.refresh import access_token, inactive, mark_stale  # mark_stale: the relay's, named here
from treg.oauth.store import Tokens

__all__ = ["connection_tokens", "credential_kind", "mark_stale", "no_credential", "offer_connect"]


async def connection_tokens(svc: Services, org_id: str, bindings: Iterable[Binding]) -> dict[str, tuple[Tokens, int]]:
    """connection id → (its tokens, their version) for every binding naming a connection."""
    out: dict[str, tuple[Tokens, int]] = {}
    for b in bindings:
        if b.connection_id and b.connection_id not in out:
            out[b.connection_id] = await access_token(svc, org_id, b.connection_id)
    return out


def credential_kind(bindings: Iterable[Binding]) -> tuple[str | None, str | None]:
    """(the audit row's ``credential_kind``, its ``connection_id``): ``oauth`` when a binding injects a
    connection's token, else ``secret`` or ``platform`` by what was bound, None when nothing is."""
    kind = None
    for b in bindings:
        if b.connection_id:
            return "oauth", b.connection_id
        if b.secret_id and kind is None:
            kind = "secret"
        elif b.platform_setting and kind is None:
            kind = "platform"
    return kind, None


async def no_credential(svc: Services, ident: Identity, provider_id: str, exc: TregError) -> TregError:
    """What a catalog call that found no credential for ``provider_id`` answers, when the provider declares
    OAuth: a connection of the caller's there (its own, or the org's shared one) that needs a person to
    consent again is 409 ``connection_needs_reauth`` with the link that re-consents it (the calls it served
    answer that until someone does); else the ``no_credential`` refusal itself, carrying ``connect_url``
    (:func:`offer_connect`). Any other provider: ``exc`` as it is."""
    provider = svc.catalog.providers.get(provider_id)
    if provider is None or provider.oauth is None:
        return exc
    cached = await store.org_connections(svc, ident.org_id)
    lapsed = [r for r in cached.rows.values() if r["provider"] == provider_id and r["status"] == "needs_reauth"
              and (r["shared"] or r["created_by"] == ident.member_id)]
    if lapsed:
        newest = max(lapsed, key=lambda r: (not r["shared"], r["created_at"], r["id"]))  # the own tier first
        return await inactive(svc, newest)
    await offer_connect(svc, ident, provider_id, exc)
    return exc


async def offer_connect(svc: Services, ident: Identity, provider_id: str, exc: TregError) -> None:
    """A catalog call found no credential for ``provider_id``, which declares OAuth: the refusal carries
    ``connect_url`` (the caller's pending connection while its link is valid, else a fresh one) and a
    ``hint`` saying a person must open it; without an OAuth app at the provider, a hint naming who can add
    one. The body stays ``no_credential`` (over HTTP and MCP alike)."""
    offered = await store.pending_link(svc, ident, provider_id, origin.request_base(svc.settings))
    if offered is None:
        exc.extra["hint"] = (f"{provider_id} takes an OAuth connection, and neither this org nor the deployment "
                             f"has an OAuth app there: an owner or admin registers one (PUT /api/v1/oauth-apps/"
                             f"{provider_id}), then POST /api/v1/connections gives a link a person opens")
        return
    exc.extra["connect_url"] = offered["connect_url"]
    exc.extra["connect_expires_at"] = offered["connect_expires_at"].isoformat()
    exc.extra["connection_id"] = offered["id"]
    exc.extra["hint"] = (f"a person must open connect_url in a browser and grant {provider_id} access (the link "
                         "works once, without a treg login, until connect_expires_at); then retry this call")
