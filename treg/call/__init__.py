"""The call pipeline: one call through its stages, each in its own module, in this order.
``service.execute`` runs them (it reads as this list); stages hand each other frozen values
(``types.py``) and fill in the call's one mutable :class:`~treg.call.state.CallState` (``state.py``).

1. ``intake.py`` — the control headers, the caller identified (identity before work), then the body
   the edge left pending (the aiohttp half is ``treg/web/call.py``).
2. ``resolve.py`` — which upstream, through which tool: by name, by passthrough URL (``target.py``; the
   org's tools are ``treg/org_data.py``'s), a catalog endpoint (``catalog_stage.py``), another org's
   published hub tool (``hub_stage.py``) or a sealed redirect (``redirects.py``).
3. ``authorize.py`` — the tool ACL, then the org's deny rules on where the call really goes, then the
   member's call cap (``call_caps.py``: every call that passes counts, any tier, own tools too; a call
   refused later gives its count back in 7's exit), then a public demo call's gate (``demo.py``); then,
   on a catalog call, the features' gates (the table below).
4. ``reserve.py`` — platform tier only: the idempotency claim, then the money hold.
5. ``relay.py`` — the exact upstream request with its credentials injected, its destination vetted,
   sent.
6. ``settle.py`` — the answer made streamable: a metered one read whole and its hold settled, any
   other relayed as it arrives (``metered.py``, ``encodings.py``).
7. ``record.py`` — one audit row and ``tool_called`` event per identified attempt (``evidence.py``,
   ``audit.py``), and the one exit that unwinds and records every failure.

Two catalog row rules act in stages above (``treg/catalog/``): **request guards** (``guards.py``) in 2,
the ladder's platform branch: treg's own key refuses an integer out of range and sends a missing
default, before any hold (``catalog_stage.with_defaults``: the request as sent from there on); the
**success rule** (``success.py``) in 6: a metered 2xx failing it is a ``vendor_error``, its hold released
(``settle.vendor_success``), and it decides an async submission's acceptance and done poll
(``jobs.py``), what the archive stores (``archive.py``) and which routed child answered (``routed.py``).

A routed ``treg.<capability>`` leaves after 2 (counted once against the member's call cap): ``routed.py`` runs its children through this list, one
child call each, and closes the holds their settle stages left open.

**The catalog's features, by stage.** Seven features of catalog calls, and the hub (a call of a tool
another org published, which is no catalog call but has parts in the same stages), act in some of the
stages: each
part is one function of the feature's own module, called with one line from its stage, and its number
is its place in that stage ("1-3" says instead, in parentheses, which stage calls it: 1 intake, in
``service.execute``; 2 ``resolve.py`` or ``catalog_stage.py``; 3 authorize: ``authorize.py``, then
``execute``'s call cap and the demo's gate), "after 3" is ``service.execute``'s gates between authorize
and reserve, "4 reserve" the reserve stage's (the claim, the overflow and the hold are
``reserve.reserve``'s, the archive's lookup ``execute``'s next line), "6 settle" the settle stage's
metered answer (``settle._metered_outcome``; ``read_whole`` decides it is one), and "then" the parts
``service.answer`` runs on the answer settle made (or a replay's, an archive hit's) before it leaves. An
own tool's call runs none of the catalog's parts: ``execute`` and ``settle`` ask once whether the target
is a catalog endpoint (and, when it is not, whether it is a hub call). Money's parts are in the table
because the others are ordered around them (an answer is stored for a replay before its hold is settled;
the breaker is told once the hold is closed). tests/test_call_features.py holds this table against the
code.

===============  ==============  =============  ===================  =============  ===================  ===============
feature          1-3             after 3        4 reserve            5 relay        6 settle             7 the exit
===============  ==============  =============  ===================  =============  ===================  ===============
owned resources                  1 check_owned                                      read_whole;
                                                                                    2 observe_answer
async jobs                       2 guard                                            read_whole;
                                                                                    3 after_answer;
                                                                                    deferred (cost)
capacity                         3 check_lock                        send: spacer,  8 after_answer
                                                                     burst re-sent
overflow                         may_overflow   2 instead_of_direct                 1 after_direct       Attempt.close
                                 (asked by 3)
archive                                         4 lookup                            7 observe, or
                                                                                    read_for_archive
money                                           1 claim_key,                        4 store_for_replay,  close_money,
                                                3 place_hold                        6 close_hold         claim let go
/table/          intake (1);                                                        read_whole;
                 check_endpoint                                                     5 settles;
                 (2)                                                                then finish
public demo      screen (2);                    hold_cap (on                        then mark            give_back,
                 credentials,                   place_hold)                                              refusal_headers
                 not_offered,
                 routed (2);
                 gate (3, after
                 the call cap)
hub                                             admit: claim,        secrets_org    answer: read whole,  scrub_error;
                                                slot, hold                          masked, settled      audit_rows
===============  ==============  =============  ===================  =============  ===================  ===============

* **owned resources** (``resources.py``; its rows ``treg/owned_resources.py``, its row descriptor
  ``treg/catalog/managed.py``): on treg's key an update, use or delete must name an object of the
  caller's org (refused before any hold); a managed answer is read whole and a create's object recorded
  as the org's before its id leaves.
* **async jobs** (``jobs.py``; ``treg/jobs/store.py``, ``treg/catalog/async_jobs.py``): a platform-tier
  poll or fetch must name a job of the caller's org; a submission's job is recorded and its hold left
  open to its polls (its answer then has no ``X-Treg-Cost-Micro``: ``deferred``), the poll that reads it
  done settles it.
* **capacity** (``capacity_stage.py``; ``treg/capacity/``): a locked platform key is refused before any
  hold (or its call is the lock's probe); only a platform-tier call's send goes through ``send`` (every
  other call's is the relay's plain ``send``); the breaker learns from the answer once its money is
  closed. Its ``X-Treg-Capacity-Probe`` / ``X-Treg-Smoothed`` are among the catalog's headers
  (``CallState.catalog_headers``), refusals included.
* **overflow** (``overflow_stage.py``, its pure judge ``overflow_outcome.py``; ``treg/overflow/``): a call
  the lock would refuse (``may_overflow``, asked by ``check_lock``) goes to an aggregator instead of the
  direct attempt; a direct answer saying treg's account is out is served through one; the overflow
  attempt's own hold is closed by the exit when the call fails.
* **archive** (``archive.py``; ``treg/archive/store.py``, ``treg/catalog/archive_policy.py``): after every
  gate and the hold, a stored answer is served without the vendor; a fresh 2xx is classified and stored
  (``observe`` for a metered answer, ``read_for_archive`` for a streamed one).

* **/table/** (``table.py``; the row's ``table`` descriptor and the table made of an answer, JSON or CSV,
  ``treg/catalog/table.py``; docs/sharing.md): in intake (``service.execute``, after the token's scope,
  ``intake.check_scope``) the surface's own ``?format=`` and ``Accept`` come off the request and a token
  in the query is refused; in resolve an endpoint without a ``table`` is refused before anything; the
  answer is read whole on every tier and a 2xx with no rows releases its hold (``settles`` makes the
  table, once); ``finish`` sends the table, or 502 ``table_upstream_error`` for a non-2xx answer.
* **public demo** (``demo.py``; the switch, tokens, hourly window and budget ``treg/public_demo.py``; a
  ``demo``-scoped token's call): in resolve a listed endpoint by its exact id only, GET only
  (``screen``), the ladder without ``own``/``team`` (``credentials``; ``not_offered``, ``routed`` in
  ``catalog_stage.py``); its ``gate`` is the authorize stage's last (``service.execute``, after the tool
  ACL, the deny rules and the member's call cap: the seed's order), the hour per client address counted
  there; the daily budget
  rides every hold it places (``hold_cap``: reserve's and an overflow attempt's); the exit gives the hour
  back when refused before any vendor contact (``give_back``) and marks the refusal; ``mark`` puts
  ``X-Treg-Demo: 1`` on every other answer.

* **hub** (``hub_stage.py``, ``hub_views.py``; its published tools ``treg/hub/``, its slots
  ``treg/hub_runs.py``): a named miss of the org's tools and of the catalog that is a ref
  ``<org-slug>.<name>`` resolves, on a top-level call only, to the publisher's tool
  (``resolve.named_miss``, in 2), authorized under both orgs' deny rules and no ACL of the publisher's
  (``authorize.py``, 3); instead of the catalog's gates and reserve, ``admit`` claims its
  ``Idempotency-Key`` (priced calls), takes its run's slot (429 ``hub_busy``, never queued) and places the
  caller's hold, credited to the publisher when it settles (one statement, docs/money.md "Hub calls");
  the relay injects the publisher's credentials (``secrets_org``); instead of the metered or streamed
  answer, ``answer`` reads it whole, masks the publisher's values, stores it for a replay, then settles
  or releases the hold (``CallState.close_money``); the exit scrubs the publisher's setup from a
  refusal (``scrub_error``) and gives the slot back, and every row is written once in each org
  (``audit_rows``, from ``CallState.record``). Its answers carry ``CallState.catalog_headers``' tier
  (``hub``) and cost.

Every answer of a catalog call carries ``CallState.catalog_headers`` (tier, cost, the archive's
``X-Treg-Cache``, the capacity headers); an answer treg has whole (a replay, an archive hit, an overflow's
or a routed call's) is built by ``CallOutcome.whole_answer`` and recorded by ``record.answered``; a stage
that must see the caller's body reads it with ``CallState.read_body``.
"""
