"""Frozen values passed between the call pipeline's stages (intake → resolve → authorize → reserve →
relay → settle → record). None of them knows about aiohttp."""

from __future__ import annotations

from dataclasses import field
from typing import Any, AsyncIterable, Awaitable, Callable

from treg.bindings import Binding
from treg.frozen import frozen_value
from treg.identity import Credential
from treg.infra.upstream import UpstreamRequest
from treg.org_data import ToolRef
from treg.redaction import Redactor, RedactorMemo

#: the HTTP call surfaces by the path each is served under (``rest`` is what follows it)
SURFACE_PREFIXES = {"call": "/call/", "catalog": "/catalog/call/", "table": "/table/", "redirect": "/redirect/"}


@frozen_value
class CallInput:
    """What the caller sent, as the edge saw it (raw path and query: percent-encoding untouched)."""

    call_id: str
    surface: str  # "call" | "catalog" | "table" | "redirect" | "mcp" (the audit row's surface)
    method: str
    rest: str  # raw path after /call/ (or /catalog/call/), without the query
    raw_query: str  # raw query string without '?', '' when none
    #: every request header, in order, duplicates kept (X-Treg-Token among them: never in a repr)
    headers: tuple[tuple[str, str], ...] = field(repr=False)
    #: the caller's X-Treg-Token, or a credential of another kind (the dashboard's session cookie)
    token: str | Credential | None = field(repr=False)
    org_hint: str | None
    #: None: the caller sent no body; bytes: buffered (small, decoded, or JSON-bound); a PendingBody:
    #: the edge's reading waits for identity; else a stream
    body: bytes | AsyncIterable[bytes] | PendingBody | None = field(repr=False)
    content_length: int | None  # the caller's declared length (None when chunked or absent)
    tag: str | None = None
    idempotency_key: str | None = None
    user_agent: str | None = None
    #: the call this one continues (a followed redirect, a routed endpoint's child), for its audit row
    parent_call_id: str | None = None
    #: how ``rest`` is resolved when the surface does not say it: "catalog" as /catalog/call/ (an MCP
    #: catalog_call); None: as the surface's own form
    form: str | None = None
    #: a routed call's child (treg/call/routed.py): where the settle stage leaves its hold, open, for the
    #: routed call to close; None: the call closes its own hold
    deferred: Any = field(default=None, repr=False, compare=False)
    #: the connection's peer address (the public demo counts calls by client address: treg/forwarded.py)
    peer: str | None = None

    @property
    def catalog_form(self) -> bool:
        """Resolved as ``/catalog/call/<endpoint-id>``: exact endpoint ids only, no org tool shadows one
        (``/table/<endpoint-id>`` too: the same call, answered as a table)."""
        return self.surface == "catalog" or self.surface == "table" or self.form == "catalog"

    def header(self, name: str) -> str | None:
        lname = name.lower()
        for k, v in self.headers:
            if k.lower() == lname:
                return v
        return None


@frozen_value
class PendingBody:
    """Intake work that waits until the caller is identified (api.md: a caller without a valid token
    gets its 401 before treg reads or decodes anything): ``load`` reads (and decodes) the body, or
    raises the edge's refusal of the request, and returns the CallInput with its body in hand. The
    call pipeline runs it right after authentication, so an identified caller's refusal is audited."""

    load: Callable[[CallInput], Awaitable[CallInput]] = field(repr=False)


@frozen_value
class ResolvedTarget:
    """Where the call goes and with which credentials."""

    upstream_url: str  # scheme://host/path (encoded), no query
    query: tuple[tuple[str, str | None], ...]  # raw pairs: the base URL's, then the caller's
    tool: ToolRef | None
    bindings: tuple[Binding, ...]
    provider: str | None  # provider identity for events: catalog provider or the tool's host
    credential_tier: str | None = None  # own | team | anonymous | platform (catalog); "tool" for own tools
    endpoint_id: str | None = None
    extra_headers: tuple[tuple[str, str], ...] = ()  # constant headers a provider requires
    billed: bool = False
    catalog: Any = None  # the catalog's own frozen target, when the catalog resolved the call
    #: a passthrough's (scheme, host, port) the tool was chosen by: the URL sent must dial exactly that
    dial: tuple[str, str, int | None] | None = None
    #: the bindings' compiled injection plan (treg/call/injection.py); None: the relay compiles one
    plan: Any = field(default=None, repr=False, compare=False)
    #: no tool, but the project whose deny rules apply: a redirect hop carries its parent tool's
    scope_project_id: str | None = None
    #: a routed ``treg.<capability>`` (treg.catalog.routed.RoutedPlan): its children are the calls
    routed: Any = None
    #: a hub call (treg.hub.model.HubTool): ``tool`` is the publishing org's, run with its credentials
    #: (treg/call/hub_stage.py)
    hub: Any = None

    @property
    def project_id(self) -> str | None:
        return self.tool.project_id if self.tool else self.scope_project_id

    def hub_for(self, org_id: str) -> Any:
        """The published tool when this is a hub call of another org's tool than ``org_id``'s (an org
        calling its own ref calls its own tool: nothing of it is hidden, nothing charged), else None."""
        return self.hub if self.hub is not None and self.hub.org_id != org_id else None

    @property
    def full_url(self) -> str:
        if not self.query:
            return self.upstream_url
        return self.upstream_url + "?" + "&".join(k if v is None else f"{k}={v}" for k, v in self.query)


@frozen_value
class PreparedRequest:
    """The exact upstream request the relay stage built (``treg/call/relay.py`` ``prepare``)."""

    request: UpstreamRequest
    #: every credential value injected (for evidence redaction), never logged nor in a repr
    secret_values: tuple[str, ...] = field(repr=False)
    body_kept: bool  # the body is buffered bytes (evidence may keep it)
    #: memoizes the values' redactor: the org's secrets they came from, or the platform settings' memo
    #: (None: nothing injected)
    secrets: RedactorMemo | None = None
    #: the OAuth connections whose tokens were injected, as (id, token version): an upstream 401 marks
    #: exactly those tokens stale (docs/oauth.md)
    connections: tuple[tuple[str, int], ...] = ()
    #: the org whose credentials were injected (a hub call's: the publisher's; None: the caller's)
    org_id: str | None = None

    def redactor(self) -> Redactor:
        if self.secrets is not None:
            return self.secrets.redactor(self.secret_values)
        return Redactor.for_values(self.secret_values)
