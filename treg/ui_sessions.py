"""The dashboard's sessions: a login with a treg token becomes a server-side row behind a cookie.

The cookie carries 256 random bits; the row stores only their SHA-256 (as tokens are stored), so a
read of the database cannot be replayed as a cookie. Each session has its own CSRF token, compared in
constant time on every state change and on cookie-identified calls (``X-Treg-CSRF``). A session ends
at its expiry (``TREG_UI_SESSION_TTL_S``), at logout, and when the token it was opened with is revoked
or its member removed. Plain Python: the dashboard's handlers (treg/web/dashboard/) and the call
surfaces' authentication (treg/authentication.py) share it.

**Login CSRF.** A login needs, besides the right Origin (the edge checks it), the login form's own
token: ``GET /ui/login`` sets a pre-login cookie ``treg_login`` (256 random bits) and puts in the form
``<issued>.<HMAC of the cookie and the time>`` under a key derived from the master key for this purpose
only (treg/infra/form_tokens.py, purpose ``treg-login-form``). No row and nothing in one process's memory: any treg
process holding the master key (current or previous) checks it, for :data:`LOGIN_FORM_TTL_S`.
"""

from __future__ import annotations

import datetime as dt
import hmac
import re
import secrets as pysecrets
from dataclasses import dataclass

from sqlalchemy import and_, delete, func, insert, select, update

from treg.authentication import authenticate, hash_token
from treg.context import Services
from treg.errors import BadRequest, Unauthorized
from treg.identity import Credential, Identity
from treg.infra import form_tokens
from treg.infra.schema import members, orgs, tokens, ui_sessions, users

COOKIE = "treg_session"
#: the pre-login cookie a login form's token is bound to
LOGIN_COOKIE = "treg_login"
#: how long a login form stays good: a form left open longer is re-shown with a fresh token
LOGIN_FORM_TTL_S = 3600
_LOGIN_NONCE = re.compile(r"[A-Za-z0-9_-]{43}")
#: the login form's token (treg/infra/form_tokens.py)
_LOGIN_PURPOSE = "treg-login-form"


@dataclass(frozen=True)
class Session:
    """A live session: who it is, and the CSRF token its forms and cookie calls must carry."""

    identity: Identity
    csrf: str
    expires_at: dt.datetime


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def new_login_nonce() -> str:
    """A pre-login cookie's value."""
    return pysecrets.token_urlsafe(32)


def login_nonce(value: str | None) -> str | None:
    """``value`` when it is a pre-login cookie's shape, else None (a tampered or foreign cookie)."""
    return value if value and _LOGIN_NONCE.fullmatch(value) else None


def login_form_token(svc: Services, nonce: str, *, now: float | None = None) -> str:
    """The token of a login form shown to the holder of pre-login cookie ``nonce``."""
    return form_tokens.issue(svc.box, _LOGIN_PURPOSE, nonce, now=now)


def login_form_ok(svc: Services, nonce: str | None, token: str | None, *, now: float | None = None) -> bool:
    """Whether ``token`` is a login form's token issued by a treg process for this pre-login cookie, within
    :data:`LOGIN_FORM_TTL_S`."""
    nonce = login_nonce(nonce)
    return nonce is not None and form_tokens.valid(svc.box, _LOGIN_PURPOSE, nonce, token, LOGIN_FORM_TTL_S,
                                                   now=now)


async def orgs_of_token(svc: Services, token: str) -> list[dict[str, str]]:
    """The orgs the token's user belongs to (for the login form's Org choice); empty when the token is
    unknown or revoked. Only slugs: the login page shows them to whoever holds the token."""
    digest = hash_token(token.strip())
    async with svc.db.tx() as tx:
        row = await tx.fetch_one(select(members.c.user_id).select_from(tokens.join(members, members.c.id == tokens.c.member_id))
                                 .where(and_(tokens.c.token_hash == digest, tokens.c.revoked_at.is_(None))))
        if row is None:
            return []
        return await tx.fetch_all(select(orgs.c.id, orgs.c.slug).select_from(members.join(orgs, orgs.c.id == members.c.org_id))
                                  .where(members.c.user_id == row["user_id"]).order_by(orgs.c.slug))


async def login(svc: Services, token: str | None, org_hint: str | None) -> tuple[str, Session]:
    """A new session for the holder of ``token`` (checked exactly as ``X-Treg-Token`` with ``X-Treg-Org``
    is: 401 unknown, 403 another org); returns the cookie value and the session."""
    if not token or not token.strip():
        raise BadRequest("enter your treg token (treg init printed it; an admin can issue you one)",
                         code="missing_token")
    ident = await authenticate(svc, token.strip(), org_hint or None)
    session_id = pysecrets.token_urlsafe(32)
    csrf = pysecrets.token_urlsafe(32)
    expires = _now() + dt.timedelta(seconds=svc.settings.ui_session_ttl_s)
    async with svc.db.tx() as tx:
        # expired rows of anyone are dropped as new ones come: the table stays the size of live sessions
        await tx.execute(delete(ui_sessions).where(ui_sessions.c.expires_at < func.now()))
        await tx.execute(insert(ui_sessions).values(id_hash=hash_token(session_id), org_id=ident.org_id,
                                                    member_id=ident.member_id, token_id=ident.token_id, csrf=csrf,
                                                    expires_at=expires))
    return session_id, Session(ident, csrf, expires)


async def lookup(svc: Services, session_id: str | None) -> Session | None:
    """The live session behind a cookie value, None when there is none (unknown, expired, logged out,
    its token revoked). Read from the database each time: a logout or a revocation counts at once."""
    if not session_id or len(session_id) > 100:
        return None
    digest = hash_token(session_id)
    async with svc.db.tx() as tx:
        row = await tx.fetch_one(
            select(ui_sessions.c.id_hash, ui_sessions.c.csrf, ui_sessions.c.expires_at, tokens.c.id.label("token_id"),
                   members.c.id.label("member_id"), members.c.role, members.c.project_ids, members.c.org_id,
                   orgs.c.slug, users.c.id.label("user_id"), users.c.email, members.c.calls_per_day)
            .select_from(ui_sessions.join(tokens, tokens.c.id == ui_sessions.c.token_id)
                         .join(members, members.c.id == ui_sessions.c.member_id)
                         .join(orgs, orgs.c.id == members.c.org_id).join(users, users.c.id == members.c.user_id))
            .where(and_(ui_sessions.c.id_hash == digest, ui_sessions.c.revoked_at.is_(None),
                        ui_sessions.c.expires_at > func.now(), tokens.c.revoked_at.is_(None))))
    if row is None or not hmac.compare_digest(row["id_hash"], digest):
        return None
    ident = Identity(org_id=row["org_id"], org_slug=row["slug"], member_id=row["member_id"], user_id=row["user_id"],
                     email=row["email"], role=row["role"],
                     project_ids=tuple(row["project_ids"]) if row["project_ids"] is not None else None,
                     token_id=row["token_id"], calls_per_day=row["calls_per_day"])
    return Session(ident, row["csrf"], row["expires_at"])


def csrf_ok(session: Session, sent: str | None) -> bool:
    return bool(sent) and hmac.compare_digest(session.csrf.encode(), (sent or "").encode("utf-8", "replace"))


class SessionCookie(Credential):
    """A call's identity from the ``treg_session`` cookie (Try-it), with the ``X-Treg-CSRF`` header sent
    beside it; :func:`treg.authentication.authenticate` asks it for the caller."""

    __slots__ = ("session_id", "csrf")
    session_id: str
    csrf: str | None

    def __init__(self, session_id: str, csrf: str | None) -> None:
        self.session_id, self.csrf = session_id, csrf

    async def identity(self, svc: Services) -> Identity:
        return await identify_call(svc, self)


async def identify_call(svc: Services, cookie: SessionCookie) -> Identity:
    """The identity of a call made with the session cookie (Try-it): only together with the session's
    CSRF token in ``X-Treg-CSRF``, since a browser attaches the cookie to any request another site makes."""
    if not cookie.csrf:
        raise Unauthorized("a dashboard session cookie identifies a call only with its X-Treg-CSRF header; "
                           "scripts send X-Treg-Token", code="missing_csrf")
    session = await lookup(svc, cookie.session_id)
    if session is None:
        raise Unauthorized("the dashboard session is unknown, expired or logged out; log in again at /ui/login",
                           code="invalid_session")
    if not csrf_ok(session, cookie.csrf):
        raise Unauthorized("X-Treg-CSRF does not match this dashboard session", code="invalid_csrf")
    return session.identity


async def logout(svc: Services, session_id: str) -> None:
    async with svc.db.tx() as tx:
        await tx.execute(update(ui_sessions).where(ui_sessions.c.id_hash == hash_token(session_id))
                         .values(revoked_at=func.now()))
