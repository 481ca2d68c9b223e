"""Authentication: the :class:`~treg.identity.Identity` behind a token or a credential, and the
``X-Treg-Org`` it must match.

Tokens are 256 random bits shown once (``treg_…``, issued by treg/membership.py); only their SHA-256 is
stored, looked up by an index and compared with ``hmac.compare_digest``. A revoked token stops working
at once.

A token has a scope (``treg.identity.SCOPES``). Every caller of :func:`authenticate` admits only ``full``
tokens unless it names the scopes it serves: a management route, MCP, the dashboard's login and the
discovery index never name any, so a ``table`` token (403 ``token_scope``) or a ``demo`` token (403
``demo_not_allowed``) is refused there without code of their own. The call surfaces admit every scope
and check it per surface once the caller is identified (treg/call/intake.py), so the refusal is
audited. A ``demo`` token of an org that is not (or no longer) a public demo is 403 ``demo_disabled``
everywhere, and never cached: enabling the demo again revives it at once (docs/sharing.md).
"""

from __future__ import annotations

import hashlib
import hmac

from sqlalchemy import func, select, update

from treg import logs
from treg.context import Services
from treg.errors import Forbidden, Unauthorized
from treg.identity import DEMO, FULL, SCOPES, TABLE, Credential, Identity
from treg.infra.schema import members, orgs, tokens, users

#: what a route admits when it names nothing: full tokens only
FULL_ONLY = frozenset({FULL})
#: every scope: the call surfaces, which check the scope per surface after identifying the caller
ANY_SCOPE = frozenset(SCOPES)
#: on every answer to a demo token, refusals too
DEMO_HEADER = ("X-Treg-Demo", "1")


def scope_refusal(ident: Identity) -> Forbidden:
    """The 403 of a scoped token where its scope does not reach."""
    if ident.scope == TABLE:
        return Forbidden("this is a read-only table token: it is valid only on GET /table/<endpoint-id>; use a "
                         "full token (POST /api/v1/tokens) for anything else", code="token_scope", refused_by="scope")
    return demo_refusal("a public demo token calls only the demo's endpoints (GET /call/, /catalog/call/ or "
                        "/table/ of an endpoint in TREG_DEMO_ENDPOINTS); no management route, dashboard or MCP")


def demo_refusal(detail: str, **extra: object) -> Forbidden:
    """A demo token's request beyond the demo (403): ``X-Treg-Demo: 1`` rides it (docs/sharing.md)."""
    return Forbidden(detail, code="demo_not_allowed", refused_by="demo", headers=dict([DEMO_HEADER]), **extra)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()  # a non-UTF-8 header: 401, not 500


def cached_identity(svc: Services, token: str | Credential | None, org_hint: str | None,
                    scopes: frozenset[str] = FULL_ONLY) -> Identity | None:
    """:func:`authenticate` when the identity cache knows the token (no coroutine on the hot path);
    None when it must be looked up (or refused) by :func:`authenticate`."""
    if not token or isinstance(token, Credential):
        return None
    ident = svc.caches.identity.get(token.strip())
    return _admitted(svc, ident, org_hint, scopes) if ident is not None else None


async def authenticate(svc: Services, token: str | Credential | None, org_hint: str | None,
                       scopes: frozenset[str] = FULL_ONLY) -> Identity:
    """The caller behind ``token``; 401 when missing/unknown/revoked, 403 when ``org_hint`` differs or
    the token's scope is not among ``scopes`` (a disabled demo's token: 403 ``demo_disabled``)."""
    if isinstance(token, Credential):
        return _admitted(svc, await token.identity(svc), org_hint, scopes)
    if not token:
        raise Unauthorized("send your treg token in the X-Treg-Token header", code="missing_token")
    token = token.strip()
    cache = svc.caches.identity
    # keyed by the token itself, not its digest: SHA-256 through OpenSSL is costly with the CPU's caches
    # cold, as they are between two calls in a busy server (a speed trick: docs/performance.md). The tokens
    # of the identities cached stay in this process's memory as long as the entries do (TREG_CACHE_TTL_S, dropped
    # on any change of the org): the same trade-off as the secrets memo, docs/architecture.md
    ident = cache.get(token)
    if ident is None:
        digest = hash_token(token)
        epoch = cache.snapshot()
        async with svc.db.tx() as tx:
            row = await tx.fetch_one(
                select(tokens.c.id, tokens.c.token_hash, tokens.c.revoked_at, members.c.id.label("member_id"),
                       members.c.role, members.c.project_ids, members.c.org_id, orgs.c.slug, users.c.id.label("user_id"),
                       users.c.email, tokens.c.scope, orgs.c.public_demo, members.c.calls_per_day)
                .select_from(tokens.join(members, members.c.id == tokens.c.member_id)
                             .join(orgs, orgs.c.id == members.c.org_id).join(users, users.c.id == members.c.user_id))
                .where(tokens.c.token_hash == digest))
        # the index found the row by digest; compare in constant time all the same
        if row is None or row["revoked_at"] is not None or not hmac.compare_digest(row["token_hash"], digest):
            raise Unauthorized("the X-Treg-Token is unknown or revoked", code="invalid_token")
        if row["scope"] == DEMO and not row["public_demo"]:
            # never cached: `treg demo enable` revives the token at once (a cached identity of an enabled
            # demo is dropped by `disable`'s change notice, in every process)
            raise Forbidden(f"the public demo of {row['slug']} is disabled; its demo tokens work again once the "
                            "operator enables it (treg demo enable)", code="demo_disabled", refused_by="demo",
                            headers=dict([DEMO_HEADER]))
        ident = Identity(org_id=row["org_id"], org_slug=row["slug"], member_id=row["member_id"],
                         user_id=row["user_id"], email=row["email"], role=row["role"],
                         project_ids=tuple(row["project_ids"]) if row["project_ids"] is not None else None,
                         token_id=row["id"], scope=row["scope"], calls_per_day=row["calls_per_day"])
        cache.put(token, ident, org_id=ident.org_id, epoch=epoch)  # not if a change raced the read
    ident = _admitted(svc, ident, org_hint, scopes)
    if not svc.audit.batches_token_touch:  # no batching writer: noted at once
        async with svc.db.tx() as tx:
            await tx.execute(update(tokens).where(tokens.c.id == ident.token_id).values(last_used_at=func.now()))
    return ident


def _admitted(svc: Services, ident: Identity, org_hint: str | None, scopes: frozenset[str]) -> Identity:
    """``ident`` unless ``org_hint`` names another org or its scope is not among ``scopes`` (403); its
    last use is noted for the batch."""
    logs.CALLER.set((ident.org_id, ident.member_id))  # the access line's org and member
    if ident.scope not in scopes:
        raise scope_refusal(ident)
    if org_hint and org_hint.strip() not in (ident.org_id, ident.org_slug):
        raise Forbidden("this token belongs to another org than X-Treg-Org names", code="wrong_org",
                        headers=dict([DEMO_HEADER]) if ident.is_demo else None)
    svc.audit.touch_token(ident.token_id)
    return ident
