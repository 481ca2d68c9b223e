"""Membership: an org's members and their roles, its projects and its API tokens. An org is created with
its first member, its owner, whose token is shown once. Owners and admins manage; a member sees its own
tokens and the projects it may use.

A token is 256 random bits (``treg_…``); only its SHA-256 is stored (treg/authentication.py looks it
up). A revoked token stops working at once: :func:`revoke_token` writes through treg/org_changes.py.
A token has a scope (``treg.identity.SCOPES``): ``full`` by default; any member may issue itself a
read-only ``table`` token (valid only on ``GET /table/…``, docs/sharing.md); a ``demo`` token is the
operator's (``treg demo token``, treg/public_demo.py), never issued here.
"""

from __future__ import annotations

import re
import secrets as pysecrets
from typing import Any

from sqlalchemy import and_, func, insert, select, update

from treg.authentication import hash_token
from treg.context import Services
from treg.errors import BadRequest, Conflict, Forbidden, IntegrityError, NotFound, Unprocessable
from treg.identity import FULL, TABLE, Identity, require_manager
from treg.ids import new_id
from treg.infra.db import Tx
from treg.infra.schema import members, orgs, projects, tokens, users
from treg.management import missing_ids, refuse_unknown_fields
from treg.org_changes import changes

ROLES = ("owner", "admin", "member")
TOKEN_PREFIX = "treg_"
_SLUG = re.compile(r"\A[a-z0-9][a-z0-9-]{0,62}\Z")
_EMAIL = re.compile(r"\A[^@\s]+@[^@\s]+\Z")


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


#: the scopes ``POST /api/v1/tokens`` may ask for
ISSUABLE_SCOPES = (FULL, TABLE)


async def issue_token(tx: Tx, *, org_id: str, member_id: str, scope: str = FULL) -> str:
    token = new_token()
    await tx.execute(insert(tokens).values(id=new_id("tok"), org_id=org_id, member_id=member_id,
                                           token_hash=hash_token(token), prefix=token[:12], scope=scope))
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
                   members.c.created_at, members.c.calls_per_day)
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
    q = select(tokens.c.id, tokens.c.member_id, tokens.c.prefix, tokens.c.scope, tokens.c.created_at,
               tokens.c.last_used_at, tokens.c.revoked_at).where(tokens.c.org_id == ident.org_id)
    if not ident.is_manager:
        q = q.where(tokens.c.member_id == ident.member_id)
    async with svc.db.tx() as tx:
        return await tx.fetch_all(q.order_by(tokens.c.created_at))


def check_scope(scope: Any) -> str:
    """A scope ``POST /api/v1/tokens`` may ask for (None: ``full``)."""
    if scope is None:
        return FULL
    if scope not in ISSUABLE_SCOPES:
        raise BadRequest(f"scope must be one of {', '.join(ISSUABLE_SCOPES)} (a demo token is the operator's: "
                         "treg demo token)", code="invalid_scope")
    return scope  # type: ignore[no-any-return]


async def create_token(svc: Services, ident: Identity, member_id: str | None, scope: str | None = None) -> dict[str, Any]:
    """A new token (shown once) for the caller or, by an owner or admin, another member; a ``table`` token
    only for the caller (any role), read-only, valid only on ``GET /table/…``."""
    scope = check_scope(scope)
    member_id = member_id or ident.member_id
    if member_id != ident.member_id:
        if scope == TABLE:
            raise Forbidden("a table token is issued only to the member asking for it (any member may issue "
                            "one for themselves)", code="forbidden_role")
        require_manager(ident)
    async with svc.db.tx() as tx:
        ok = await tx.scalar(select(members.c.id).where(and_(members.c.id == member_id,
                                                             members.c.org_id == ident.org_id)))
        if ok is None:
            raise NotFound("no such member in this org", code="member_not_found")
        token = await issue_token(tx, org_id=ident.org_id, member_id=member_id, scope=scope)
    return {"member_id": member_id, "token": token, "scope": scope}
