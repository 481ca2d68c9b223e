"""The audit row of one call attempt (:class:`CallRecord`), as the call pipeline builds it
(``treg/call/state.py``), the audit writer stores it (``treg/call/audit.py``) and the metrics and the
``tool_called`` event read it. A plain value below every layer that reads it.
"""

from __future__ import annotations

from typing import Any, NamedTuple


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
    #: a hub call: the ref called, on both orgs' rows; on the publishing org's row the caller's org slug
    hub_ref: str | None = None
    hub_caller_org: str | None = None
    #: the credit lease the call's hold was taken from (docs/money.md "Credit leases"); None: its own hold
    lease_id: str | None = None
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
    #: a hub call of another org's tool: the publishing org's row of the same call (queued beside this
    #: one, treg/call/hub_views.py); None otherwise
    hub_twin: "CallRecord | None" = None


#: the longest User-Agent an event carries (a header may be kilobytes long; what identifies a client
#: comes first)
USER_AGENT_MAX = 256
