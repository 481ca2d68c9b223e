"""One error root for everything treg refuses.

Every failure treg itself produces is a :class:`TregError` carrying the HTTP status, a stable
machine ``code``, a human ``detail`` and the ``blame`` (who must act). The web edge renders it as the
contract's error body; plain-Python stages raise it without knowing about HTTP frameworks.
Lower-library errors (aiohttp, psycopg2) are mapped to these at the infra boundary with
``raise ... from exc`` so they never reach a handler.
"""

from __future__ import annotations

from typing import Any, Literal

Blame = Literal["caller", "treg", "upstream", "org_connection"]


class TregError(Exception):
    status: int = 500
    code: str = "internal_error"
    blame: Blame = "treg"

    def __init__(
        self,
        detail: str,
        *,
        code: str | None = None,
        status: int | None = None,
        blame: Blame | None = None,
        refused_by: str | None = None,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        if blame is not None:
            self.blame = blame
        #: which gate refused the call (acl, deny, ssrf, ...), recorded on the audit row
        self.refused_by = refused_by
        #: extra response headers (e.g. Retry-After)
        self.headers = dict(headers or {})
        #: extra keys of the error body (hint, did_you_mean, candidates, ...)
        self.extra = extra

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.code, "detail": self.detail, "blame": self.blame}
        out.update({k: v for k, v in self.extra.items() if v is not None})
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status}, {self.code!r}, {self.detail!r})"


class BadRequest(TregError):
    status, code, blame = 400, "bad_request", "caller"


class Unauthorized(TregError):
    status, code, blame = 401, "unauthorized", "caller"


class Forbidden(TregError):
    status, code, blame = 403, "forbidden", "caller"


class NotFound(TregError):
    status, code, blame = 404, "not_found", "caller"


class Conflict(TregError):
    status, code, blame = 409, "conflict", "caller"


class Gone(TregError):
    status, code, blame = 410, "gone", "caller"


class PaymentRequired(TregError):
    status, code, blame = 402, "payment_required", "caller"


class Unprocessable(TregError):
    status, code, blame = 422, "unprocessable", "caller"


class TooBusy(TregError):
    status, code, blame = 429, "busy", "treg"


class GatewayFailed(TregError):
    """treg could not get an answer from the upstream (or refused to try: SSRF, limits)."""

    status, code, blame = 502, "upstream_unreachable", "upstream"


class CapacityError(TregError):
    status, code, blame = 503, "capacity", "treg"


class ConfigError(TregError):
    """treg is misconfigured (settings, plugins, catalog): startup refuses."""

    status, code, blame = 500, "config_error", "treg"


class DatabaseError(TregError):
    status, code, blame = 503, "database_unavailable", "treg"


class IntegrityError(DatabaseError):
    """A constraint refused a write; ``constraint`` names it so domain code can explain."""

    status, code, blame = 409, "conflict", "caller"

    def __init__(self, detail: str, *, constraint: str | None = None, **kw: Any) -> None:
        super().__init__(detail, **kw)
        self.constraint = constraint
