"""The consent flow (oauth.md "The consent flow"), as plain use cases the pages of ``treg/web/oauth_pages.py``
call: the link's page, its button, the callback.

1. :func:`open_link` (``GET /oauth/connect/<opaque>``, no treg login): what the page names (the org's
   slug, the member who asked, the provider, the scopes) and the page's form token. A GET never uses
   the link up (link previews and scanners fetch links).
2. :func:`press_button` (its ``POST``): the form token checked, the link used up in one transaction, a
   single-use ``state`` (valid ``TREG_OAUTH_CONNECT_TTL_S``) bound to the connection and to this browser
   (its ``treg_oauth_state`` cookie), a PKCE verifier sealed; the authorization URL to send the browser to.
3. :func:`callback` (``GET /oauth/callback``): the state checked and used up (a replay finds nothing and
   changes nothing; a state from another browser changes nothing), then the code exchanged with no database
   connection held; the tokens sealed, the connection ``active``; a refusal makes it ``denied``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import urlencode

from sqlalchemy import and_, delete, func, select, update

from treg.context import Services
from treg.errors import BadRequest, Forbidden, GatewayFailed, Gone, NotFound, Unprocessable
from treg.infra.schema import oauth_connections as conns
from treg.oauth import apps, links, store, token_client
from treg.oauth.store import Tokens
from treg.org_changes import changes

_LINK_COLUMNS = (conns.c.id, conns.c.org_id, conns.c.provider, conns.c.name, conns.c.status, conns.c.scopes,
                 conns.c.link_hash, conns.c.link_expires_at, func.now().label("db_now"))


@dataclass(frozen=True)
class LinkPage:
    """What the consent page shows."""

    connection_id: str
    connection_name: str
    org_slug: str
    member_email: str | None
    provider_id: str
    provider_name: str
    scopes: tuple[str, ...]
    form_token: str
    reconsent: bool


@dataclass(frozen=True)
class Connected:
    """The callback's success: the page to show, or where to send the browser."""

    connection_id: str
    provider_name: str
    redirect_after: str | None


def _unknown_link() -> NotFound:
    return NotFound("this connect link is unknown or was used already; ask for a new one (the agent that gave it "
                    "to you can make one)", code="connect_link_unknown")


def _expired_link() -> Gone:
    return Gone("this connect link has expired; ask for a new one (the agent that gave it to you can make one)",
                code="connect_link_expired")


async def _link_row(svc: Services, opaque: str, *, lock: bool = False, tx: Any = None) -> dict[str, Any]:
    if not links.opaque_shape(opaque):
        raise _unknown_link()
    q = select(*_LINK_COLUMNS).where(conns.c.link_hash == links.digest(opaque))
    if lock:
        q = q.with_for_update()
    if tx is not None:
        row = await tx.fetch_one(q)
    else:
        async with svc.db.tx() as own:
            row = await own.fetch_one(q)
    if row is None or row["status"] not in ("pending", "needs_reauth"):
        raise _unknown_link()
    return row


async def _expire(svc: Services, row: dict[str, Any]) -> Gone:
    """An expired link: a pending connection behind it is removed (oauth.md); one that needs re-consent
    stays, waiting for a new link."""
    if row["status"] == "pending":
        async with changes(svc, "connections", row["org_id"]) as tx:
            await tx.execute(delete(conns).where(and_(conns.c.id == row["id"], conns.c.status == "pending",
                                                      conns.c.link_hash == row["link_hash"])))
    return _expired_link()


def _provider(svc: Services, provider_id: str) -> Any:
    provider = svc.catalog.providers.get(provider_id)
    if provider is None or provider.oauth is None:
        raise Unprocessable(f"the catalog no longer declares OAuth for {provider_id}", code="oauth_provider_unknown")
    return provider


async def open_link(svc: Services, opaque: str) -> LinkPage:
    row = await _link_row(svc, opaque)
    if row["link_expires_at"] is None or row["link_expires_at"] <= row["db_now"]:
        raise await _expire(svc, row)
    provider = _provider(svc, row["provider"])
    ctx = await store.page_context(svc, row["id"]) or {}
    return LinkPage(connection_id=row["id"], connection_name=row["name"], org_slug=ctx.get("slug", ""),
                    member_email=ctx.get("email"), provider_id=provider.id, provider_name=provider.name or provider.id,
                    scopes=tuple(row["scopes"] or ()), form_token=links.form_token(svc.box, opaque),
                    reconsent=row["status"] == "needs_reauth")


async def press_button(svc: Services, opaque: str, form_token: str | None, browser: str, base: str) -> str:
    """The consent page's POST: the authorization URL (PKCE S256, a fresh state) for the browser whose
    ``treg_oauth_state`` cookie is ``browser``. The link is used up whatever happens after."""
    if not links.opaque_shape(opaque) or not links.form_token_ok(svc.box, opaque, form_token,
                                                                 svc.settings.oauth_connect_ttl_s):
        raise Forbidden("this consent was not sent from its own page (its form token is missing or expired); "
                        "open the link again and press the button there", code="consent_form_invalid")
    first = await _link_row(svc, opaque)
    provider = _provider(svc, first["provider"])
    block = provider.oauth
    client = await apps.client_for(svc, first["org_id"], provider.id)
    if client is None:
        raise Unprocessable(f"the org has no OAuth app at {provider.id} any more; ask an owner or admin to register "
                            "one, then ask for a new link", code="oauth_app_missing")
    state, verifier = links.random_value(), links.pkce_verifier()
    redirect_uri = f"{base}/oauth/callback"
    async with svc.db.tx() as tx:
        row = await _link_row(svc, opaque, lock=True, tx=tx)
        expired = row["link_expires_at"] is None or row["link_expires_at"] <= row["db_now"]
        if not expired:
            await tx.execute(update(conns).where(conns.c.id == row["id"]).values(
                link_hash=None, link_nonce=None, link_expires_at=None, state_hash=links.digest(state),
                state_expires_at=func.now() + dt.timedelta(seconds=svc.settings.oauth_connect_ttl_s),
                browser_hash=links.digest(browser), redirect_uri=redirect_uri,
                verifier_blob=store.seal_verifier(svc, row["org_id"], row["id"], verifier), updated_at=func.now()))
    if expired:
        raise await _expire(svc, row)
    scopes = list(row["scopes"] or ())
    params: list[tuple[str, str]] = [("response_type", "code"), ("client_id", client.client_id),
                                     ("redirect_uri", redirect_uri)]
    if scopes:
        params.append(("scope", block.scope_text(scopes)))
    params += [("state", state), ("code_challenge", links.pkce_challenge(verifier)),
               ("code_challenge_method", "S256"), *block.authorize_params]
    sep = "&" if "?" in block.authorize_url else "?"
    return block.authorize_url + sep + urlencode(params)


def _bad_state(why: str) -> BadRequest:
    return BadRequest(f"this sign-in cannot be finished: {why}. Nothing was changed; open a new connect link to "
                      "try again", code="oauth_state_invalid")


async def callback(svc: Services, query: Mapping[str, str], browser: str | None) -> Connected:
    """``GET /oauth/callback?code&state`` (or ``?error&state``). Raises a TregError the page shows."""
    state = links.well_formed(query.get("state"))
    if state is None:
        raise _bad_state("its state is missing or malformed")
    async with svc.db.tx() as tx:
        row = await tx.fetch_one(select(conns.c.id, conns.c.org_id, conns.c.provider, conns.c.status, conns.c.scopes,
                                        conns.c.browser_hash, conns.c.state_expires_at, conns.c.verifier_blob,
                                        conns.c.redirect_uri, conns.c.redirect_after, conns.c.tokens_blob,
                                        func.now().label("db_now"))
                                 .where(conns.c.state_hash == links.digest(state)).with_for_update())
        if row is None:
            raise _bad_state("its state is unknown or was used already")
        if row["state_expires_at"] is None or row["state_expires_at"] <= row["db_now"]:
            raise _bad_state("it took longer than the sign-in may take")
        cookie = links.well_formed(browser)
        if cookie is None or row["browser_hash"] is None or links.digest(cookie) != row["browser_hash"]:
            # a state started in another browser (a link a third party sent, the provider's page forwarded)
            raise _bad_state("it was started in another browser than this one")
        await tx.execute(update(conns).where(conns.c.id == row["id"]).values(
            state_hash=None, state_expires_at=None, browser_hash=None, verifier_blob=None, updated_at=func.now()))
    org_id, cid = row["org_id"], row["id"]
    provider = _provider(svc, row["provider"])
    name = provider.name or provider.id
    error = query.get("error")
    auth_code = query.get("code")
    if error is not None or not auth_code:
        await _deny(svc, org_id, cid)
        shown = error if error and error.isascii() and error.replace("_", "").isalnum() and len(error) <= 64 else None
        raise BadRequest(f"{name} did not grant access" + (f" ({shown})" if shown else " (no code came back)")
                         + "; the connection is marked denied", code="oauth_denied")
    client = await apps.client_for(svc, org_id, provider.id)
    if client is None or row["verifier_blob"] is None or not row["redirect_uri"]:
        raise Unprocessable("the org has no OAuth app at this provider any more; nothing was stored",
                            code="oauth_app_missing")
    verifier = store.open_verifier(svc, org_id, cid, row["verifier_blob"])
    try:  # no database connection is held while the token endpoint is awaited
        answer = await token_client.exchange_code(svc, provider.oauth, client, auth_code=auth_code,
                                                  redirect_uri=row["redirect_uri"], verifier=verifier)
    except token_client.TokenRefused as exc:
        await _deny(svc, org_id, cid)
        raise BadRequest(f"{name} refused the code this sign-in came back with ({exc.error}); the connection is "
                         "marked denied; open a new connect link to try again", code="oauth_denied") from None
    except token_client.TokenEndpointDown as exc:
        raise GatewayFailed(f"{name}'s token endpoint could not be reached to finish the sign-in: {exc.why}; open "
                            "a new connect link to try again", code="oauth_exchange_failed") from None
    old = store.open_tokens(svc, org_id, cid, row["tokens_blob"]) if row["tokens_blob"] is not None else None
    tokens = Tokens(answer.access_token, answer.refresh_token or (old.refresh_token if old else None),
                    answer.token_type)
    blob = store.seal_tokens(svc, org_id, cid, tokens)
    async with changes(svc, "connections", org_id) as tx:
        await tx.execute(update(conns).where(conns.c.id == cid).values(
            status="active", tokens_blob=blob, key_id=svc.box.blob_key_id(blob), expires_at=answer.expires_at,
            scopes=list(answer.scopes) if answer.scopes is not None else list(row["scopes"] or ()), stale=False,
            token_version=conns.c.token_version + 1, lease_holder=None, lease_until=None, link_hash=None,
            link_nonce=None, link_expires_at=None, updated_at=func.now()))
    return Connected(connection_id=cid, provider_name=name, redirect_after=row["redirect_after"])


async def _deny(svc: Services, org_id: str, cid: str) -> None:
    async with changes(svc, "connections", org_id) as tx:
        await tx.execute(update(conns).where(conns.c.id == cid).values(status="denied", link_hash=None,
                                                                       link_nonce=None, link_expires_at=None,
                                                                       updated_at=func.now()))
