"""A tool base URL's user-info (``https://user:password@host/…``) is a credential: it is kept like a
secret's value. The ``tools.base_url`` column holds the URL with the user-info masked (what listings
show, what a backup or a database reader sees); the whole URL is sealed in ``base_url_sealed`` with the
secret box, bound to the org and the tool, and opened only when the tools cache loads the org's tools
for the relay.

A URL without user-info is stored as it is, unsealed: nothing in it is secret.
"""

from __future__ import annotations

from treg.context import Services
from treg.errors import GatewayFailed
from treg.infra.crypto import DecryptError, SecretBox
from treg.redaction import MASK, mask_userinfo


def _aad_id(tool_id: str) -> str:
    # its own label in the box's associated data: a tool's blob never opens as a secret's, nor one as it
    return "tool-base-url:" + tool_id


def has_userinfo(base_url: str) -> bool:
    return mask_userinfo(base_url, MASK) != base_url


def masked(base_url: str) -> str:
    return mask_userinfo(base_url, MASK)


def seal(svc: Services, org_id: str, tool_id: str, base_url: str) -> tuple[str, bytes | None]:
    """(what the ``base_url`` column stores, the sealed whole URL or None when it carries no user-info)."""
    if not has_userinfo(base_url):
        return base_url, None
    return masked(base_url), svc.box.encrypt(base_url.encode(), org_id=org_id, secret_id=_aad_id(tool_id))


def unseal(svc: Services, org_id: str, tool_id: str, stored: str, sealed: bytes | None) -> str:
    """The URL the relay dials: the sealed one when there is one, else the column as it is."""
    if sealed is None:
        return stored
    try:
        return svc.box.decrypt(sealed, org_id=org_id, secret_id=_aad_id(tool_id)).decode()
    except DecryptError as exc:
        raise GatewayFailed("a tool's base URL credential cannot be decrypted with this server's keys; "
                            "an admin must set the tool's base_url again", code="secret_undecryptable",
                            blame="treg") from exc


async def seal_legacy(svc: Services) -> int:
    """Seal the user-info of base URLs written before it was sealed (a one-off at startup; the
    migration cannot: it has no key). Returns how many tools were sealed."""
    from sqlalchemy import and_, select, update

    from treg.infra.schema import tools
    from treg.org_changes import changes

    async with svc.db.tx() as tx:
        rows = await tx.fetch_all(select(tools.c.id, tools.c.org_id, tools.c.base_url)
                                  .where(and_(tools.c.base_url_sealed.is_(None), tools.c.base_url.contains("@"))))
    done = 0
    for r in rows:
        if not has_userinfo(r["base_url"]):
            continue  # an "@" in the path or query: no user-info
        stored, sealed = seal(svc, r["org_id"], r["id"], r["base_url"])
        async with changes(svc, "tools", r["org_id"]) as tx:
            # guarded by the stored value: a concurrent edit (or another process's sweep) wins
            await tx.execute(update(tools).where(and_(tools.c.id == r["id"], tools.c.base_url == r["base_url"],
                                                      tools.c.base_url_sealed.is_(None)))
                             .values(base_url=stored, base_url_sealed=sealed))
        done += 1
    return done


async def rotate_sealed(svc: Services, new_box: SecretBox) -> int:
    """``treg secrets rotate-key``: every sealed base URL not under ``new_box``'s key sealed again under it,
    in batches, rows locked while they move; how many moved. (The relay reads the URL from the org's
    cached tools, unsealed at load: nothing it holds changes, so no cache is told.)"""
    from sqlalchemy import func, select, update

    from treg.infra.schema import tools

    moved = 0
    current = new_box.key_id.encode()
    while True:
        async with svc.db.tx() as tx:
            # the blob's key id is its bytes 3.. (treg/infra/crypto.py): only blobs under another key
            rows = await tx.fetch_all(select(tools.c.id, tools.c.org_id, tools.c.base_url_sealed)
                                      .where(tools.c.base_url_sealed.isnot(None),
                                             func.substring(tools.c.base_url_sealed, 3, len(current)) != current)
                                      .limit(200).with_for_update(skip_locked=True))
            for r in rows:
                aad = {"org_id": r["org_id"], "secret_id": _aad_id(r["id"])}
                sealed = new_box.encrypt(new_box.decrypt(r["base_url_sealed"], **aad), **aad)
                await tx.execute(update(tools).where(tools.c.id == r["id"]).values(base_url_sealed=sealed))
        moved += len(rows)
        if not rows:
            return moved


async def setup(app: object, svc: Services) -> None:
    """Startup component (treg/app.py COMPONENTS): the legacy sweep, before the first call is served."""
    await seal_legacy(svc)
