"""Resolve stage, catalog half: ``/catalog/call/<id>`` and the ``/call/<name>`` named-miss fall-through.

The catalog package decides (pure functions, given what the org holds: ``treg/org_data.py``'s cached
read); this module only turns its :class:`~treg.catalog.ladder.CatalogTarget` into the pipeline's
:class:`ResolvedTarget`, so everything after resolution (ACL, deny rules, money, relay, audit) is shared
with own-tool calls.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from treg import idempotency
from treg.call import demo
from treg.call.injection import provider_plan
from treg.call.resources import call_pin
from treg.call.state import CallState
from treg.call.types import CallInput, ResolvedTarget
from treg.catalog import lookup
from treg.catalog.errors import NoCredential
from treg.catalog.ladder import plan_call
from treg.catalog.enforce import check_request
from treg.catalog.guards import Applied
from treg.catalog.model import Endpoint
from treg.catalog.tiers import OrgCredentials
from treg.context import Services
from treg.oauth import credentials as oauth
from treg.errors import TregError
from treg.identity import Identity
from treg.org_data import load_org_credentials, org_tools, usable
from treg.query import split_query


async def _request_body(svc: Services, state: CallState, endpoint: Endpoint) -> bytes | None:
    """The whole body when a check must read it (read once, bounded); else it keeps streaming."""
    body = state.inp.body
    if body is None or isinstance(body, bytes):
        return body
    return await state.read_body(svc.settings.json_body_max_bytes) if endpoint.needs_body else None


async def target_for(svc: Services, ident: Identity, state: CallState, endpoint: Endpoint,
                     surface: str) -> ResolvedTarget:
    if endpoint.route is not None:  # treg.<capability>: no ladder of its own (treg/call/routed.py runs it)
        if ident.is_demo:
            raise demo.routed(endpoint.id)
        return ResolvedTarget(upstream_url="", query=(), tool=None, bindings=(), provider=endpoint.provider,
                              endpoint_id=endpoint.id, routed=endpoint.route)
    registry = svc.catalog
    # a public demo's call sees none of the org's credentials: anonymous or platform only (demo.py)
    creds = demo.credentials(ident) if ident.is_demo else await load_org_credentials(svc, ident, [endpoint.provider])
    lookup.ensure_live(registry, endpoint, svc.settings, creds)
    body = await _request_body(svc, state, endpoint)
    inp = state.inp
    # a bodiless request is checked and planned once per shape (see ``plan_key``); a body is checked each time
    key = plan_key(endpoint, inp.method, inp.raw_query, surface, creds) if body is None else None
    hit = svc.catalog_plans.get(key) if key is not None else None
    if hit is not None and hit[0] is endpoint:  # the same endpoint object: no catalog reload in between
        cat = hit[1]
    else:
        checked = check_request(endpoint, method=inp.method, query=split_query(inp.raw_query), body=body,
                                surface=surface)
        try:
            cat = plan_call(registry, endpoint, checked, creds, svc.settings, body=body)
        except NoCredential as exc:  # a provider that declares OAuth: the refusal carries a connect_url
            if ident.is_demo:
                raise demo.not_offered(endpoint.id) from None
            raise await oauth.no_credential(svc, ident, endpoint.provider, exc) from None
        if key is not None:
            svc.catalog_plans.put(key, (endpoint, cat))
    # treg's key: a guard's default is part of the request from here on (the relay, the idempotency digest
    # and the archive key all read this one request)
    state.inp = inp = with_defaults(inp, cat.guarded)
    tool = None
    if cat.tool_id is not None:
        tool = next((t for t in await org_tools(svc, ident.org_id) if t.id == cat.tool_id), None)
    if tool is not None and tool.bindings == cat.bindings:
        plan = tool.plan  # own tier: compiled with the org's tools
    elif cat.connection_id is not None:  # the provider's auth, filled by an OAuth connection's token
        plan = provider_plan(svc, cat.provider)._replace(connections=True)
    elif cat.tier in ("team", "platform"):
        plan = provider_plan(svc, cat.provider)  # the provider's auth, filled per tier
    else:
        plan = None  # anonymous (nothing to inject), or an own tool the cache has not seen yet
    base, _, fixed_query = cat.upstream_url.partition("?")
    extra = list(cat.required_headers)
    if cat.guarded.body_created:  # the body is treg's own JSON object (the caller sent none)
        extra.append(("Content-Type", "application/json"))
    if cat.scope_idempotency_key and inp.idempotency_key:
        # one shared provider account: the upstream sees a digest of (org, label), never the label
        extra.append(("Idempotency-Key", idempotency.shared_key_digest(ident.org_id, inp.idempotency_key,
                                                                         call_pin(inp))))
    return ResolvedTarget(
        upstream_url=base, query=tuple(split_query(fixed_query)) + tuple(cat.query), tool=tool,
        bindings=cat.bindings, provider=cat.provider.id, credential_tier=cat.tier, endpoint_id=endpoint.id,
        extra_headers=tuple(extra), billed=cat.billed, catalog=cat, plan=plan)


def plan_key(endpoint: Endpoint, method: str, raw_query: str, surface: str,
             creds: OrgCredentials) -> tuple[Any, ...]:
    """What ``check_request`` and ``plan_call`` read of a bodiless call, as a memo key: the endpoint (by
    identity; the memo's value holds it, so the id is never another object's), the method, the raw
    query, the surface, and the org's credentials for the endpoint's provider — its own tools, its
    newest secret, its connections (the ladder reads no other provider's unless it refuses, and a
    refusal is never kept). The settings and the catalog are the services' own, fixed while they live.

    A speed trick (docs/performance.md round 8): a repeated platform-tier call skips the request check
    and the ladder, about a tenth of its CPU."""
    p = endpoint.provider
    return (id(endpoint), method, raw_query, surface, creds.own_for(p), creds.team_secret_for(p),
            creds.own_connection_for(p), creds.team_connection_for(p))


def with_defaults(inp: CallInput, guarded: Applied) -> CallInput:
    """The request as treg sends it once a platform-tier guard's defaults are in (treg/catalog/guards.py):
    the default query pairs appended to the raw query, the body with its added fields (and its length).
    Everything after resolution reads this one request: the relay, and the idempotency digest and the
    archive key, so a request naming a default and one leaving it out are one request, as the vendor
    sees them."""
    if guarded.query:
        added = "&".join(f"{k}={v}" for k, v in guarded.query)
        inp = replace(inp, raw_query=f"{inp.raw_query}&{added}" if inp.raw_query else added)
    if guarded.body is not None:
        inp = replace(inp, body=guarded.body, content_length=len(guarded.body))
    return inp


async def resolve_catalog_surface(svc: Services, ident: Identity, state: CallState) -> ResolvedTarget:
    """``/catalog/call/<id>`` (and ``/table/<id>``): exact endpoint ids only; no org tool can shadow one."""
    endpoint = lookup.resolve_catalog_call(svc.catalog, state.inp.rest)
    return await target_for(svc, ident, state, endpoint, "/table" if state.inp.surface == "table" else "/catalog/call")


async def named_miss(svc: Services, ident: Identity, state: CallState, name: str,
                     path: str | None) -> ResolvedTarget | None:
    """``/call/<name>`` found no org tool: an exact catalog id is that endpoint (a path behind it: 400).
    None: not a catalog id; the resolver answers its own 404 (see :func:`final_miss`)."""
    endpoint = lookup.resolve_named_miss(svc.catalog, state.inp.rest)
    if endpoint is None:
        return None
    try:
        return await target_for(svc, ident, state, endpoint, "/call")
    except NoCredential as exc:
        # a connected tool sharing the dotted name's first segment is the likelier intent
        first = name.split(".", 1)[0]
        for tool in await org_tools(svc, ident.org_id):
            if tool.name == first and usable(ident, tool):
                exc.extra["hint"] = f"{first} is a tool of this org: call /call/{first}/<path>"
        raise


def final_miss(svc: Services, name: str) -> TregError | None:
    """Every shape missed: a dotted, catalog-looking name gets endpoint_not_found with did_you_mean."""
    return lookup.named_miss_error(svc.catalog, name)


def settle_amount(target: ResolvedTarget, answer: Any) -> int:
    return int(target.catalog.settle_micro(answer))
