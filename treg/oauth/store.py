"""Connection rows: created, listed, shown, deleted; their tokens sealed; cached per org beside the secret
rows (docs/oauth.md "Managing connections").

Statuses: ``pending`` (created, nobody consented yet), ``active`` (tokens held), ``needs_reauth`` (the
token endpoint said ``invalid_grant``: a person must consent again), ``denied`` (the person refused, or the
provider refused the code). A member sees their own connections and the shared ones; owners and admins
every one; the creator, an owner or an admin may refresh or delete one.

Every write of a row runs in ``org_changes.changes(svc, "connections", org_id)``: its NOTIFY drops the org's
cached entries in every process, the connection rows among them (:func:`org_connections`, kept in the
secrets cache under their own key), so a refreshed token or a deleted connection is seen by the next call
everywhere.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any, Iterable
from urllib.parse import urlsplit

from sqlalchemy import and_, delete, func, insert, literal, or_, select, update

from treg import origin
from treg.context import Services
from treg.errors import BadRequest, Forbidden, NotFound
from treg.identity import Identity
from treg.ids import new_id
from treg.infra.db import Tx
from treg.infra.schema import members, oauth_connections as conns, oauth_refreshes, users
from treg.management import refuse_unknown_fields
from treg.memo import BoundedMemo
from treg.oauth import apps, links
from treg.oauth.errors import OAuthAppMissing
from treg.catalog.oauth import SCOPE_TOKEN
from treg.org_changes import changes, forget_local, notify
from treg.settings import Settings

STATUSES = ("pending", "active", "needs_reauth", "denied")
CREATE_FIELDS = ("provider", "scopes", "name", "shared", "redirect_after")
#: what a call needs of a connection (cached per org)
CACHED_COLUMNS = (conns.c.id, conns.c.org_id, conns.c.provider, conns.c.name, conns.c.status, conns.c.shared,
                  conns.c.created_by, conns.c.created_at, conns.c.tokens_blob, conns.c.expires_at, conns.c.stale,
                  conns.c.token_version, conns.c.scopes)
PUBLIC_COLUMNS = (conns.c.id, conns.c.provider, conns.c.name, conns.c.status, conns.c.shared, conns.c.scopes,
                  conns.c.expires_at, conns.c.created_by, conns.c.created_at, conns.c.last_refreshed_at,
                  conns.c.refresh_count, conns.c.link_nonce, conns.c.link_hash, conns.c.link_expires_at)
HISTORY = 20
MAX_SCOPES = 50


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


# -- tokens at rest -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tokens:
    """A connection's tokens (never logged: no repr of the values)."""

    access_token: str = field(repr=False)
    refresh_token: str | None = field(default=None, repr=False)
    token_type: str | None = None


def _seal_id(connection_id: str) -> str:
    return f"oauth-connection:{connection_id}"


def seal_tokens(svc: Services, org_id: str, connection_id: str, tokens: Tokens) -> bytes:
    plain = json.dumps({"access_token": tokens.access_token, "refresh_token": tokens.refresh_token,
                        "token_type": tokens.token_type}, separators=(",", ":")).encode()
    return svc.box.encrypt(plain, org_id=org_id, secret_id=_seal_id(connection_id))


def open_tokens(svc: Services, org_id: str, connection_id: str, blob: bytes) -> Tokens:
    data = json.loads(svc.box.decrypt(blob, org_id=org_id, secret_id=_seal_id(connection_id)))
    return Tokens(data["access_token"], data.get("refresh_token"), data.get("token_type"))


def seal_verifier(svc: Services, org_id: str, connection_id: str, verifier: str) -> bytes:
    return svc.box.encrypt(verifier.encode(), org_id=org_id, secret_id=f"oauth-verifier:{connection_id}")


def open_verifier(svc: Services, org_id: str, connection_id: str, blob: bytes) -> str:
    return svc.box.decrypt(blob, org_id=org_id, secret_id=f"oauth-verifier:{connection_id}").decode()


def due(row: dict[str, Any], settings: Settings, at: dt.datetime | None = None) -> bool:
    """Whether a call must refresh ``row``'s token first: an upstream 401 marked it stale, or it expires
    within ``TREG_OAUTH_REFRESH_SKEW_S`` (a token answered without ``expires_in`` has no expiry)."""
    if row["stale"]:
        return True
    expires = row["expires_at"]
    if expires is None:
        return False
    return expires - dt.timedelta(seconds=settings.oauth_refresh_skew_s) <= (at or now())


# -- the per-org cache --------------------------------------------------------------------------------

class OrgConnections:
    """An org's connection rows as cached, and beside them their decrypted tokens, which live exactly as
    long as the rows (a change to any connection of the org, or the cache's TTL, drops both; with the
    caches off nothing is kept), as the secret rows' plaintext does (treg/call/relay.py ``OrgSecrets``)."""

    __slots__ = ("rows", "_tokens")

    def __init__(self, rows: dict[str, dict[str, Any]]) -> None:
        self.rows = rows
        self._tokens: BoundedMemo[tuple[str, int], Tokens] = BoundedMemo(1024)

    def __repr__(self) -> str:
        return f"<OrgConnections {len(self.rows)} rows>"

    def tokens(self, svc: Services, row: dict[str, Any]) -> Tokens:
        key = (row["id"], row["token_version"])
        found = self._tokens.get(key)
        if found is None:
            found = self._tokens.put(key, open_tokens(svc, row["org_id"], row["id"], row["tokens_blob"]))
        return found

    def newest(self, provider: str, ident: Identity) -> tuple[str | None, str | None]:
        """(the caller's own newest active connection at ``provider``, the org's newest shared one)."""
        own = team = None
        best_own = best_team = None
        for r in self.rows.values():
            if r["provider"] != provider or r["status"] != "active":
                continue
            key = (r["created_at"], r["id"])
            if r["shared"]:
                if best_team is None or key > best_team:
                    best_team, team = key, r["id"]
            elif r["created_by"] == ident.member_id:
                if best_own is None or key > best_own:
                    best_own, own = key, r["id"]
        return own, team


async def org_connections(svc: Services, org_id: str) -> OrgConnections:
    """The org's connection rows by id (cached beside its secret rows, dropped with them on any change)."""
    async def load() -> OrgConnections:
        async with svc.db.tx() as tx:
            rows = await tx.fetch_all(select(*CACHED_COLUMNS).where(conns.c.org_id == org_id))
        return OrgConnections({r["id"]: r for r in rows})

    cache = svc.caches.secrets
    key = ("connections", org_id)
    return cache.get(key) or await cache.get_or_load(key, org_id, load)


async def fresh_row(svc: Services, org_id: str, connection_id: str) -> dict[str, Any] | None:
    """The row as the database has it now (not the cache's), for the few paths that must not act on an
    old copy."""
    async with svc.db.tx() as tx:
        return await tx.fetch_one(select(*CACHED_COLUMNS).where(and_(conns.c.org_id == org_id,
                                                                     conns.c.id == connection_id)))


# -- links --------------------------------------------------------------------------------------------

def connect_url(base: str, opaque: str) -> str:
    return f"{base}/oauth/connect/{opaque}"


async def issue_link(svc: Services, tx: Tx, org_id: str, connection_id: str,
                     asked_by: str | None) -> tuple[str, dt.datetime]:
    """A fresh single-use connect link for the connection (the one it had stops working); (opaque, expiry)."""
    nonce = links.random_value()
    opaque = links.link_opaque(svc.box.current, connection_id, nonce)
    ttl = dt.timedelta(seconds=svc.settings.oauth_connect_ttl_s)
    row = await tx.fetch_one(update(conns).where(and_(conns.c.id == connection_id, conns.c.org_id == org_id))
                             .values(link_nonce=nonce, link_hash=links.digest(opaque), asked_by=asked_by,
                                     link_expires_at=func.now() + ttl, updated_at=func.now())
                             .returning(conns.c.link_expires_at))
    assert row is not None
    return opaque, row["link_expires_at"]


def live_link(svc: Services, row: dict[str, Any], at: dt.datetime | None = None) -> str | None:
    """The opaque of the row's connect link while it is valid and unused, None otherwise."""
    if not row.get("link_hash") or not row.get("link_nonce") or row.get("link_expires_at") is None:
        return None
    if row["link_expires_at"] <= (at or now()):
        return None
    return links.reproduce_link(svc.box, row["id"], row["link_nonce"], row["link_hash"])


async def remove_expired_pending(tx: Tx, org_id: str) -> int:
    """oauth.md: a pending connection whose link expired is removed (its button pressed and its state
    expired too, or never pressed)."""
    return await tx.execute(delete(conns).where(and_(
        conns.c.org_id == org_id, conns.c.status == "pending",
        func.coalesce(conns.c.state_expires_at, conns.c.link_expires_at, conns.c.created_at) < func.now(),
        or_(conns.c.link_expires_at.is_(None), conns.c.link_expires_at < func.now()))))


# -- creating -----------------------------------------------------------------------------------------

def check_redirect_after(value: Any, own: Iterable[str]) -> str | None:
    """``value`` when it is an http(s) URL on treg's own origin (any path, a query allowed), else 400."""
    if value is None:
        return None
    ok = isinstance(value, str) and 0 < len(value) <= 2000 and value.isprintable() and " " not in value \
        and "\\" not in value
    if ok:
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018
        except ValueError:
            ok = False
        else:
            ok = (parts.scheme in ("http", "https") and parts.username is None and "@" not in parts.netloc
                  and not parts.fragment and origin.origin_of_url(value) in set(own))
    if not ok:
        raise BadRequest("redirect_after must be a URL on treg's own origin (where a person lands once the "
                         "connection is made), such as " + (sorted(own)[0] + "/ui/connections" if own else
                                                            "https://<treg>/ui/connections"),
                         code="invalid_redirect_after")
    return value


def _check_scopes(raw: Any, default: tuple[str, ...]) -> list[str]:
    if raw is None or raw == []:
        return list(default)
    if not isinstance(raw, list) or len(raw) > MAX_SCOPES or not all(
            isinstance(s, str) and SCOPE_TOKEN.fullmatch(s) for s in raw):
        raise BadRequest(f"scopes must be a list of at most {MAX_SCOPES} scope strings (printable ASCII without "
                         "space, '\"' or '\\')", code="invalid_scopes")
    return list(dict.fromkeys(raw))


async def create_connection(svc: Services, ident: Identity, body: dict[str, Any], *, base: str,
                            own: Iterable[str]) -> dict[str, Any]:
    """``POST /api/v1/connections``: a pending connection and its single-use ``connect_url``."""
    refuse_unknown_fields(body, CREATE_FIELDS, "a connection")
    provider = apps.oauth_provider(svc, body.get("provider"), status=422)
    assert provider.oauth is not None
    scopes = _check_scopes(body.get("scopes"), provider.oauth.scopes)
    name = body.get("name", provider.id)
    if not isinstance(name, str) or not name.strip() or len(name) > 200 or not name.isprintable():
        raise BadRequest("a connection's name is 1-200 printable characters", code="invalid_name")
    shared = body.get("shared", False)
    if not isinstance(shared, bool):
        raise BadRequest("shared must be true or false", code="invalid_shared")
    if shared and not ident.is_manager:
        raise Forbidden("only an org owner or admin may make a shared (the team's) connection", code="forbidden_role")
    redirect_after = check_redirect_after(body.get("redirect_after"), own)
    if await apps.client_for(svc, ident.org_id, provider.id) is None:
        raise OAuthAppMissing(f"neither this org nor the deployment has an OAuth app at {provider.id}: an owner or "
                              f"admin registers one (PUT /api/v1/oauth-apps/{provider.id}), or the operator sets "
                              f"TREG_OAUTH_CLIENT_ID_{provider.id.upper().replace('-', '_')}")
    connection_id = new_id("conn")
    async with changes(svc, "connections", ident.org_id) as tx:
        await remove_expired_pending(tx, ident.org_id)
        await tx.execute(insert(conns).values(
            id=connection_id, org_id=ident.org_id, provider=provider.id, name=name.strip(), status="pending",
            shared=shared, created_by=ident.member_id, scopes=scopes, redirect_after=redirect_after))
        opaque, expires = await issue_link(svc, tx, ident.org_id, connection_id, ident.member_id)
    return {"id": connection_id, "provider": provider.id, "name": name.strip(), "status": "pending",
            "shared": shared, "scopes": scopes, "connect_url": connect_url(base, opaque),
            "connect_expires_at": expires}


async def pending_link(svc: Services, ident: Identity, provider: str, base: str) -> dict[str, Any] | None:
    """For a catalog call that found no credential (oauth.md "Using a connection"): the caller's newest
    pending connection at ``provider`` while its link is valid, else a fresh one; None when the org has no
    OAuth app there (nobody could consent). ``{id, connect_url, connect_expires_at}``."""
    async with svc.db.tx() as tx:
        rows = await tx.fetch_all(select(conns.c.id, conns.c.link_nonce, conns.c.link_hash, conns.c.link_expires_at,
                                         func.now().label("db_now"))
                                  .where(and_(conns.c.org_id == ident.org_id, conns.c.provider == provider,
                                              conns.c.status == "pending", conns.c.shared.is_(False),
                                              conns.c.created_by == ident.member_id,
                                              conns.c.link_expires_at > func.now()))
                                  .order_by(conns.c.created_at.desc(), conns.c.id.desc()).limit(5))
    for row in rows:
        opaque = live_link(svc, row, row["db_now"])
        if opaque is not None:
            return {"id": row["id"], "connect_url": connect_url(base, opaque),
                    "connect_expires_at": row["link_expires_at"]}
    if await apps.client_for(svc, ident.org_id, provider) is None:
        return None
    block = svc.catalog.providers[provider].oauth
    assert block is not None
    connection_id = new_id("conn")
    async with changes(svc, "connections", ident.org_id) as tx:
        await remove_expired_pending(tx, ident.org_id)
        await tx.execute(insert(conns).values(id=connection_id, org_id=ident.org_id, provider=provider, name=provider,
                                              status="pending", shared=False, created_by=ident.member_id,
                                              scopes=list(block.scopes)))
        opaque, expires = await issue_link(svc, tx, ident.org_id, connection_id, ident.member_id)
    return {"id": connection_id, "connect_url": connect_url(base, opaque), "connect_expires_at": expires}


async def reconsent_link(svc: Services, org_id: str, connection_id: str, member_id: str | None,
                         base: str) -> str | None:
    """A ``connect_url`` that re-consents the same connection (its id and bindings stay): the one issued
    already while valid, else a fresh one; None when the connection is gone or no OAuth app is left."""
    async with svc.db.tx() as tx:
        row = await tx.fetch_one(select(conns.c.id, conns.c.provider, conns.c.link_nonce, conns.c.link_hash,
                                        conns.c.link_expires_at, func.now().label("db_now"))
                                 .where(and_(conns.c.org_id == org_id, conns.c.id == connection_id)))
    if row is None:
        return None
    opaque = live_link(svc, row, row["db_now"])
    if opaque is not None:
        return connect_url(base, opaque)
    if await apps.client_for(svc, org_id, row["provider"]) is None:
        return None
    async with changes(svc, "connections", org_id) as tx:
        opaque, _ = await issue_link(svc, tx, org_id, connection_id, member_id)
    return connect_url(base, opaque)


# -- reading ------------------------------------------------------------------------------------------

def visible(ident: Identity, row: dict[str, Any]) -> bool:
    return ident.is_manager or bool(row["shared"]) or row["created_by"] == ident.member_id


def may_manage(ident: Identity, row: dict[str, Any]) -> bool:
    """The creator, an owner or an admin may refresh or delete a connection."""
    return ident.is_manager or row["created_by"] == ident.member_id


def connection_json(svc: Services, row: dict[str, Any], base: str, at: dt.datetime | None = None) -> dict[str, Any]:
    """What a connection shows (never a token): with its connect link while one is valid (a pending
    connection, or one that needs re-consent)."""
    out = {k: row[k] for k in ("id", "provider", "name", "status", "shared", "scopes", "expires_at", "created_by",
                               "created_at", "last_refreshed_at", "refresh_count")}
    opaque = live_link(svc, row, at) if row["status"] in ("pending", "needs_reauth") else None
    out["connect_url"] = connect_url(base, opaque) if opaque else None
    out["connect_expires_at"] = row["link_expires_at"] if opaque else None
    return out


async def list_connections(svc: Services, ident: Identity, base: str) -> list[dict[str, Any]]:
    """Newest first: a member's own and the shared ones; an owner's or admin's every one."""
    async with svc.db.tx() as tx:
        removed = await remove_expired_pending(tx, ident.org_id)
        if removed:
            await notify(tx, "connections", ident.org_id)
        db_now = await tx.scalar("SELECT now()")
        rows = await tx.fetch_all(select(*PUBLIC_COLUMNS).where(conns.c.org_id == ident.org_id)
                                  .order_by(conns.c.created_at.desc(), conns.c.id.desc()))
    if removed:
        forget_local(svc, ident.org_id)
    return [connection_json(svc, r, base, db_now) for r in rows if visible(ident, r)]


async def load_visible(svc: Services, ident: Identity, connection_id: str) -> dict[str, Any]:
    async with svc.db.tx() as tx:
        row = await tx.fetch_one(select(*PUBLIC_COLUMNS, func.now().label("db_now"))
                                 .where(and_(conns.c.org_id == ident.org_id, conns.c.id == connection_id)))
    if row is None or not visible(ident, row):
        raise NotFound("no such connection visible to you (GET /api/v1/connections lists them)",
                       code="connection_not_found")
    return row


async def get_connection(svc: Services, ident: Identity, connection_id: str, base: str) -> dict[str, Any]:
    """One connection, with ``refreshes``: the last 20 ``{at, outcome}``, newest first."""
    row = await load_visible(svc, ident, connection_id)
    out = connection_json(svc, row, base, row["db_now"])
    async with svc.db.tx() as tx:
        out["refreshes"] = await tx.fetch_all(select(oauth_refreshes.c.at, oauth_refreshes.c.outcome)
                                              .where(oauth_refreshes.c.connection_id == connection_id)
                                              .order_by(oauth_refreshes.c.at.desc(), oauth_refreshes.c.id.desc())
                                              .limit(HISTORY))
    return out


async def manageable(svc: Services, ident: Identity, connection_id: str) -> dict[str, Any]:
    """The row of a connection the caller may refresh or delete (404 when it cannot see it, 403 when it
    sees it but may not manage it)."""
    row = await load_visible(svc, ident, connection_id)
    if not may_manage(ident, row):
        raise Forbidden("only the connection's creator, an owner or an admin may do this", code="forbidden_role")
    return row


async def delete_row(svc: Services, org_id: str, connection_id: str) -> bool:
    async with changes(svc, "connections", org_id) as tx:
        return bool(await tx.execute(delete(conns).where(and_(conns.c.org_id == org_id,
                                                              conns.c.id == connection_id))))


async def page_context(svc: Services, row_id: str) -> dict[str, Any] | None:
    """What the consent page names: the org's slug and the email of the member who asked."""
    from treg.infra.schema import orgs

    asker = members.alias("asker")
    async with svc.db.tx() as tx:
        return await tx.fetch_one(
            select(orgs.c.slug, users.c.email)
            .select_from(conns.join(orgs, orgs.c.id == conns.c.org_id)
                         .outerjoin(asker, asker.c.id == func.coalesce(conns.c.asked_by, conns.c.created_by))
                         .outerjoin(users, users.c.id == asker.c.user_id))
            .where(conns.c.id == row_id))


async def record_refresh(tx: Tx, org_id: str, connection_id: str, outcome: str) -> None:
    """One refresh's outcome in the connection's history (none when the connection was deleted meanwhile)."""
    rows = select(literal(new_id("ref")), conns.c.id, conns.c.org_id, literal(outcome)).where(
        and_(conns.c.id == connection_id, conns.c.org_id == org_id))
    await tx.execute(insert(oauth_refreshes).from_select(
        [oauth_refreshes.c.id, oauth_refreshes.c.connection_id, oauth_refreshes.c.org_id, oauth_refreshes.c.outcome],
        rows))
