"""The breaker's refusal: 503 ``provider_capacity`` (docs/resilience.md, contract § The breaker)."""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

from treg.errors import TregError


class ProviderCapacity(TregError):
    """treg's own account at the vendor is out (a lock) or overflow could not serve the call: refused
    before any hold. ``resets_at`` and ``retry_after_s`` are always in the body (null when unknown), so
    every surface carries both (MCP has no response header); ``Retry-After`` is set when the reset is
    known; ``overflow_refused`` carries an aggregator's refusal when the direct attempt was skipped."""

    status = 503
    code = "provider_capacity"
    blame = "treg"

    def __init__(self, *, provider: str, endpoint: str | None, kind: str, resets_at: datetime | None,
                 alternatives: list[dict[str, Any]], now: datetime | None = None,
                 overflow_refused: str | None = None) -> None:
        what = f"endpoint {endpoint!r}" if kind == "quota" and endpoint else f"provider {provider!r}"
        when = f" until {_iso(resets_at)}" if resets_at is not None else ""
        headers = {}
        retry_after_s = None
        if resets_at is not None:
            now = now or datetime.now(timezone.utc)
            retry_after_s = max(1, math.ceil((resets_at - now).total_seconds()))
            headers["Retry-After"] = str(retry_after_s)
        super().__init__(f"treg's own account for {what} is out of capacity ({kind}){when}; a call with your "
                         "own or your team's credential is not affected", refused_by="capacity", headers=headers,
                         provider=provider, endpoint=endpoint, kind=kind, alternatives=alternatives,
                         overflow_refused=overflow_refused)
        self.resets_at = resets_at
        #: the whole seconds ``Retry-After`` says (None: the reset is unknown)
        self.retry_after_s = retry_after_s

    def body(self) -> dict[str, Any]:
        out = super().body()
        out["endpoint"] = self.extra["endpoint"]  # always present, even when null (the contract)
        out["resets_at"] = _iso(self.resets_at)
        out["retry_after_s"] = self.retry_after_s
        return out


def _iso(when: datetime | None) -> str | None:
    return when.astimezone(timezone.utc).isoformat().replace("+00:00", "Z") if when is not None else None
