"""Deny rules: stored per org, enforced on the resolved upstream of every call (see domain.deny)."""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import and_, insert, select

from treg.context import Services
from treg.domain.deny import DenyRule
from treg.errors import BadRequest, NotFound, Unprocessable
from treg.identity import Identity, require_manager
from treg.ids import new_id
from treg.infra.schema import deny_rules, members, projects
from treg.management import delete_org_row, org_rows, refuse_unknown_fields
from treg.org_changes import changes

_HOST = re.compile(r"\A(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+)(:\d{1,5})?\Z")
_METHOD = re.compile(r"\A[A-Za-z]{1,16}\Z")
_NOT_IN_PATH = re.compile(r"[?#\x00-\x1f\x7f]")
COLUMNS = (deny_rules.c.id, deny_rules.c.host, deny_rules.c.path, deny_rules.c.method, deny_rules.c.member_id,
           deny_rules.c.project_id, deny_rules.c.reason, deny_rules.c.created_at)


async def create_rule(svc: Services, ident: Identity, body: dict[str, Any]) -> dict[str, Any]:
    require_manager(ident)
    refuse_unknown_fields(body, ("host", "path", "method", "member_id", "project_id", "reason"), "a deny rule")
    host = body.get("host")
    if not isinstance(host, str) or not _HOST.fullmatch(host.strip()) or len(host.strip()) > 300:
        raise BadRequest("host is required: a hostname, optionally with :port (e.g. api.stripe.com:443)",
                         code="invalid_host")
    path, method, reason = body.get("path"), body.get("method"), body.get("reason")
    if path is not None and (not isinstance(path, str) or not path.startswith("/")):
        raise BadRequest("path must start with '/'", code="invalid_path")
    if path is not None and (_NOT_IN_PATH.search(path) or len(path) > 2000):
        # matched against the path alone (no query, no fragment): such a rule could never fire
        raise BadRequest("path must be a URL path: no '?', '#' or control characters, "
                         "at most 2000 characters", code="invalid_path")
    if method is not None and (not isinstance(method, str) or not _METHOD.fullmatch(method)):
        raise BadRequest("method must be an HTTP method such as POST", code="invalid_method")
    if reason is not None and not isinstance(reason, str):
        raise BadRequest("reason must be a string", code="invalid_reason")
    member_id, project_id = body.get("member_id"), body.get("project_id")
    for key, value in (("member_id", member_id), ("project_id", project_id)):
        if value is not None and not isinstance(value, str):
            raise BadRequest(f"{key} must be an id (a string) or null",
                             code="invalid_member" if key == "member_id" else "invalid_project")
    async with changes(svc, "deny", ident.org_id) as tx:
        if member_id is not None and await tx.scalar(select(members.c.id).where(and_(
                members.c.id == member_id, members.c.org_id == ident.org_id))) is None:
            raise Unprocessable("member_id is not a member of this org", code="unknown_member")
        if project_id is not None and await tx.scalar(select(projects.c.id).where(and_(
                projects.c.id == project_id, projects.c.org_id == ident.org_id))) is None:
            raise Unprocessable("project_id is not a project of this org", code="unknown_project")
        row = await tx.fetch_one(insert(deny_rules).values(
            id=new_id("deny"), org_id=ident.org_id, host=host.strip().lower(), path=path,
            method=method.upper() if method else None, member_id=member_id, project_id=project_id, reason=reason,
        ).returning(*COLUMNS))
    assert row is not None
    return row


async def list_rules(svc: Services, ident: Identity) -> list[dict[str, Any]]:
    return await org_rows(svc, ident, deny_rules, COLUMNS)


async def delete_rule(svc: Services, ident: Identity, rule_id: str) -> None:
    require_manager(ident)
    async with changes(svc, "deny", ident.org_id) as tx:
        if not await delete_org_row(tx, deny_rules, ident.org_id, rule_id):
            raise NotFound("no such deny rule in this org", code="deny_rule_not_found")


async def load_rules(svc: Services, org_id: str) -> tuple[DenyRule, ...]:
    async with svc.db.tx() as tx:
        rows = await tx.fetch_all(select(*COLUMNS).where(deny_rules.c.org_id == org_id))
    return tuple(DenyRule(id=r["id"], host=r["host"], path=r["path"], method=r["method"], member_id=r["member_id"],
                          project_id=r["project_id"], reason=r["reason"]) for r in rows)
