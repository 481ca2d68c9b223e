"""The call pipeline: one call through its stages, each in its own module, in this order.
``service.execute`` runs them (it reads as this list); stages hand each other frozen values
(``types.py``) and fill in the call's one mutable :class:`~treg.call.state.CallState` (``state.py``).

1. ``intake.py`` — the control headers, the caller identified (identity before work), then the body
   the edge left pending (the aiohttp half is ``treg/web/call.py``).
2. ``resolve.py`` — which upstream, through which tool: by name, by passthrough URL (``target.py``,
   ``org_tools.py``), a catalog endpoint (``catalog_stage.py``) or a sealed redirect (``redirects.py``).
3. ``authorize.py`` — the tool ACL, then the org's deny rules on where the call really goes; then
   ``jobs.py``: a platform-tier poll or fetch reads only the caller's org's async jobs (and, in
   settle, a submission's hold is left to its job).
4. ``reserve.py`` — platform tier only: the idempotency claim, then the money hold.
5. ``relay.py`` — the exact upstream request with its credentials injected (``injection.py``),
   its destination vetted, sent.
6. ``settle.py`` — the answer made streamable: a metered one read whole and its hold settled, any
   other relayed as it arrives (``metered.py``, ``encodings.py``).
7. ``record.py`` — one audit row and ``tool_called`` event per identified attempt (``evidence.py``,
   ``audit.py``), and the one exit that unwinds and records every failure.

A routed ``treg.<capability>`` leaves after 2: ``routed.py`` runs its children through this list, one
child call each, and closes the holds their settle stages left open.

A hub call (``hub_stage.py``: another org's published tool, ``/call/<org-slug>.<name>/…``) is resolved in 2
after the org's tools and the catalog, authorized in 3 under both orgs' deny rules, takes its slot and
the caller's hold in 4, relays with the publisher's credentials in 5, is read whole and checked in 6
and audited twice in 7 (``hub_views.py``).

Platform tier (``capacity_stage.py``): a locked key refused between 3 and 4, the spacer and the one
burst re-send around 5's send, the breaker told about the answer in 6 once its hold is closed.
"""
