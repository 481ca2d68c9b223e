"""Hub tools (docs/sharing.md "Hub"): an org publishes one of its tools so members of every org on this
treg can call it as ``/call/<org-slug>.<name>/…`` without ever seeing its credential.

* :mod:`treg.hub.model` — the published tool as the pipeline reads it (:class:`HubTool`), names and refs;
* :mod:`treg.hub.store` — publish, list, unpublish (the management functions the API, the dashboard and
  MCP share) and the index of refs the resolver reads (cached, invalidated by LISTEN/NOTIFY).

The runs' slots in PostgreSQL (at most ``TREG_HUB_MAX_RUNS_PER_TEAM`` runs of one publishing org and
``max_runs`` of one tool across every process, leased so a dead process frees its slots) and ``hub_busy``
are ``treg/hub_runs.py``: a field of the services, it sits below them (docs/architecture.md "Layers").
The hub's other refusals are the usual classes with codes of their own.

The call pipeline's half is ``treg/call/hub_stage.py`` and ``treg/call/hub_views.py``.
"""
