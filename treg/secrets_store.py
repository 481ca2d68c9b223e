"""Org secrets: encrypted at rest, never returned, never logged.

A value is a string or a JSON object (``secret_field`` bindings pick a string field of it). The blob
is AES-256-GCM bound to (org id, secret id); see :mod:`treg.infra.crypto`.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from sqlalchemy import and_, insert, select, update

from treg.context import Services
from treg.errors import BadRequest, Conflict, IntegrityError, NotFound
from treg.identity import Identity, require_manager
from treg.ids import new_id
from treg.infra.crypto import SecretBox
from treg.infra.schema import secrets, tools
from treg.management import delete_org_row, org_rows, refuse_unknown_fields
from treg.org_changes import changes

_PROVIDER = re.compile(r"\A[a-z0-9][a-z0-9-]{0,63}\Z")
PUBLIC_COLUMNS = (secrets.c.id, secrets.c.name, secrets.c.provider, secrets.c.created_at, secrets.c.updated_at)


def _encode_value(value: Any) -> tuple[bytes, bool]:
    if isinstance(value, str):
        if not value:
            raise BadRequest("a secret value cannot be empty", code="invalid_secret")
        return value.encode(), False
    if isinstance(value, dict):
        if not value:
            raise BadRequest("a JSON secret needs at least one field", code="invalid_secret")
        return json.dumps(value, separators=(",", ":")).encode(), True
    raise BadRequest("a secret value is a string or a JSON object", code="invalid_secret")


async def create_secret(svc: Services, ident: Identity, body: dict[str, Any]) -> dict[str, Any]:
    require_manager(ident)
    refuse_unknown_fields(body, ("name", "value", "provider"), "a secret")
    name, provider = body.get("name"), body.get("provider")
    if not isinstance(name, str) or not name.strip() or len(name) > 200:
        raise BadRequest("a secret needs a non-empty name (at most 200 characters)", code="invalid_name")
    if provider is not None and (not isinstance(provider, str) or not _PROVIDER.fullmatch(provider)):
        raise BadRequest("provider is a lower-case id of a-z, 0-9 and '-'", code="invalid_provider")
    plaintext, is_json = _encode_value(body.get("value"))
    secret_id = new_id("sec")
    blob = svc.box.encrypt(plaintext, org_id=ident.org_id, secret_id=secret_id)
    async with changes(svc, "secrets", ident.org_id) as tx:
        row = await tx.fetch_one(
            insert(secrets).values(id=secret_id, org_id=ident.org_id, name=name.strip(), provider=provider, blob=blob,
                                   key_id=svc.box.blob_key_id(blob), is_json=is_json).returning(*PUBLIC_COLUMNS))
    assert row is not None
    return row


async def list_secrets(svc: Services, ident: Identity) -> list[dict[str, Any]]:
    return await org_rows(svc, ident, secrets, PUBLIC_COLUMNS)


async def delete_secret(svc: Services, ident: Identity, secret_id: str) -> None:
    require_manager(ident)
    async with changes(svc, "secrets", ident.org_id) as tx:
        # a secret a tool still binds cannot go: the tool would fail at call time instead
        users_ = await tx.fetch_all(select(tools.c.name).where(and_(
            tools.c.org_id == ident.org_id,
            tools.c.bindings.contains([{"secret_id": secret_id}]))))
        if users_:
            raise Conflict(f"secret is still bound by tools {sorted(r['name'] for r in users_)}; change them first",
                           code="secret_in_use", tools=sorted(r["name"] for r in users_))
        if not await delete_org_row(tx, secrets, ident.org_id, secret_id):
            raise NotFound("no such secret in this org", code="secret_not_found")


def decrypt_row(box: SecretBox, row: dict[str, Any]) -> str | dict[str, Any]:
    """The plain value of a secrets row (only the relay calls this, just before injecting)."""
    raw = box.decrypt(row["blob"], org_id=row["org_id"], secret_id=row["id"])
    return json.loads(raw) if row["is_json"] else raw.decode()


async def rotate_key(svc: Services, new_box: SecretBox, progress: Callable[[int, int], None] | None = None) -> int:
    """Re-encrypt every blob not under ``new_box``'s key, in batches; returns how many moved."""
    async with svc.db.tx() as tx:
        total = await tx.scalar("SELECT count(*) FROM secrets WHERE key_id <> %(k)s", {"k": new_box.key_id})
    moved = 0
    while True:
        async with svc.db.tx() as tx:
            rows = await tx.fetch_all(select(secrets).where(secrets.c.key_id != new_box.key_id)
                                      .limit(200).with_for_update(skip_locked=True))
            for row in rows:
                plain = new_box.decrypt(row["blob"], org_id=row["org_id"], secret_id=row["id"])
                blob = new_box.encrypt(plain, org_id=row["org_id"], secret_id=row["id"])
                await tx.execute(update(secrets).where(secrets.c.id == row["id"]).values(blob=blob,
                                                                                         key_id=new_box.key_id))
        if not rows:
            break
        moved += len(rows)
        if progress:
            progress(moved, total or moved)
    # the other sealed values under the master key: OAuth apps' client secrets and connections' tokens, and
    # tools' base URLs that carry user-info
    from treg import tool_urls
    from treg.oauth.rotation import rotate_blobs

    return moved + await rotate_blobs(svc, new_box) + await tool_urls.rotate_sealed(svc, new_box)
