"""Who owns which object on treg's platform vendor accounts: the ``provider_resources`` table.

Each statement is one short transaction of its own; none runs while an upstream is being waited on
(the call pipeline calls these before the relay or after the answer arrived, ``treg/call/resources.py``).
A row is keyed by the vendor's (provider, kind, id): one owner per object. ``tag`` is the creating
call's pin (its ``X-Treg-Tag``): a later pinned call must carry the same one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, func, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from treg.context import Services
from treg.errors import BadRequest
from treg.infra.schema import provider_resources as pr

ACTIVE, DELETED = "active", "deleted"
MAX_LIMIT = 500
#: the longest vendor id treg records (the column's width)
MAX_ID = 512


@dataclass(frozen=True)
class Owner:
    """An ownership row as the checks read it."""

    org_id: str
    state: str
    #: the creating call's pin snapshot: a pin ``(name, value)`` must equal the attribute ``name``
    tag: str | None


class OwnedElsewhere(Exception):
    """The vendor named an id whose row is another owner's live object: not recorded, and not ours to
    delete either."""


def _key(provider: str, kind: str, resource_id: str) -> Any:
    return and_(pr.c.provider == provider, pr.c.kind == kind, pr.c.resource_id == resource_id)


async def owner(svc: Services, provider: str, kind: str, resource_id: str) -> Owner | None:
    async with svc.db.tx() as tx:
        row = await tx.fetch_one(select(pr.c.org_id, pr.c.state, pr.c.tag).where(_key(provider, kind, resource_id)))
    return Owner(**row) if row is not None else None


async def record_created(svc: Services, *, org_id: str, provider: str, kind: str, resource_id: str,
                         tag: str | None, call_id: str) -> None:
    """Record a new object as the caller's (org and pin), in one transaction that locks its row.

    The vendor may name an id treg has seen: the caller's own live object again (a provider-side dedup
    of a retry) is kept as is; a deleted object's id reused by the vendor is a new object, now the
    caller's (the old owner's tombstone must not authorize a delete of it). Another owner's live object
    raises :class:`OwnedElsewhere`; a database failure raises as itself."""
    key = _key(provider, kind, resource_id)
    async with svc.db.tx() as tx:
        won = await tx.fetch_one(
            pg_insert(pr).values(provider=provider, kind=kind, resource_id=resource_id, org_id=org_id, state=ACTIVE,
                                 tag=tag, call_id=call_id)
            .on_conflict_do_nothing(index_elements=[pr.c.provider, pr.c.kind, pr.c.resource_id])
            .returning(pr.c.org_id))
        if won is not None:
            return
        # the id has a row (an earlier object, or a concurrent create that just committed): locked, then judged
        row = await tx.fetch_one(select(pr.c.org_id, pr.c.state, pr.c.tag).where(key).with_for_update())
        if row is None:  # only if its org was deleted in between: refuse, not guess
            raise OwnedElsewhere(f"{provider} {kind} id vanished while recorded")
        if row["state"] == DELETED:
            await tx.execute(update(pr).where(key).values(org_id=org_id, state=ACTIVE, tag=tag, call_id=call_id,
                                                          created_at=func.now(), updated_at=func.now()))
        elif row["org_id"] == org_id and row["tag"] == tag:
            await tx.execute(update(pr).where(key).values(updated_at=func.now()))
        else:
            raise OwnedElsewhere(f"{provider} {kind} id is another owner's live object")


async def touch(svc: Services, org_id: str, provider: str, kind: str, resource_id: str) -> bool:
    """An update the vendor accepted: the row's ``updated_at`` moves (only an active row of the org)."""
    async with svc.db.tx() as tx:
        n = await tx.execute(update(pr).where(and_(_key(provider, kind, resource_id), pr.c.org_id == org_id,
                                                   pr.c.state == ACTIVE)).values(updated_at=func.now()))
    return n == 1


async def mark_deleted(svc: Services, org_id: str, provider: str, kind: str, resource_id: str) -> bool:
    """The vendor deleted it (2xx) or no longer has it (404): tombstoned, so a retried delete is safe."""
    async with svc.db.tx() as tx:
        n = await tx.execute(update(pr).where(and_(_key(provider, kind, resource_id), pr.c.org_id == org_id,
                                                   pr.c.state == ACTIVE))
                             .values(state=DELETED, updated_at=func.now()))
    return n == 1


def _limit(text: str | None) -> int:
    try:
        limit = int(text) if text is not None else 50
    except ValueError as exc:
        raise BadRequest("limit must be an integer", code="invalid_limit") from exc
    if not 1 <= limit <= MAX_LIMIT:
        raise BadRequest(f"limit must be between 1 and {MAX_LIMIT}", code="invalid_limit")
    return limit


async def list_for_org(svc: Services, org_id: str, *, limit: str | None = None, state: str | None = None,
                       kind: str | None = None, provider: str | None = None) -> list[dict[str, Any]]:
    """The org's objects, newest first (``GET /api/v1/resources``)."""
    n = _limit(limit)
    if state is not None and state not in (ACTIVE, DELETED):
        raise BadRequest("state must be active or deleted", code="invalid_filter")
    q = select(pr.c.kind, pr.c.provider, pr.c.resource_id.label("id"), pr.c.state, pr.c.created_at,
               pr.c.updated_at, pr.c.tag, pr.c.call_id).where(pr.c.org_id == org_id)
    for col, value in ((pr.c.state, state), (pr.c.kind, kind), (pr.c.provider, provider)):
        if value is not None:
            q = q.where(col == value)
    async with svc.db.tx() as tx:
        return await tx.fetch_all(q.order_by(pr.c.created_at.desc(), pr.c.resource_id.desc()).limit(n))
