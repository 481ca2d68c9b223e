"""Resolve stage, catalog half: ``/catalog/call/<id>`` and the ``/call/<name>`` named-miss fall-through.

The catalog package decides (pure functions + one short read of the org's provider credentials);
this module only turns its :class:`~treg.catalog.ladder.CatalogTarget` into the pipeline's
:class:`ResolvedTarget`, so everything after resolution (ACL, deny rules, money, relay, audit) is shared
with own-tool calls.
"""

from __future__ import annotations

from typing import Any

from treg import idempotency
from treg.call import demo
from treg.call.injection import provider_plan
from treg.call.org_tools import org_tools, usable
from treg.call.relay import buffer_body
from treg.call.resources import call_pin
from treg.call.types import CallInput, ResolvedTarget, split_query
from treg.catalog import lookup
from treg.catalog.errors import NoCredential
from treg.catalog.ladder import load_org_credentials, plan_call
from treg.catalog.enforce import check_request
from treg.catalog.model import Endpoint
from treg.context import Services
from treg.oauth import credentials as oauth
from treg.errors import TregError
from treg.identity import Identity


async def _request_body(svc: Services, inp: CallInput, endpoint: Endpoint) -> tuple[CallInput, bytes | None]:
    """The whole body when a check must read it (buffered once, bounded); else leave it streaming."""
    if inp.body is None:
        return inp, None
    if isinstance(inp.body, bytes):
        return inp, inp.body
    if not endpoint.needs_body:
        return inp, None
    from dataclasses import replace

    raw = await buffer_body(inp.body, svc.settings.json_body_max_bytes)
    return replace(inp, body=raw, content_length=len(raw)), raw


async def target_for(svc: Services, ident: Identity, inp: CallInput, endpoint: Endpoint,
                     surface: str) -> tuple[CallInput, ResolvedTarget]:
    if endpoint.route is not None:  # treg.<capability>: no ladder of its own (treg/call/routed.py runs it)
        if ident.is_demo:
            raise demo.routed(endpoint.id)
        return inp, ResolvedTarget(upstream_url="", query=(), tool=None, bindings=(), provider=endpoint.provider,
                                   endpoint_id=endpoint.id, routed=endpoint.route)
    registry = svc.catalog
    # a public demo's call sees none of the org's credentials: anonymous or platform only (demo.py)
    creds = demo.credentials(ident) if ident.is_demo else await load_org_credentials(svc, ident, [endpoint.provider])
    lookup.ensure_live(registry, endpoint, svc.settings, creds)
    inp, body = await _request_body(svc, inp, endpoint)
    checked = check_request(endpoint, method=inp.method, query=split_query(inp.raw_query), body=body, surface=surface)
    try:
        cat = plan_call(registry, endpoint, checked, creds, svc.settings, body=body)
    except NoCredential as exc:  # a provider that declares OAuth: the refusal carries a connect_url
        if ident.is_demo:
            raise demo.not_offered(endpoint.id) from None
        raise await oauth.no_credential(svc, ident, endpoint.provider, exc) from None
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
    if cat.scope_idempotency_key and inp.idempotency_key:
        # one shared provider account: the upstream sees a digest of (org, label), never the label
        extra.append(("Idempotency-Key", idempotency.shared_key_digest(ident.org_id, inp.idempotency_key,
                                                                         call_pin(inp))))
    return inp, ResolvedTarget(
        upstream_url=base, query=tuple(split_query(fixed_query)) + tuple(cat.query), tool=tool,
        bindings=cat.bindings, provider=cat.provider.id, credential_tier=cat.tier, endpoint_id=endpoint.id,
        extra_headers=tuple(extra), billed=cat.billed, catalog=cat, plan=plan)


async def resolve_catalog_surface(svc: Services, ident: Identity, inp: CallInput) -> tuple[CallInput, ResolvedTarget]:
    """``/catalog/call/<id>`` (and ``/table/<id>``): exact endpoint ids only; no org tool can shadow one."""
    endpoint = lookup.resolve_catalog_call(svc.catalog, inp.rest)
    return await target_for(svc, ident, inp, endpoint, "/table" if inp.surface == "table" else "/catalog/call")


async def named_miss(svc: Services, ident: Identity, inp: CallInput, name: str,
                     path: str | None) -> tuple[CallInput, ResolvedTarget] | None:
    """``/call/<name>`` found no org tool: an exact catalog id is that endpoint (a path behind it: 400).
    None: not a catalog id; the resolver answers its own 404 (see :func:`final_miss`)."""
    endpoint = lookup.resolve_named_miss(svc.catalog, inp.rest)
    if endpoint is None:
        return None
    try:
        return await target_for(svc, ident, inp, endpoint, "/call")
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


def tier_headers(target: ResolvedTarget | None, cost_micro: int = 0, *, cost: bool = True) -> dict[str, str]:
    """Every answer of a catalog call that reached the ladder carries its tier and cost (``cost`` False:
    not known yet, an async submission's hold is still open)."""
    if target is None or target.catalog is None:
        return {}
    if not cost:
        return {"X-Treg-Credential-Tier": str(target.credential_tier)}
    return {"X-Treg-Credential-Tier": str(target.credential_tier), "X-Treg-Cost-Micro": str(int(cost_micro))}


def settle_amount(target: ResolvedTarget, answer: Any) -> int:
    return int(target.catalog.settle_micro(answer))
