"""One error root for everything treg refuses, drawn by failure domain.

Every failure treg itself produces is a :class:`TregError` carrying the HTTP status, a stable
machine ``code``, a human ``detail`` and the ``blame`` (who must act). The web edge renders it as the
contract's error body; plain-Python stages raise it without knowing about HTTP frameworks.
Lower-library errors (aiohttp, psycopg2) are mapped to these at the infra boundary with
``raise ... from exc`` so they never reach a handler. Code that must tell failures apart branches on
these classes (``isinstance``), never on ``code`` strings; every code is listed in ``docs/errors.md``
(tests/test_errors_doc.py)::

    TregError                    500 internal_error        treg      the root; an unexpected bug
    │
    ├── caller input: the request itself is wrong                                  blame caller
    │   ├── BadRequest           400 bad_request                     malformed / invalid value
    │   │   ├── CatalogPathNotAllowed 400                            (treg.catalog.errors)
    │   │   └── InvalidParameters     400                            (treg.catalog.errors)
    │   ├── MethodNotAllowed     405 method_not_allowed              (treg.catalog.errors)
    │   └── Unprocessable        422 unprocessable                   well-formed, refused
    │
    ├── identity and permission                                                    blame caller
    │   ├── Unauthorized         401 unauthorized                    no (valid) identity
    │   └── Forbidden            403 forbidden                       ACL, role, deny rule
    │
    ├── existence: not found, gone, conflict                                       blame caller
    │   ├── NotFound             404 not_found
    │   │   ├── EndpointNotFound      404                            (treg.catalog.errors)
    │   │   └── NoCredential          404                            (treg.catalog.errors)
    │   ├── Gone                 410 gone
    │   │   └── EndpointRetired       410                            (treg.catalog.errors)
    │   └── Conflict             409 conflict                        exists already, in use
    │       └── IntegrityError   409 conflict                        a constraint refused a write
    │
    ├── money and call limits                                                      blame caller
    │   ├── PaymentRequired      402 payment_required                balance, caps, budgets
    │   └── MemberCallCap        429 member_call_cap                 a member's calls a day (treg.member_limits)
    │
    ├── upstream: no answer from the upstream                                      blame upstream
    │   └── GatewayFailed        502 upstream_unreachable            timeout, reset, bad answer,
    │       │                                                        treg-side limits
    │       └── SsrfRefused      502 ssrf_refused       blame caller nothing sent: internal address
    │
    └── treg-internal: treg cannot do its job                                      blame treg
        ├── ConfigError          500 config_error                    startup refuses
        │   ├── CatalogError          500 invalid_catalog            (treg.catalog.errors)
        │   └── PluginFailed          500 plugin_failed              (treg.plugins)
        ├── DatabaseError        503 database_unavailable            unreachable, aborted tx
        │   ├── DbPoolExhausted  503 db_pool                         no pooled connection in time
        │   └── DataRefused      503 database_error                  a value it cannot store
        └── DecryptError         500 secret_undecryptable            (treg.infra.crypto)

A class's ``code``/``status``/``blame`` are defaults: a raise site may pass a more specific ``code``
(``invalid_base_url`` is a ``BadRequest``); it subclasses instead when other code must recognise it.
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

    @property
    def is_refusal(self) -> bool:
        """treg refused the call: a gate said no (``refused_by``), the request was the caller's fault (any
        4xx), or its host is one treg does not reach. The audit row's outcome is then ``refused``, else
        ``gateway_failed``; a refused call does not count against a member's call cap."""
        return self.refused_by is not None or self.status < 500 or isinstance(self, SsrfRefused)

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.code, "detail": self.detail, "blame": self.blame}
        out.update({k: v for k, v in self.extra.items() if v is not None})
        return out

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status}, {self.code!r}, {self.detail!r})"


class BadRequest(TregError):
    status, code, blame = 400, "bad_request", "caller"


class BodyTooLarge(BadRequest):
    """A request body over its route's limit (read whole up to it, never further)."""

    code = "body_too_large"


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


class GatewayFailed(TregError):
    """treg could not get an answer from the upstream (or refused to try: SSRF, limits)."""

    status, code, blame = 502, "upstream_unreachable", "upstream"


class SsrfRefused(GatewayFailed):
    """The upstream host is (or resolves to) an address treg refuses to reach; nothing was sent."""

    status, code, blame = 502, "ssrf_refused", "caller"

    def __init__(self, detail: str, *, addresses: tuple[Any, ...] = (), **kw: Any) -> None:
        kw.setdefault("refused_by", "ssrf")
        super().__init__(detail, **kw)
        #: the refused addresses, for logs and the audit row — never in the caller's error body, so a
        #: caller cannot use treg as an oracle for internal DNS
        self.addresses = addresses


class ConfigError(TregError):
    """treg is misconfigured (settings, plugins, catalog): startup refuses."""

    status, code, blame = 500, "config_error", "treg"


class DatabaseError(TregError):
    """The database is unreachable, its pool exhausted, or it aborted the request (treg's problem)."""

    status, code, blame = 503, "database_unavailable", "treg"


class DbPoolExhausted(DatabaseError):
    """No pooled connection came free in time: treg's capacity (the call path records it apart)."""

    code = "db_pool"


class DataRefused(DatabaseError):
    """The database refused the statement for what it carries (SQLSTATE class 22, a data exception: a
    string longer than its column, a character it cannot store; class 54, a program limit such as an
    index row too large). Sending the same statement again cannot succeed; a batch writer isolates
    the row instead (treg/call/audit.py). Any other failure may pass: it is retried."""

    code = "database_error"


class IntegrityError(Conflict):
    """A constraint refused a write; ``constraint`` names it so domain code can explain.

    A :class:`Conflict`, not a :class:`DatabaseError`: the data said no (a duplicate name, a missing
    parent row), the database itself is fine; a handler catching database outages must not swallow it.
    """

    def __init__(self, detail: str, *, constraint: str | None = None, **kw: Any) -> None:
        super().__init__(detail, **kw)
        self.constraint = constraint
