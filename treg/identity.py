"""Who is calling: the :class:`Identity` every stage and management function is handed, the role rule
on it, and :class:`Credential`, the kinds of credential that are not a token.

The value only, importable from any layer (the catalog's ladder and the call stages read it): this
module imports nothing of treg but its errors. Finding the identity behind a token or a credential is
treg/authentication.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from treg.errors import Forbidden

MANAGER_ROLES = ("owner", "admin")

#: what a token may do (docs/sharing.md): ``full``, every route its member may use; ``table``, GETs of
#: ``/table/`` only (a read-only token for spreadsheets); ``demo``, the public demo's calls only
FULL, TABLE, DEMO = "full", "table", "demo"
SCOPES = (FULL, TABLE, DEMO)


@dataclass(frozen=True)
class Identity:
    """Who is calling: resolved from ``X-Treg-Token`` (and checked against ``X-Treg-Org``)."""

    org_id: str
    org_slug: str
    member_id: str
    user_id: str
    email: str
    role: str
    #: None: every project of the org
    project_ids: tuple[str, ...] | None
    token_id: str
    #: the token's scope (:data:`SCOPES`); a dashboard session is always ``full``
    scope: str = FULL
    #: the member's cap on calls a UTC day (treg/member_limits.py); None: none, and no query is spent on it
    calls_per_day: int | None = None

    @property
    def is_manager(self) -> bool:
        # a scoped token never manages, whoever its member is (a demo token is issued for the org's owner)
        return self.role in MANAGER_ROLES and self.scope == FULL

    #: a public demo's token (``scope == DEMO``): a field made once with the identity (which the identity
    #: cache keeps), not a property asked several times a call
    is_demo: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_demo", self.scope == DEMO)  # frozen: dataclasses' own way to set it


class Credential:
    """A call's identity that is not a token, one kind per subclass (the dashboard's session cookie with
    its ``X-Treg-CSRF``: ``SessionCookie``, treg/ui_sessions.py). Its own :meth:`identity` finds the
    caller: :func:`treg.authentication.authenticate` asks it instead of the tokens table, and nothing
    that reads a token (the identity cache) takes one."""

    __slots__ = ()

    async def identity(self, svc: Any) -> Identity:
        """The caller; ``svc`` is the process's ``Services`` (treg/context.py, a layer above this one)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}('***')"


def require_manager(ident: Identity) -> None:
    if not ident.is_manager:
        raise Forbidden("only an org owner or admin may do this", code="forbidden_role")
