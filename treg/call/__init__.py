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

Platform tier (``capacity_stage.py``): a locked key refused between 3 and 4, the spacer and the one
burst re-send around 5's send, the breaker told about the answer in 6 once its hold is closed.

``/table/`` (``table.py``, docs/sharing.md): its format and ``Accept`` taken off the input in 1, an endpoint
without a ``table`` refused in 2, the answer read whole and made a table in 6 (a 2xx with no rows
releases its hold), the table sent by the finish ``service.answer`` gives it.

The public demo (``demo.py``, a ``demo``-scoped token's call): a listed endpoint by its exact id only and
the ladder without ``own``/``team`` in 2, its gate last in 3 (the hour per client address), the daily
budget on the hold in 4, the hour given back by 7's exit when refused before any vendor contact,
``X-Treg-Demo: 1`` on every answer. A scoped token (``table``, ``demo``) reaches only its surfaces: 1
(``intake.check_scope``).
"""
