"""A connection's access token for a call, refreshed first when it is due (docs/oauth.md "Refresh").

**One refresh per connection at a time across every process.** In a process, every call that finds the
token due waits on one task (``svc.oauth.inflight``). Across processes, that task first takes the
connection's lease in PostgreSQL (``lease_holder``/``lease_until``, one short transaction, row locked
``FOR UPDATE``), sends the refresh with **no database connection held**, and writes the new tokens only if
the lease is still its own (another short transaction, which releases it). A process that finds the lease
held polls the row (a short read every :data:`POLL_S`, at most ``TREG_OAUTH_REFRESH_LEASE_S``) until the new
token lands (``token_version`` moved), and uses it; until the lease is released without one (the refresh
failed: this call fails the same way, without a second token request); or until the lease expires (its
holder died: this one takes it over). So 50 calls at expiry over two processes make one token request.

Outcomes, each recorded in ``oauth_refreshes`` and counted in ``treg_oauth_refresh_total{outcome}``:

* ``ok``: the tokens replaced whole (a rotated refresh token with them, atomically; an answer without a
  refresh token keeps the old one), ``stale`` cleared, ``token_version`` bumped;
* ``invalid_grant``: the connection becomes ``needs_reauth``; the call answers 409
  ``connection_needs_reauth`` with a ``connect_url`` that re-consents the same connection;
* ``failed`` (the endpoint unreachable, 5xx, not JSON, another OAuth error): 502 ``oauth_refresh_failed``,
  the connection stays ``active``, the lease is released; the next call tries again.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import Any

from sqlalchemy import and_, func, select, update

from treg import logs, origin
from treg.context import Services
from treg.errors import TregError
from treg.ids import new_id
from treg.infra.schema import oauth_connections as conns
from treg.oauth import apps, store, token_client
from treg.oauth.errors import ConnectionMissing, ConnectionNeedsReauth, ConnectionNotActive, OAuthRefreshFailed
from treg.oauth.store import Tokens
from treg.org_changes import changes, forget_local, notify

log = logging.getLogger("treg.oauth")

#: how often a process waiting on another's refresh reads the row
POLL_S = 0.1
_LEASE_COLUMNS = (*store.CACHED_COLUMNS, conns.c.lease_holder, conns.c.lease_until, func.now().label("db_now"))


def _asker() -> str | None:
    """The member whose call this is (noted by authentication, treg/authentication.py), for the consent page."""
    caller = logs.CALLER.get()
    return caller[1] if caller else None


async def inactive(svc: Services, row: dict[str, Any]) -> TregError:
    """The refusal of a call through a connection that is not ``active``."""
    if row["status"] == "needs_reauth":
        link = await store.reconsent_link(svc, row["org_id"], row["id"], _asker(), origin.request_base(svc.settings))
        return ConnectionNeedsReauth(f"connection {row['id']} ({row['provider']}) needs a person to consent again: "
                                     "its grant was revoked or expired", connect_url=link,
                                     connection_id=row["id"])
    what = "nobody has consented yet" if row["status"] == "pending" else "the person or the provider refused it"
    return ConnectionNotActive(f"connection {row['id']} ({row['provider']}) is {row['status']}: {what}; a person "
                               "must open its connect_url (GET /api/v1/connections/<id>) or create a new one",
                               connection_id=row["id"], connection_status=row["status"])


async def access_token(svc: Services, org_id: str, connection_id: str) -> tuple[Tokens, int]:
    """The tokens a call injects from ``connection_id`` (and their version), refreshed first when due."""
    cached = await store.org_connections(svc, org_id)
    row = cached.rows.get(connection_id)
    if row is None:
        raise ConnectionMissing(f"a tool binding names connection {connection_id}, which no longer exists; an "
                                "owner or admin must bind another (PATCH /api/v1/tools/<id>)",
                                connection_id=connection_id)
    if row["status"] != "active":
        raise await inactive(svc, row)
    if row["tokens_blob"] is not None and not store.due(row, svc.settings):
        return cached.tokens(svc, row), row["token_version"]
    return await refresh_shared(svc, row)


async def refresh_shared(svc: Services, row: dict[str, Any], *, force: bool = False) -> tuple[Tokens, int]:
    """This process's one refresh of the connection (started now, or the one in flight joined); each
    caller gets its own copy of a refusal (the edges add their headers to it)."""
    runtime = svc.oauth
    cid = row["id"]
    task = runtime.inflight.get(cid)
    if task is None:
        task = asyncio.get_running_loop().create_task(
            _refresh(svc, row["org_id"], cid, row["token_version"], force), name=f"treg-oauth-refresh-{cid}")
        runtime.inflight[cid] = task

        def done(t: "asyncio.Task[Any]") -> None:
            if runtime.inflight.get(cid) is t:
                del runtime.inflight[cid]
            if not t.cancelled():
                t.exception()  # retrieved: every caller may have gone

        task.add_done_callback(done)
    try:
        return await asyncio.shield(task)  # a caller that leaves does not cancel the others' refresh
    except TregError as exc:
        mine = type(exc).__new__(type(exc))
        mine.__dict__.update(exc.__dict__)
        mine.args = exc.args
        mine.headers, mine.extra = dict(exc.headers), dict(exc.extra)
        raise mine from None


async def _take_lease(svc: Services, org_id: str, cid: str, holder: str, seen_version: int, force: bool,
                      waited: bool) -> tuple[str, dict[str, Any] | None]:
    """One short transaction: ``taken`` (the lease is ours now), ``fresh`` (another refresh landed since
    the caller looked), ``busy`` (another holds a live lease), ``released`` (the lease we waited on was
    given back without a new token), ``inactive`` or ``gone``."""
    async with svc.db.tx() as tx:
        row = await tx.fetch_one(select(*_LEASE_COLUMNS).where(and_(conns.c.id == cid, conns.c.org_id == org_id))
                                 .with_for_update())
        if row is None:
            return "gone", None
        if row["status"] != "active":
            return "inactive", row
        if row["token_version"] != seen_version and (force or not store.due(row, svc.settings, row["db_now"])):
            return "fresh", row
        if row["lease_holder"] is not None and row["lease_until"] is not None and row["lease_until"] > row["db_now"]:
            return "busy", row
        if waited and row["lease_holder"] is None:
            return "released", row
        await tx.execute(update(conns).where(conns.c.id == cid).values(
            lease_holder=holder, lease_until=func.now() + dt.timedelta(seconds=svc.settings.oauth_refresh_lease_s)))
        return "taken", row


async def _refresh(svc: Services, org_id: str, cid: str, seen_version: int, force: bool) -> tuple[Tokens, int]:
    holder = f"{svc.oauth.name}:{new_id('l')[2:12]}"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + svc.settings.oauth_refresh_lease_s + 1.0
    waited = False
    while True:
        verdict, row = await _take_lease(svc, org_id, cid, holder, seen_version, force, waited)
        if verdict == "taken":
            break
        if verdict == "gone":
            raise ConnectionMissing(f"connection {cid} no longer exists", connection_id=cid)
        assert row is not None
        if verdict == "inactive":
            raise await inactive(svc, row)
        if verdict == "fresh":  # another process's refresh landed: its token
            return store.open_tokens(svc, org_id, cid, row["tokens_blob"]), row["token_version"]
        if verdict == "released":
            raise OAuthRefreshFailed("the refresh another treg process ran for this connection failed; the next "
                                     "call tries again", connection_id=cid)
        waited = True
        if loop.time() > deadline:
            raise OAuthRefreshFailed("another treg process has been refreshing this connection's token for longer "
                                     "than TREG_OAUTH_REFRESH_LEASE_S", connection_id=cid)
        await asyncio.sleep(POLL_S)
    assert row is not None
    try:
        return await _run(svc, row, holder)
    except BaseException:
        # whatever ended it (shutdown, a key that cannot open the tokens, a bug): the lease goes back now
        # rather than when it expires; a no-op when the refresh gave it back already
        try:
            await asyncio.shield(_release(svc, row, holder, "failed"))
        except Exception as exc:  # noqa: BLE001 (the lease then expires by itself)
            log.warning("oauth: the lease of connection %s was not released (%s)", row["id"], type(exc).__name__)
        raise


async def _run(svc: Services, row: dict[str, Any], holder: str) -> tuple[Tokens, int]:
    """The lease is ours: the refresh sent (no database connection held while it is awaited)."""
    org_id, cid = row["org_id"], row["id"]
    provider = svc.catalog.providers.get(row["provider"])
    block = provider.oauth if provider is not None else None
    client = await apps.client_for(svc, org_id, row["provider"]) if block is not None else None
    if block is None or client is None:
        await _release(svc, row, holder, "failed")
        raise OAuthRefreshFailed(f"connection {cid} cannot be refreshed: "
                                 + ("the catalog no longer declares OAuth for its provider" if block is None else
                                    "neither the org nor the deployment has an OAuth app at its provider any more"),
                                 blame="org_connection", connection_id=cid)
    old = store.open_tokens(svc, org_id, cid, row["tokens_blob"]) if row["tokens_blob"] is not None else None
    if old is None or not old.refresh_token:
        # nothing to refresh with: only a new consent renews the grant
        return await _needs_reauth(svc, row, holder, "the provider gave no refresh token")
    try:
        answer = await token_client.refresh(svc, block, client, refresh_token=old.refresh_token)
    except token_client.TokenRefused as exc:
        if exc.error == "invalid_grant":
            return await _needs_reauth(svc, row, holder, "the token endpoint answered invalid_grant")
        await _release(svc, row, holder, "failed")
        raise OAuthRefreshFailed(f"the token endpoint refused to refresh connection {cid} ({exc.error}); the "
                                 "connection stays active", connection_id=cid) from None
    except token_client.TokenEndpointDown as exc:
        await _release(svc, row, holder, "failed")
        raise OAuthRefreshFailed(f"the token endpoint could not refresh connection {cid}: {exc.why}; the connection "
                                 "stays active and the next call tries again", connection_id=cid) from None
    fresh = Tokens(answer.access_token, answer.refresh_token or old.refresh_token, answer.token_type or old.token_type)
    version = await _write(svc, row, holder, fresh, answer)
    if version is None:
        # our lease lapsed and another process took it over: our tokens are not written (theirs will be);
        # this call still has a token the provider just issued
        log.warning("oauth: connection %s refreshed after its lease passed to another process; its new tokens "
                    "were not stored", cid)
        return fresh, row["token_version"]
    return fresh, version


async def _write(svc: Services, row: dict[str, Any], holder: str, fresh: Tokens,
                 answer: token_client.TokenAnswer) -> int | None:
    org_id, cid = row["org_id"], row["id"]
    blob = store.seal_tokens(svc, org_id, cid, fresh)
    values: dict[str, Any] = dict(tokens_blob=blob, key_id=svc.box.blob_key_id(blob), expires_at=answer.expires_at,
                                  stale=False, token_version=conns.c.token_version + 1, lease_holder=None,
                                  lease_until=None, last_refreshed_at=func.now(),
                                  refresh_count=conns.c.refresh_count + 1, updated_at=func.now())
    if answer.scopes is not None:
        values["scopes"] = list(answer.scopes)
    async with changes(svc, "connections", org_id) as tx:
        written = await tx.fetch_one(update(conns).where(and_(conns.c.id == cid, conns.c.lease_holder == holder))
                                     .values(**values).returning(conns.c.token_version))
        outcome = "ok" if written is not None else "failed"
        await store.record_refresh(tx, org_id, cid, outcome)  # nothing when the connection was deleted meanwhile
    svc.metrics.oauth_refresh(outcome)
    return written["token_version"] if written is not None else None


async def _release(svc: Services, row: dict[str, Any], holder: str, outcome: str) -> None:
    """The lease given back and the outcome recorded, if the lease is still ours (else nothing: it was
    given back already, or passed to another process); the tokens are unchanged."""
    async with svc.db.tx() as tx:
        released = await tx.execute(update(conns).where(and_(conns.c.id == row["id"], conns.c.lease_holder == holder))
                                    .values(lease_holder=None, lease_until=None))
        if released:
            await store.record_refresh(tx, row["org_id"], row["id"], outcome)
    if released:
        svc.metrics.oauth_refresh(outcome)


async def _needs_reauth(svc: Services, row: dict[str, Any], holder: str, why: str) -> Any:
    org_id, cid = row["org_id"], row["id"]
    async with changes(svc, "connections", org_id) as tx:
        await tx.execute(update(conns).where(and_(conns.c.id == cid, conns.c.lease_holder == holder))
                         .values(status="needs_reauth", lease_holder=None, lease_until=None, updated_at=func.now()))
        await store.record_refresh(tx, org_id, cid, "invalid_grant")
    svc.metrics.oauth_refresh("invalid_grant")
    link = await store.reconsent_link(svc, org_id, cid, _asker(), origin.request_base(svc.settings))
    raise ConnectionNeedsReauth(f"connection {cid} ({row['provider']}) needs a person to consent again: {why} "
                                "(the grant was revoked or expired)", connect_url=link, connection_id=cid)


async def force_refresh(svc: Services, org_id: str, cid: str) -> tuple[Tokens, int]:
    """``POST /api/v1/connections/{id}/refresh``: one refresh now, whatever the expiry (joining one in
    flight); 409 ``connection_not_active`` for a connection that is not ``active``."""
    row = await store.fresh_row(svc, org_id, cid)
    if row is None:
        raise ConnectionMissing(f"connection {cid} no longer exists", connection_id=cid)
    if row["status"] != "active":
        link = None
        if row["status"] == "needs_reauth":  # the way out, as a call through it would answer
            link = await store.reconsent_link(svc, org_id, cid, _asker(), origin.request_base(svc.settings))
        raise ConnectionNotActive(f"connection {cid} is {row['status']}, not active: only an active connection "
                                  "has a token to refresh", connection_id=cid, connection_status=row["status"],
                                  connect_url=link)
    return await refresh_shared(svc, row, force=True)


async def mark_stale(svc: Services, org_id: str, used: tuple[tuple[str, int], ...]) -> None:
    """An upstream answered 401 to a call made with these connections' tokens (id, version): each is
    marked stale (only if that token is still the current one), so the next call refreshes first."""
    for cid, version in used:
        try:
            async with svc.db.tx() as tx:
                n = await tx.execute(update(conns).where(and_(conns.c.id == cid, conns.c.org_id == org_id,
                                                              conns.c.token_version == version,
                                                              conns.c.stale.is_(False), conns.c.status == "active"))
                                     .values(stale=True, updated_at=func.now()))
                if n:
                    await notify(tx, "connections", org_id)
        except TregError as exc:  # the answer is relayed all the same; the token's expiry still refreshes it
            log.warning("oauth: connection %s could not be marked stale (%s)", cid, exc.code)
            continue
        if n:
            forget_local(svc, org_id)
