"""Frozen values passed between the call pipeline's stages (intake → resolve → authorize → reserve →
relay → settle → record). None of them knows about aiohttp."""

from __future__ import annotations

from dataclasses import field
from typing import Any, AsyncIterable, Awaitable, Callable, NamedTuple

from treg.bindings import Binding
from treg.frozen import frozen_value
from treg.identity import Credential


def split_query(raw: str) -> list[tuple[str, str | None]]:
    """Raw query pairs in order, duplicates and encoding kept (``?flag`` → ``("flag", None)``)."""
    if not raw:
        return []
    out: list[tuple[str, str | None]] = []
    for seg in raw.split("&"):
        k, eq, v = seg.partition("=")
        out.append((k, v if eq else None))
    return out


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
class ToolRef:
    id: str
    org_id: str
    name: str
    base_url: str
    host: str
    bindings: tuple[Binding, ...]
    project_id: str | None
    allowed_member_ids: tuple[str, ...] | None
    #: True when a binding's secret carries a provider (registry-backed; wins a passthrough tie)
    provider_backed: bool = False
    #: the bindings' injection plan (treg/call/injection.py), compiled when the tools cache loads the tool
    plan: Any = field(default=None, repr=False, compare=False)
    #: the base URL without its query and trailing slashes, and its query pairs (split once, at load)
    base: str = field(init=False, repr=False, compare=False)
    base_query: tuple[tuple[str, str | None], ...] = field(init=False, repr=False, compare=False)
    #: ``base`` without its trailing slashes, plus one: where a call's path is appended
    base_slash: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        base, _, query = self.base_url.partition("?")
        object.__setattr__(self, "base", base)
        object.__setattr__(self, "base_slash", base.rstrip("/") + "/")
        object.__setattr__(self, "base_query", tuple(split_query(query)))

    def as_mapping(self) -> dict[str, Any]:
        return {"project_id": self.project_id, "allowed_member_ids": self.allowed_member_ids}


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

    @property
    def project_id(self) -> str | None:
        return self.tool.project_id if self.tool else self.scope_project_id

    @property
    def full_url(self) -> str:
        if not self.query:
            return self.upstream_url
        return self.upstream_url + "?" + "&".join(k if v is None else f"{k}={v}" for k, v in self.query)


class CallRecord(NamedTuple):
    """One audit row: an attempt, successful or not.

    Immutable like the other stage values, but a NamedTuple rather than a frozen dataclass: one is
    built for every call, and a frozen dataclass of this many fields costs several times as much to
    construct (an ``object.__setattr__`` per field); the audit writer also sends it as a JSON array as
    it is (a speed trick: docs/performance.md)."""

    id: str
    org_id: str
    member_id: str | None
    surface: str
    method: str
    target: str
    outcome: str
    status: int | None = None
    upstream_url: str | None = None
    tool_id: str | None = None
    tool_name: str | None = None
    provider: str | None = None
    endpoint_id: str | None = None
    refused_by: str | None = None
    error_code: str | None = None
    blame: str | None = None
    credential_tier: str | None = None
    cost_micro: int = 0
    hold_state: str | None = None
    tag: str | None = None
    request_bytes: int | None = None
    response_bytes: int | None = None
    duration_ms: int | None = None
    ttfb_ms: int | None = None
    error_request: dict[str, Any] | None = None
    error_response: dict[str, Any] | None = None
    failure_kind: str | None = None
    parent_call_id: str | None = None
    result_state: str | None = None
    cache_state: str | None = None
    kind: str | None = None
    #: the platform-tier answer's capacity classification (balance, quota, burst, edge_block, unrecorded):
    #: rides the ``tool_called`` event; not a column (the audit writer stores only the table's columns)
    capacity_signal: str | None = None
    #: ``overflow:<aggregator>`` on an overflow attempt's row (treg/call/overflow_stage.py)
    served_via: str | None = None
    #: the kind of credential injected (``oauth``, ``secret``, ``platform``; None: none) and, on ``oauth``,
    #: the connection (docs/oauth.md)
    credential_kind: str | None = None
    connection_id: str | None = None
    #: made with a public demo's (``demo``-scoped) token (docs/sharing.md)
    demo: bool = False
    # -- the ``tool_called`` event's own fields, after every column: not stored (the audit writer sends
    # only the fields up to the last column, treg/call/audit.py)
    #: the caller's User-Agent (cut to USER_AGENT_MAX characters): which client or SDK calls
    user_agent: str | None = None
    #: the call was its capacity lock's probe (X-Treg-Capacity-Probe: 1)
    probe: bool = False
    #: the burst smoothing applied (X-Treg-Smoothed: ``wait=<ms>``, ``retry=1``), None: none
    smoothed: str | None = None
    #: why the result classifier said what it said (treg/results.py ``REASONS``)
    result_reason: str | None = None
    #: the archive's admission decision on a fresh answer (treg/call/archive.py ``ADMISSIONS``)
    cache_admission: str | None = None


#: the longest User-Agent an event carries (a header may be kilobytes long; what identifies a client
#: comes first)
USER_AGENT_MAX = 256
