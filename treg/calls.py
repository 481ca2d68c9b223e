"""Reading the audit trail: owners/admins see every call of the org, a member only their own;
only owners/admins get a failed call's evidence."""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, select

from treg.context import Services
from treg.errors import BadRequest, NotFound
from treg.infra.schema import calls
from treg.tenancy import Identity

LIST_COLUMNS = (calls.c.id.label("call_id"), calls.c.created_at, calls.c.method, calls.c.target, calls.c.status,
                calls.c.outcome, calls.c.refused_by, calls.c.credential_tier, calls.c.cost_micro,
                calls.c.duration_ms)
DETAIL_COLUMNS = LIST_COLUMNS + (calls.c.member_id, calls.c.surface, calls.c.upstream_url, calls.c.tool_id,
                                 calls.c.tool_name, calls.c.provider, calls.c.endpoint_id, calls.c.error_code,
                                 calls.c.blame, calls.c.hold_state, calls.c.tag, calls.c.request_bytes,
                                 calls.c.response_bytes, calls.c.ttfb_ms, calls.c.failure_kind,
                                 calls.c.parent_call_id)
MAX_LIMIT = 500


async def _flush(svc: Services) -> None:
    # the writer batches; a reader must see its own calls
    await svc.audit.flush()


async def list_calls(svc: Services, ident: Identity, limit_text: str | None) -> list[dict[str, Any]]:
    try:
        limit = int(limit_text) if limit_text is not None else 50
    except ValueError as exc:
        raise BadRequest("limit must be an integer", code="invalid_limit") from exc
    if not 1 <= limit <= MAX_LIMIT:
        raise BadRequest(f"limit must be between 1 and {MAX_LIMIT}", code="invalid_limit")
    await _flush(svc)
    q = select(*LIST_COLUMNS).where(calls.c.org_id == ident.org_id)
    if not ident.is_manager:
        q = q.where(calls.c.member_id == ident.member_id)
    async with svc.db.tx() as tx:
        return await tx.fetch_all(q.order_by(calls.c.created_at.desc(), calls.c.id.desc()).limit(limit))


async def get_call(svc: Services, ident: Identity, call_id: str) -> dict[str, Any]:
    await _flush(svc)
    cols = DETAIL_COLUMNS + ((calls.c.error_request, calls.c.error_response) if ident.is_manager else ())
    q = select(*cols).where(and_(calls.c.org_id == ident.org_id, calls.c.id == call_id))
    if not ident.is_manager:
        q = q.where(calls.c.member_id == ident.member_id)
    async with svc.db.tx() as tx:
        row = await tx.fetch_one(q)
    if row is None:
        raise NotFound("no such call visible to you", code="call_not_found")
    return row
