"""What the management modules (members, tools, secrets, deny rules, the org's settings) share: a body
takes only the fields its route names, and an org's rows are listed, deleted and checked by id within
the org. Their writes of cached data go through treg/org_changes.py.
"""

from __future__ import annotations

from typing import Any, Sequence

from sqlalchemy import and_, delete, select

from treg.context import Services
from treg.errors import BadRequest
from treg.identity import Identity, require_manager
from treg.infra.db import Tx


def refuse_unknown_fields(body: dict[str, Any], allowed: Sequence[str], what: str) -> None:
    """400 on a field the route does not take: a typo (``allowed_member`` for ``allowed_member_ids``)
    silently ignored would grant more than the caller meant."""
    unknown = set(body) - set(allowed)
    if unknown:
        raise BadRequest(f"unknown field(s) {sorted(unknown)} for {what}; it takes {sorted(allowed)}",
                         code="invalid_field")


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
