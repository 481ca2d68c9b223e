"""``treg secrets rotate-key`` for OAuth: the sealed client secrets of org apps and the sealed tokens (and
PKCE verifiers in flight) of connections moved under the new key, in batches, rows locked while they
move (a refresh writing the same row waits for its batch)."""

from __future__ import annotations

from sqlalchemy import or_, select, update

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
    while True:
        async with svc.db.tx() as tx:
            rows = await tx.fetch_all(select(conns.c.id, conns.c.org_id, conns.c.tokens_blob, conns.c.verifier_blob)
                                      .where(conns.c.tokens_blob.isnot(None),
                                             or_(conns.c.key_id.is_(None), conns.c.key_id != new_box.key_id))
                                      .limit(BATCH).with_for_update(skip_locked=True))
            for r in rows:
                values = {"key_id": new_box.key_id}
                aad = {"org_id": r["org_id"], "secret_id": f"oauth-connection:{r['id']}"}
                values["tokens_blob"] = new_box.encrypt(new_box.decrypt(r["tokens_blob"], **aad), **aad)
                if r["verifier_blob"] is not None:
                    vaad = {"org_id": r["org_id"], "secret_id": f"oauth-verifier:{r['id']}"}
                    values["verifier_blob"] = new_box.encrypt(new_box.decrypt(r["verifier_blob"], **vaad), **vaad)
                await tx.execute(update(conns).where(conns.c.id == r["id"]).values(**values))
        moved += len(rows)
        if not rows:
            break
    return moved
