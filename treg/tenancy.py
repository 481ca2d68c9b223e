"""Tenancy: orgs, users, members and their roles, projects, API tokens, and who the caller is.

Tokens are 256 random bits shown once (``treg_…``); only their SHA-256 is stored, looked up by an
index and compared with ``hmac.compare_digest``. A revoked token stops working at once.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import re
import secrets as pysecrets
from dataclasses import dataclass
from typing import Any, AsyncIterator, Sequence

from sqlalchemy import and_, delete, func, insert, select, update

from treg import logs
from treg.context import Services
from treg.errors import BadRequest, Conflict, Forbidden, IntegrityError, NotFound, Unauthorized, Unprocessable
from treg.ids import new_id
from treg.infra.db import Tx
from treg.infra.schema import members, orgs, projects, tokens, users

ROLES = ("owner", "admin", "member")
MANAGER_ROLES = ("owner", "admin")
TOKEN_PREFIX = "treg_"
_SLUG = re.compile(r"\A[a-z0-9][a-z0-9-]{0,62}\Z")
_EMAIL = re.compile(r"\A[^@\s]+@[^@\s]+\Z")


@dataclass(frozen=True)
class Identity:
    """Who is calling: resolved from ``X-Treg-Token`` (and checked against ``X-Treg-Org``)."""

    org_id: str
    org_slug: str
    member_id: str
    user_id: str
    email: str
    role: str
    #: None: every project of the org
    project_ids: tuple[str, ...] | None
    token_id: str

    @property
    def is_manager(self) -> bool:
        return self.role in MANAGER_ROLES


class Credential(str):
    """A call's identity that is not a token (the dashboard's session cookie, treg/ui_sessions.py): its
    own :meth:`identity` finds the caller. Its text is empty, so nothing that reads it as a token (the
    identity cache) can match it; :func:`authenticate` asks it instead of the tokens table."""

    def __new__(cls) -> "Credential":
        return super().__new__(cls, "")

    async def identity(self, svc: Services) -> Identity:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}('***')"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()  # a non-UTF-8 header: 401, not 500


def new_token() -> str:
    return TOKEN_PREFIX + pysecrets.token_urlsafe(32)


def check_slug(slug: str) -> str:
    if not isinstance(slug, str) or not _SLUG.fullmatch(slug):  # fullmatch: "$" alone lets "acme\n" in
        raise BadRequest("an org slug is 1-63 characters of a-z, 0-9 and '-', starting with a letter or digit",
                         code="invalid_slug")
    return slug


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: argv bytes that were not UTF-8, or a \udXXX escape
        return False
    return True


def check_email(email: Any) -> str:
    if (not isinstance(email, str) or not _EMAIL.fullmatch(email.strip()) or len(email) > 320
            or not email.isprintable() or not _encodable(email)):  # NUL, controls, argv's undecodable bytes
        raise BadRequest("email must look like name@example.com", code="invalid_email")
    return email.strip().lower()


async def _user_for(tx: Tx, email: str) -> str:
    row = await tx.fetch_one(select(users.c.id).where(users.c.email == email))
    if row:
        return row["id"]
    user_id = new_id("usr")
    await tx.execute(insert(users).values(id=user_id, email=email))
    return user_id


async def issue_token(tx: Tx, *, org_id: str, member_id: str) -> str:
    token = new_token()
    await tx.execute(insert(tokens).values(id=new_id("tok"), org_id=org_id, member_id=member_id,
                                           token_hash=hash_token(token), prefix=token[:12]))
    return token


async def create_org(svc: Services, *, slug: str, email: str) -> dict[str, Any]:
    """A new org with its owner; returns ``{org_id, org_slug, member_id, user_id, token}``."""
    slug, email = check_slug(slug), check_email(email)
    try:
        async with svc.db.tx() as tx:
            org_id = new_id("org")
            await tx.execute(insert(orgs).values(id=org_id, slug=slug))
            user_id = await _user_for(tx, email)
            member_id = new_id("mem")
            await tx.execute(insert(members).values(id=member_id, org_id=org_id, user_id=user_id, role="owner"))
            token = await issue_token(tx, org_id=org_id, member_id=member_id)
    except IntegrityError as exc:
        raise Conflict(f"an org with slug {slug!r} already exists", code="org_exists") from exc
    return {"org_id": org_id, "org_slug": slug, "member_id": member_id, "user_id": user_id, "email": email,
            "role": "owner", "token": token}


def cached_identity(svc: Services, token: str | None, org_hint: str | None) -> Identity | None:
    """:func:`authenticate` when the identity cache knows the token (no coroutine on the hot path);
    None when it must be looked up (or refused) by :func:`authenticate`."""
    if not token:
        return None
    ident = svc.caches.identity.get(token.strip())
    return _admitted(svc, ident, org_hint) if ident is not None else None


async def authenticate(svc: Services, token: str | None, org_hint: str | None) -> Identity:
    """The caller behind ``token``; 401 when missing/unknown/revoked, 403 when ``org_hint`` differs."""
    if isinstance(token, Credential):
        return _admitted(svc, await token.identity(svc), org_hint)
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
                       users.c.email)
                .select_from(tokens.join(members, members.c.id == tokens.c.member_id)
                             .join(orgs, orgs.c.id == members.c.org_id).join(users, users.c.id == members.c.user_id))
                .where(tokens.c.token_hash == digest))
        # the index found the row by digest; compare in constant time all the same
        if row is None or row["revoked_at"] is not None or not hmac.compare_digest(row["token_hash"], digest):
            raise Unauthorized("the X-Treg-Token is unknown or revoked", code="invalid_token")
        ident = Identity(org_id=row["org_id"], org_slug=row["slug"], member_id=row["member_id"],
                         user_id=row["user_id"], email=row["email"], role=row["role"],
                         project_ids=tuple(row["project_ids"]) if row["project_ids"] is not None else None,
                         token_id=row["id"])
        cache.put(token, ident, org_id=ident.org_id, epoch=epoch)  # not if a change raced the read
    ident = _admitted(svc, ident, org_hint)
    if not svc.audit.batches_token_touch:  # no batching writer: noted at once
        async with svc.db.tx() as tx:
            await tx.execute(update(tokens).where(tokens.c.id == ident.token_id).values(last_used_at=func.now()))
    return ident


def _admitted(svc: Services, ident: Identity, org_hint: str | None) -> Identity:
    """``ident`` unless ``org_hint`` names another org (403); its last use is noted for the batch."""
    logs.CALLER.set((ident.org_id, ident.member_id))  # the access line's org and member
    if org_hint and org_hint.strip() not in (ident.org_id, ident.org_slug):
        raise Forbidden("this token belongs to another org than X-Treg-Org names", code="wrong_org")
    svc.audit.touch_token(ident.token_id)
    return ident


def refuse_unknown_fields(body: dict[str, Any], allowed: Sequence[str], what: str) -> None:
    """400 on a field the route does not take: a typo (``allowed_member`` for ``allowed_member_ids``)
    silently ignored would grant more than the caller meant."""
    unknown = set(body) - set(allowed)
    if unknown:
        raise BadRequest(f"unknown field(s) {sorted(unknown)} for {what}; it takes {sorted(allowed)}",
                         code="invalid_field")


def require_manager(ident: Identity) -> None:
    if not ident.is_manager:
        raise Forbidden("only an org owner or admin may do this", code="forbidden_role")


async def org_rows(svc: Services, ident: Identity, table: Any, columns: Sequence[Any]) -> list[dict[str, Any]]:
    """``columns`` of every row of ``table`` (with ``org_id`` and ``created_at``) in the caller's org,
    oldest first; owners and admins only."""
    require_manager(ident)
    async with svc.db.tx() as tx:
        return await tx.fetch_all(select(*columns).where(table.c.org_id == ident.org_id).order_by(table.c.created_at))


async def delete_org_row(tx: Tx, table: Any, org_id: str, row_id: str) -> bool:
    """Delete the row ``row_id`` of ``table`` if it is this org's; False when there was none."""
    return bool(await tx.execute(delete(table).where(and_(table.c.id == row_id, table.c.org_id == org_id))))


async def missing_ids(tx: Tx, table: Any, org_id: str, ids: Sequence[str]) -> set[str]:
    """Which of ``ids`` are not rows of ``table`` (a table with ``id`` and ``org_id``) in this org."""
    if not ids:
        return set()
    rows = await tx.fetch_all(select(table.c.id).where(and_(table.c.org_id == org_id, table.c.id.in_(ids))))
    return set(ids) - {r["id"] for r in rows}


async def _check_project_ids(tx: Tx, org_id: str, project_ids: Any) -> tuple[str, ...] | None:
    if project_ids is None:
        return None
    if not isinstance(project_ids, list) or not all(isinstance(p, str) for p in project_ids):
        raise BadRequest("project_ids must be a list of project ids, or null for every project",
                         code="invalid_project_ids")
    wanted = tuple(dict.fromkeys(project_ids))
    missing = await missing_ids(tx, projects, org_id, wanted)
    if missing:
        raise Unprocessable(f"unknown project ids in this org: {sorted(missing)}", code="unknown_project")
    return wanted


async def add_member(svc: Services, ident: Identity, body: dict[str, Any]) -> dict[str, Any]:
    require_manager(ident)
    refuse_unknown_fields(body, ("email", "role", "project_ids"), "a member")
    email = check_email(body.get("email"))
    role = body.get("role", "member")
    if role not in ROLES:
        raise BadRequest(f"role must be one of {', '.join(ROLES)}", code="invalid_role")
    if role == "owner" and ident.role != "owner":
        raise Forbidden("only an owner may add another owner", code="forbidden_role")
    try:
        async with svc.db.tx() as tx:
            scope = await _check_project_ids(tx, ident.org_id, body.get("project_ids"))
            user_id = await _user_for(tx, email)
            member_id = new_id("mem")
            await tx.execute(insert(members).values(id=member_id, org_id=ident.org_id, user_id=user_id, role=role,
                                                    project_ids=list(scope) if scope is not None else None))
            token = await issue_token(tx, org_id=ident.org_id, member_id=member_id)
    except IntegrityError as exc:
        raise Conflict(f"{email} is already a member of this org", code="member_exists") from exc
    return {"member_id": member_id, "token": token, "email": email, "role": role,
            "project_ids": list(scope) if scope is not None else None, "org_id": ident.org_id}


async def list_members(svc: Services, ident: Identity) -> list[dict[str, Any]]:
    require_manager(ident)
    async with svc.db.tx() as tx:
        rows = await tx.fetch_all(
            select(members.c.id.label("member_id"), users.c.email, members.c.role, members.c.project_ids,
                   members.c.created_at)
            .select_from(members.join(users, users.c.id == members.c.user_id))
            .where(members.c.org_id == ident.org_id).order_by(members.c.created_at))
    return rows


async def create_project(svc: Services, ident: Identity, body: dict[str, Any]) -> dict[str, Any]:
    require_manager(ident)
    refuse_unknown_fields(body, ("name",), "a project")
    name = body.get("name")
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise BadRequest("a project needs a non-empty name (at most 200 characters)", code="invalid_name")
    try:
        async with svc.db.tx() as tx:
            project_id = new_id("prj")
            row = await tx.fetch_one(insert(projects).values(id=project_id, org_id=ident.org_id, name=name.strip())
                                     .returning(projects.c.id, projects.c.name, projects.c.created_at))
    except IntegrityError as exc:
        raise Conflict(f"a project named {name!r} already exists", code="project_exists") from exc
    assert row is not None
    return row


async def list_projects(svc: Services, ident: Identity) -> list[dict[str, Any]]:
    async with svc.db.tx() as tx:
        rows = await tx.fetch_all(select(projects.c.id, projects.c.name, projects.c.created_at)
                                  .where(projects.c.org_id == ident.org_id).order_by(projects.c.created_at))
    if ident.project_ids is not None and not ident.is_manager:
        rows = [r for r in rows if r["id"] in ident.project_ids]
    return rows


async def revoke_token(svc: Services, ident: Identity, token_id: str) -> None:
    async with changes(svc, "tokens", ident.org_id) as tx:
        row = await tx.fetch_one(select(tokens.c.member_id).where(and_(tokens.c.id == token_id,
                                                                       tokens.c.org_id == ident.org_id)))
        if row is None:
            raise NotFound("no such token in this org", code="token_not_found")
        if row["member_id"] != ident.member_id:
            require_manager(ident)
        await tx.execute(update(tokens).where(tokens.c.id == token_id).values(revoked_at=func.now()))


async def list_tokens(svc: Services, ident: Identity) -> list[dict[str, Any]]:
    q = select(tokens.c.id, tokens.c.member_id, tokens.c.prefix, tokens.c.created_at, tokens.c.last_used_at,
               tokens.c.revoked_at).where(tokens.c.org_id == ident.org_id)
    if not ident.is_manager:
        q = q.where(tokens.c.member_id == ident.member_id)
    async with svc.db.tx() as tx:
        return await tx.fetch_all(q.order_by(tokens.c.created_at))


async def create_token(svc: Services, ident: Identity, member_id: str | None) -> dict[str, Any]:
    member_id = member_id or ident.member_id
    if member_id != ident.member_id:
        require_manager(ident)
    async with svc.db.tx() as tx:
        ok = await tx.scalar(select(members.c.id).where(and_(members.c.id == member_id,
                                                             members.c.org_id == ident.org_id)))
        if ok is None:
            raise NotFound("no such member in this org", code="member_not_found")
        token = await issue_token(tx, org_id=ident.org_id, member_id=member_id)
    return {"member_id": member_id, "token": token}


async def notify(tx: Tx, kind: str, org_id: str) -> None:
    """Tell every treg process on this database that ``kind`` data of ``org_id`` changed (on commit)."""
    await tx.execute("SELECT pg_notify('treg_changes', %(payload)s)", {"payload": f"{kind}:{org_id}"})


def forget_local(svc: Services, org_id: str) -> None:
    """Drop this process's cached entries of ``org_id`` right after a committed write.

    Other processes learn of the change by NOTIFY; this one must not wait for its own notification
    to come back, or the next request (a revoked token, a deleted tool) could still see the old data.
    """
    svc.caches.drop_org(org_id)


@contextlib.asynccontextmanager
async def changes(svc: Services, kind: str, org_id: str) -> AsyncIterator[Tx]:
    """The transaction of one management write of ``kind`` data of ``org_id``.

    The NOTIFY goes out inside it (PostgreSQL delivers it to every process only on commit, so a
    rollback tells nobody), and this process's entries of the org are dropped only once it committed:
    dropped earlier, a concurrent call could load the old rows back before the commit. A body that
    raises rolls back, notifies nobody and forgets nothing."""
    async with svc.db.tx() as tx:
        yield tx
        await notify(tx, kind, org_id)
    forget_local(svc, org_id)


def as_list(value: Sequence[str] | None) -> list[str] | None:
    return list(value) if value is not None else None
