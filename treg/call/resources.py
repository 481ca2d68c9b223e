"""Owned resources (docs/lifecycle.md "Owned resources"): on the platform tier, one vendor account is
shared by every org, so an object one org created there (a webhook, a campaign) must never be updated,
used or deleted by another. An endpoint row declares its part with ``managed_resource`` (the
descriptor, ``treg/catalog/managed.py``); ownership rows live in ``treg/owned_resources.py``.

The pipeline calls this module at three points (one line each):

* :func:`check_owned` (service.py, after authorize, before reserve): an update/use needs an active
  object of the caller's org, a delete an active or deleted one; anything else is refused
  (``resource_not_owned``) with no vendor I/O, no hold and no idempotency claim;
* :func:`read_whole` (settle.py): a managed platform answer is read whole (the 8 MiB limit of every
  metered answer) even when the call is free, so the steps below run before any byte leaves;
* :func:`observe_answer` (settle.py, once the answer is in hand, before it is stored for replay or its
  hold settled): a create's 2xx records ownership, and if that fails the new object is deleted at the
  vendor (best effort, with the platform key) and the caller gets 502 ``resource_record_failed``
  without the id (the hold released: nothing charged); an update's 2xx moves ``updated_at``; a
  delete's 2xx, or the vendor's 404 on an owned delete, tombstones the row.

**Pins** (the seed's "pinned tag predicates"): a call's pin is its ``X-Treg-Tag``. A create records
the pin with the object (the snapshot); a pinned call matches only objects of its org carrying the
same pin, and is refused 404 ``resource_not_found`` otherwise, so a tag cannot probe another tag's
(or another org's) ids. An unpinned call acts org-wide. The pin also enters the platform-tier
Idempotency-Key digest the vendor sees and treg's own replay namespace (:func:`call_pin`), so two
customers of one org never share an upstream job or a stored answer through one label.

On ``own`` and ``team`` tiers nothing here applies: those ids live on the caller's own account.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

from treg import owned_resources as store
from treg.call.injection import provider_plan
from treg.call.relay import prepare
from treg.call.types import CallInput, ResolvedTarget
from treg.catalog.managed import ManagedResource, delete_endpoint
from treg.catalog.model import Endpoint, join_url
from treg.catalog.placeholders import decode_query_value, encode_segment, fill_path
from treg.jsonpath import dig
from treg.context import Services
from treg.errors import Forbidden, GatewayFailed, NotFound, TregError
from treg.infra import upstream
from treg.query import split_query

if TYPE_CHECKING:
    from treg.call.state import CallState

log = logging.getLogger(__name__)

#: a pin: (name, value) pairs, every one of which an object's snapshot must match
Pin = tuple[tuple[str, str], ...]


def call_pin(inp: CallInput) -> Pin:
    """The call's complete pin: its tag (empty: an unpinned call)."""
    return (("tag", inp.tag),) if inp.tag else ()


def managed(state: "CallState") -> ManagedResource | None:
    """The descriptor this call is subject to: a managed endpoint reached on the platform tier."""
    t = state.target
    if t is None or t.catalog is None or t.credential_tier != "platform":
        return None
    return t.catalog.endpoint.managed_resource


def read_whole(state: "CallState") -> bool:
    return managed(state) is not None


class ResourceNotOwned(Forbidden):
    """403: not an active (or, for a delete, deleted) object of the caller's org; no vendor I/O."""

    code = "resource_not_owned"


class ResourceNotFound(NotFound):
    """404: a pinned call named an id that is not an object of its org and pin; no vendor I/O."""

    code = "resource_not_found"


class RecordFailed(GatewayFailed):
    """502: the vendor created the object but treg could not record whose it is; the id is withheld."""

    code, blame = "resource_record_failed", "treg"


# -- before the relay --------------------------------------------------------------------------------

def _requested_id(state: "CallState", m: ManagedResource) -> str | None:
    """The object id the vendor will read from this request (None: absent, repeated or unreadable).

    A path slot is decoded once from the query, then sent encoded by the seed's rule, which keeps a valid
    ``%HH``: the vendor decodes the segment once more, so that is the id compared. A query value is read
    by the vendor decoded once; a body field is the JSON value."""
    assert state.target is not None and m.id_param is not None
    endpoint: Endpoint = state.target.catalog.endpoint
    param = endpoint.param(m.id_param)
    assert param is not None  # checked at load
    if param.location == "body":
        body = state.target.catalog.json_body
        value = body.get(m.id_param) if body is not None else None
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            return None
        return str(value)
    found = [v for k, v in split_query(state.inp.raw_query) if unquote(k) == m.id_param]
    if len(found) != 1:
        return None
    try:
        value = decode_query_value(found[0]).decode("utf-8")
        if param.location == "path":
            value = unquote(encode_segment(value), errors="strict")
    except UnicodeDecodeError:
        return None
    return value or None


def _refusal(state: "CallState", m: ManagedResource, resource_id: str | None, pinned: bool,
             own_deleted: bool = False) -> TregError:
    provider = state.target.provider if state.target else "?"
    shown = repr(resource_id[:200]) if resource_id is not None else f"(no single {m.id_param!r})"
    if pinned:
        return ResourceNotFound(f"{m.kind} {shown} is not an object of this org and tag on treg's {provider} "
                                "account (GET /api/v1/resources lists yours)", refused_by="ownership")
    if own_deleted:
        return ResourceNotOwned(f"{m.kind} {shown} was deleted; only a delete may name it again",
                                refused_by="ownership")
    return ResourceNotOwned(f"{m.kind} {shown} is not an object of this org on treg's {provider} account; on "
                            "the platform key only objects your org created may be updated, used or deleted "
                            "(GET /api/v1/resources lists them)", refused_by="ownership")


async def check_owned(svc: Services, state: "CallState") -> None:
    """The ownership check of an update, use or delete (a create has none); refuses before any hold."""
    m = managed(state)
    if m is None or m.role == "create":
        return
    assert state.ident is not None and state.target is not None
    pin = call_pin(state.inp)
    resource_id = _requested_id(state, m)
    if resource_id is None or len(resource_id) > store.MAX_ID:
        raise _refusal(state, m, None if resource_id is None else resource_id[:80], bool(pin))
    row = await store.owner(svc, state.target.provider or "", m.kind, resource_id)
    # every pin must match the creating call's snapshot (an unpinned call: the org alone)
    mine = row is not None and row.org_id == state.ident.org_id and all(getattr(row, k) == v for k, v in pin)
    if not mine:
        raise _refusal(state, m, resource_id, bool(pin))  # unknown and another owner's: one answer
    assert row is not None
    if row.state != store.ACTIVE and m.role != "delete":
        raise _refusal(state, m, resource_id, bool(pin), own_deleted=True)


# -- once the answer is in hand ----------------------------------------------------------------------

def _answer_id(answer: Any, id_path: str) -> str | None:
    obj = dig(answer, id_path)
    if isinstance(obj, bool) or not isinstance(obj, (str, int)):
        return None
    text = str(obj)
    return text if 0 < len(text) <= store.MAX_ID else None


async def observe_answer(svc: Services, state: "CallState", status: int, answer: Any) -> None:
    """Local state follows the vendor's answer (see the module doc); raises :class:`RecordFailed` when a
    created object could not be recorded."""
    m = managed(state)
    if m is None:
        return
    assert state.ident is not None and state.target is not None
    provider = state.target.provider or ""
    ok = 200 <= status < 300
    if m.role == "create":
        if ok:
            await _record_create(svc, state, m, provider, answer)
        return
    if m.role not in ("update", "delete") or not (ok or (m.role == "delete" and status == 404)):
        return
    resource_id = _requested_id(state, m)
    if resource_id is None:
        return
    try:
        if m.role == "update":
            await store.touch(svc, state.ident.org_id, provider, m.kind, resource_id)
        else:
            await store.mark_deleted(svc, state.ident.org_id, provider, m.kind, resource_id)
    except TregError as exc:
        # the vendor's answer is the truth the caller gets; a retried delete finds the vendor's 404 and
        # tombstones then, and a missed updated_at is display state only
        log.warning("call %s: the %s of %s %s %s was not recorded locally (%s)", state.inp.call_id, m.role,
                    provider, m.kind, resource_id, exc.code)


async def _record_create(svc: Services, state: "CallState", m: ManagedResource, provider: str,
                         answer: Any) -> None:
    assert state.ident is not None and m.id_path is not None
    call_id = state.inp.call_id
    resource_id = _answer_id(answer, m.id_path)
    if resource_id is None:
        log.error("call %s: %s answered its %s create 2xx without an id at %r: nothing recorded, nothing to "
                  "clean up", call_id, provider, m.kind, m.id_path)
        raise RecordFailed(f"{provider} created a {m.kind} but its answer names no id at {m.id_path!r}; treg "
                           "cannot record whose it is, so the answer is withheld and nothing was charged")
    try:
        await store.record_created(svc, org_id=state.ident.org_id, provider=provider, kind=m.kind,
                                   resource_id=resource_id, tag=state.inp.tag, call_id=call_id)
        return
    except store.OwnedElsewhere:
        # the id is another owner's live object (a vendor reusing or deduplicating ids): deleting it would
        # destroy theirs, so it stays; the operator sees this line
        log.error("call %s: %s named %s %s for org %s, but that id is another owner's live object: not "
                  "recorded, not deleted", call_id, provider, m.kind, resource_id, state.ident.org_id)
        cleanup = "left_in_place"
    except (TregError, OSError) as exc:
        log.error("call %s: ownership of %s %s %s (org %s) could not be recorded (%s); deleting it at the vendor",
                  call_id, provider, m.kind, resource_id, state.ident.org_id,
                  getattr(exc, "code", type(exc).__name__))
        status = await asyncio.shield(_vendor_delete(svc, state, m, provider, resource_id))
        cleanup = "deleted" if status is not None and (200 <= status < 300 or status == 404) else "delete_failed"
        log.log(logging.WARNING if cleanup == "deleted" else logging.ERROR,
                "call %s: cleanup of %s %s %s: %s (vendor status %s)", call_id, provider, m.kind, resource_id,
                cleanup, status)
    raise RecordFailed(f"{provider} created a {m.kind}, but treg could not record that it is your org's, so "
                       f"the answer is withheld and nothing was charged (cleanup: {cleanup}); retry the create",
                       cleanup=cleanup)


async def _vendor_delete(svc: Services, state: "CallState", m: ManagedResource, provider_id: str,
                         resource_id: str) -> int | None:
    """Best effort: the kind's delete endpoint called with the platform key; its status, None if it could
    not be sent. Not billed, not audited as a call of the org (the log line is the record)."""
    try:
        registry = svc.catalog
        ep = delete_endpoint(registry.endpoints_of(provider_id), provider_id, m.kind)
        if ep is None or state.target is None:
            return None
        provider = registry.provider_of(ep)
        dm: ManagedResource = ep.managed_resource
        param = ep.param(dm.id_param)
        path_values = {s: encode_segment(resource_id) for s in ep.slots if s == dm.id_param}
        url = join_url(registry.root_url(ep), fill_path(ep.path, path_values))
        base, _, fixed = url.partition("?")
        query = tuple(split_query(fixed))
        body: bytes | None = None
        headers: tuple[tuple[str, str], ...] = ()
        if param is not None and param.location == "query":
            query += ((quote(dm.id_param, safe=""), quote(resource_id, safe="")),)
        elif param is not None and param.location == "body":
            body = json.dumps({dm.id_param: resource_id}).encode()
            headers = (("Content-Type", "application/json"),)
        bindings = tuple(dataclasses.replace(b, platform_setting=provider.platform_setting) for b in provider.auth)
        target = ResolvedTarget(upstream_url=base, query=query, tool=None, bindings=bindings, provider=provider.id,
                                credential_tier="platform", endpoint_id=ep.id,
                                extra_headers=tuple(provider.required_headers), billed=False,
                                catalog=state.target.catalog, plan=provider_plan(svc, provider))
        inp = CallInput(call_id=f"{state.inp.call_id}:cleanup", surface="catalog", method=ep.method, rest=ep.id,
                        raw_query="", headers=headers, token=None, org_hint=None, body=body,
                        content_length=len(body) if body is not None else None)
        prepared = await prepare(svc, state.ident.org_id if state.ident else "", inp, target)
        url_parsed = upstream.parse_url(prepared.request.url)
        await svc.resolver.vet(url_parsed.raw_host or "")
        resp = await upstream.send(svc.client, prepared.request, url=url_parsed)
        resp.close()
        return resp.status
    except Exception as exc:  # best effort: a failure is logged by the caller, never raised over the 502
        log.error("call %s: the cleanup delete of %s %s could not be sent: %r", state.inp.call_id, provider_id,
                  m.kind, type(exc).__name__)
        return None
