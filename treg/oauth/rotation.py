"""``treg secrets rotate-key`` for OAuth: the sealed client secrets of org apps and the sealed tokens (and
PKCE verifiers in flight) of connections moved under the new key, in batches, rows locked while they
move (a refresh writing the same row waits for its batch)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, func, or_, select, update

from treg.context import Services
from treg.infra.crypto import SecretBox
from treg.infra.schema import oauth_apps, oauth_connections as conns

BATCH = 200


async def rotate_blobs(svc: Services, new_box: SecretBox) -> int:
    """Re-encrypt every OAuth blob not under ``new_box``'s key; how many rows moved."""
    moved = 0
    while True:
        async with svc.db.tx() as tx:
            rows = await tx.fetch_all(select(oauth_apps.c.org_id, oauth_apps.c.provider,
                                             oauth_apps.c.client_secret_blob)
                                      .where(oauth_apps.c.key_id != new_box.key_id).limit(BATCH)
                                      .with_for_update(skip_locked=True))
            for r in rows:
                aad = {"org_id": r["org_id"], "secret_id": f"oauth-app:{r['provider']}"}
                blob = new_box.encrypt(new_box.decrypt(r["client_secret_blob"], **aad), **aad)
                await tx.execute(update(oauth_apps).where(oauth_apps.c.org_id == r["org_id"],
                                                          oauth_apps.c.provider == r["provider"])
                                 .values(client_secret_blob=blob, key_id=new_box.key_id))
        moved += len(rows)
        if not rows:
            break
    current = new_box.key_id.encode()

    def elsewhere(blob: Any) -> Any:
        # under another key: the blob's key id is its bytes 3.. (treg/infra/crypto.py); a consent in flight
        # has only its PKCE verifier, a connection its tokens (and maybe a verifier of a new consent)
        return and_(blob.isnot(None), func.substring(blob, 3, len(current)) != current)

    while True:
        async with svc.db.tx() as tx:
            rows = await tx.fetch_all(select(conns.c.id, conns.c.org_id, conns.c.tokens_blob, conns.c.verifier_blob)
                                      .where(or_(elsewhere(conns.c.tokens_blob), elsewhere(conns.c.verifier_blob)))
                                      .limit(BATCH).with_for_update(skip_locked=True))
            for r in rows:
                values: dict[str, Any] = {}
                if r["tokens_blob"] is not None and new_box.blob_key_id(bytes(r["tokens_blob"])) != new_box.key_id:
                    aad = {"org_id": r["org_id"], "secret_id": f"oauth-connection:{r['id']}"}
                    values["tokens_blob"] = new_box.encrypt(new_box.decrypt(r["tokens_blob"], **aad), **aad)
                    values["key_id"] = new_box.key_id
                if r["verifier_blob"] is not None and new_box.blob_key_id(bytes(r["verifier_blob"])) != new_box.key_id:
                    vaad = {"org_id": r["org_id"], "secret_id": f"oauth-verifier:{r['id']}"}
                    values["verifier_blob"] = new_box.encrypt(new_box.decrypt(r["verifier_blob"], **vaad), **vaad)
                await tx.execute(update(conns).where(conns.c.id == r["id"]).values(**values))
        moved += len(rows)
        if not rows:
            break
    return moved
