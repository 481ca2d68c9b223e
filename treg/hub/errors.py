"""The hub's refusals (docs/errors.md "Hub")."""

from __future__ import annotations

from typing import Any

from treg.errors import TregError


class HubBusy(TregError):
    """429: the publishing org (or the tool) runs as many hub calls as it may; never queued."""

    status, code, blame = 429, "hub_busy", "caller"

    def __init__(self, detail: str, *, active: int, limit: int, retry_after_s: int, **extra: Any) -> None:
        super().__init__(detail, refused_by="hub", headers={"Retry-After": str(retry_after_s)}, active=active,
                         limit=limit, retry_after_s=retry_after_s, **extra)
