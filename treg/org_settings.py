"""The org's own settings (``GET``/``PATCH /api/v1/org``): ``platform_overflow``, whether the org's
platform-tier calls may overflow to aggregators (docs/resilience.md), read by every member and changed by
an owner only (it decides where the org's data may go); and ``public_demo``, shown only: the operator
turns the public demo on and off (``treg demo enable|disable``, treg/public_demo.py)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select, update

from treg.context import Services
from treg.errors import BadRequest, Forbidden, NotFound
from treg.identity import Identity
from treg.infra.schema import orgs
from treg.management import refuse_unknown_fields

FIELDS = ("platform_overflow",)


def _view(row: dict[str, Any]) -> dict[str, Any]:
    return {"org_id": row["id"], "slug": row["slug"], "created_at": row["created_at"],
            "platform_overflow": row["platform_overflow"], "public_demo": row["public_demo"]}


async def get_org(svc: Services, ident: Identity) -> dict[str, Any]:
    async with svc.db.tx() as tx:
        row = await tx.fetch_one(select(orgs).where(orgs.c.id == ident.org_id))
    if row is None:
        raise NotFound("the org no longer exists", code="org_not_found")
    return _view(row)


async def update_org(svc: Services, ident: Identity, body: dict[str, Any]) -> dict[str, Any]:
    if ident.role != "owner":
        raise Forbidden("only an org owner may change the org's settings", code="forbidden_role")
    refuse_unknown_fields(body, FIELDS, "the org")
    values: dict[str, Any] = {}
    if "platform_overflow" in body:
        if not isinstance(body["platform_overflow"], bool):
            raise BadRequest("platform_overflow must be true or false", code="invalid_value")
        values["platform_overflow"] = body["platform_overflow"]
    async with svc.db.tx() as tx:
        if values:
            await tx.execute(update(orgs).where(orgs.c.id == ident.org_id).values(**values))
        row = await tx.fetch_one(select(orgs).where(orgs.c.id == ident.org_id))
    if row is None:
        raise NotFound("the org no longer exists", code="org_not_found")
    return _view(row)
