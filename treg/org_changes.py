"""The org's cache-invalidating writes: every management write that changes cached data (tokens, tools,
secrets, deny rules) runs in :func:`changes`, which tells every treg process on the database
(:func:`notify`, PostgreSQL's NOTIFY) and drops this process's own entries (:func:`forget_local`).
docs/architecture.md, "Caches and LISTEN/NOTIFY".
"""

from __future__ import annotations

import contextlib
from typing import AsyncIterator

from treg.context import Services
from treg.infra.db import Tx


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
