"""The archive's part of a call: a stored answer served without the vendor (:func:`lookup`, after the
reserve stage), and a fresh 2xx classified and stored on its way to the caller (:func:`observe` for a
metered answer, :func:`read_for_archive` for a streamed one). Contract: docs/lifecycle.md § Result
classifiers and the archive.

* Which calls take part: catalog calls of an endpoint whose row declares ``archive``, on the platform,
  team or own tier (never an own-tool relay, never the keyless anonymous tier), whose (org, endpoint)
  pair is in ``TREG_ARCHIVE_ROLLOUT_PCT``. The others take the normal relay and money path untouched.
* A hit is charged what the row's ``cache_price`` says, through the same hold and settlement as any
  billed call (the hold placed by the reserve stage as usual, settled here); on the team and own tiers
  treg bills nothing, hit or not.
* What is stored: a 2xx of at most ``TREG_ARCHIVE_MAX_BYTES`` received with identity encoding, that
  passes the endpoint's declared success rule (``treg/catalog/success.py``; a failing answer never is), that
  the endpoint's classifier (``treg/results.py``) called a ``hit`` (or a ``miss`` with
  ``admit_misses``); with no classifier, every such 2xx. ``unknown`` is never stored, nor a part (a
  ``206``, any answer to a ``Range`` request, which never reads an entry either).
* The key holds the credential the ladder picked, by tier and id (:func:`credential_of`): the lookup
  runs after every gate, so an entry is served only to a call that would use the credential that
  fetched it.
* Request header ``X-Treg-Cache``: ``refresh`` skips the lookup but stores the fresh answer, ``bypass``
  does neither. Like every ``X-Treg-*`` header it never reaches the vendor (``treg/call/headers.py``).
* Answer header ``X-Treg-Cache``: ``hit`` (with ``X-Treg-Cache-Age``), ``stored``, or ``miss``.

A failing archive read or write (the database) never fails the call: it is logged and the call goes
on as a miss. Nothing of the key, the query or the body is logged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, AsyncIterator

from treg.archive import store
from treg.catalog.archive_policy import ArchivePolicy, CredentialRef, archive_key, in_rollout, key_material
from treg.call import catalog_stage, headers as hdr, metered
from treg.call.record import answered
from treg.call.state import CallOutcome, CallState
from treg.catalog.success import SuccessRule, succeeded
from treg.context import Services
from treg.errors import BadRequest, TregError
from treg.infra.upstream import UpstreamResponse
from treg.query import split_query
from treg.results import Classifier

if TYPE_CHECKING:
    from treg.call.types import CallInput, ResolvedTarget

log = logging.getLogger(__name__)

#: the ``tool_called`` event's ``cache_admission``: what the archive decided about a fresh answer it
#: took part in (None: it did not, or the call was a hit): stored, or why not
ADMITTED = "admitted"
ADMISSIONS = (ADMITTED, "bypass", "partial", "not_2xx", "not_success", "too_large", "encoded", "spooled",
              "result_miss", "result_unknown", "store_failed")

CONTROL = "x-treg-cache"
CONTROLS = ("refresh", "bypass")
#: the tiers whose answers the archive serves and stores (anonymous: free keyless calls, nothing to save)
TIERS = ("platform", "team", "own")
HIT, STORED, MISS = "hit", "stored", "miss"


@dataclass(frozen=True)
class ArchivePlan:
    """What the archive does for this call, decided once before the relay."""

    policy: ArchivePolicy
    #: the entry's key (None: ``bypass``, nothing is looked up or stored)
    key: str | None
    #: the entry's org (None: ``scope: global``)
    org_id: str | None
    look: bool
    keep: bool


def classifier(svc: Services, state: "CallState") -> Classifier | None:
    target = state.target
    if target is None or target.catalog is None:
        return None
    return svc.result_classifiers.get(target.endpoint_id)


def classifier_paths(svc: Services, endpoint_id: str | None) -> tuple[str, ...]:
    """The paths a spooled answer must keep for the endpoint's classifier."""
    c = svc.result_classifiers.get(endpoint_id)
    return c.paths if c is not None else ()


def credential_of(target: "ResolvedTarget") -> CredentialRef:
    """The credential the ladder picked for this call, by tier and id (the archive key's part that keeps
    one credential's answers from a caller whose ladder picked another)."""
    cat = target.catalog
    assert cat is not None
    tier = str(target.credential_tier)
    # an OAuth connection is a credential like a secret: the ladder's own or shared one, or the one an own
    # tool's binding names
    connections = [b.connection_id for b in cat.bindings if b.connection_id is not None]
    if tier == "own":
        return CredentialRef.of("own", tool_id=cat.tool_id, connection_ids=connections,
                                secret_ids=[b.secret_id for b in cat.bindings if b.secret_id is not None])
    if tier == "team":
        return CredentialRef.of("team", connection_ids=connections,
                                secret_ids=[cat.secret_id] if cat.secret_id is not None else [])
    return CredentialRef.of(tier)


def partial_request(inp: "CallInput") -> bool:
    """A ``Range`` request: its answer may be a part, never stored, and a whole stored answer is not
    served in its place (the vendor decides what a range of its resource is)."""
    return inp.header("range") is not None


async def _plan(svc: Services, state: "CallState") -> ArchivePlan | None:
    """Runs after the ladder and every gate (authorize, ownership, capacity, the hold: the order of
    treg/call/service.py), so the key's credential is the one this caller may use."""
    target, ident = state.target, state.ident
    assert target is not None and ident is not None
    cat = target.catalog
    policy = cat.endpoint.archive if cat is not None else None
    if policy is None or target.credential_tier not in TIERS:
        return None
    if state.job is not None:
        # an owned async poll or fetch (a later catalog may archive its endpoint; startup refuses one that
        # still is a utility): it must read the vendor's live job, and settles it
        return None
    raw = state.inp.header(CONTROL)
    control = raw.strip().lower() if raw is not None else None
    if control is not None and control not in CONTROLS:
        raise BadRequest("X-Treg-Cache must be refresh (skip the archive's lookup, store the fresh answer) or "
                         "bypass (neither)", code="invalid_cache_control")
    endpoint_id = target.endpoint_id or ""
    if not in_rollout(ident.org_id, endpoint_id, svc.settings.archive_rollout_pct):
        return None  # not in the rollout: as if the row had no archive
    # scope global shares treg's own (platform-tier) answers; an org's own or team credential's stay its own
    org_id = None if policy.scope == "global" and target.credential_tier == "platform" else ident.org_id
    if control == "bypass" or partial_request(state.inp):
        return ArchivePlan(policy, None, org_id, look=False, keep=False)
    body = await state.read_body(svc.settings.json_body_max_bytes)  # the key hashes the body: read it whole
    inp = state.inp
    material = key_material(endpoint_id=endpoint_id, method=inp.method, query=split_query(inp.raw_query),
                            body=body or b"", org_id=org_id, credential=credential_of(target),
                            bindings=target.bindings)
    return ArchivePlan(policy, archive_key(material), org_id, look=control != "refresh", keep=True)


async def lookup(svc: Services, state: "CallState") -> "CallOutcome | None":
    """The stored answer of this call, served (None: the call goes on to the vendor)."""
    state.archive = plan = await _plan(svc, state)
    if plan is None or not plan.look or plan.key is None:
        return None
    try:
        entry = await store.lookup(svc, plan.key)
    except TregError as exc:
        log.warning("archive lookup failed for %s (%s); relayed instead", state.target.endpoint_id, exc.code)
        return None
    if entry is None:
        return None
    return await _hit_outcome(svc, state, plan, entry)


def _cache_price(policy: ArchivePolicy, state: "CallState", answer: object) -> int:
    if policy.cache_price == "free":
        return 0
    if policy.cache_price == "repeat":
        return policy.repeat_price_micro
    return catalog_stage.settle_amount(state.target, answer)  # full: what the call itself would settle at


async def _hit_outcome(svc: Services, state: "CallState", plan: ArchivePlan, entry: store.Entry) -> "CallOutcome":
    answer = await metered.answer_evidence(entry.body, ())
    c = classifier(svc, state)
    if c is not None:
        state.result_state, state.result_reason = c.explain(answer)
    stored = ([("Content-Type", entry.content_type)] if entry.content_type else []) + [hdr.NOSNIFF, hdr.SANDBOX]
    await state.store_for_replay(svc, entry.status, stored, entry.body)  # before settling, as settle does
    if state.hold is not None:
        await state.close_money(svc, settle_micro=_cache_price(plan.policy, state, answer))
    state.cache_state = HIT
    body = entry.body
    headers = [*stored, ("Content-Length", str(len(body))), *state.catalog_headers(state.cost_micro),
               ("X-Treg-Cache-Age", str(entry.age_s))]  # X-Treg-Cache: hit is among the catalog's
    return CallOutcome.whole_answer(entry.status, headers, body, answered(svc, state, entry.status))


def encodings_applied(resp: UpstreamResponse) -> bool:
    for k, v in resp.headers:
        if k.lower() == "content-encoding" and v.strip().lower() not in ("", "identity"):
            return True
    return False


def storable_status(status: int) -> bool:
    """A whole 2xx: a ``206`` is a part of the resource (replayed without its ``Content-Range`` it would
    read as the whole)."""
    return 200 <= status < 300 and status != 206


def _success_rule(state: "CallState") -> SuccessRule | None:
    return state.target.catalog.endpoint.success if state.target is not None else None


async def _keep(svc: Services, state: "CallState", plan: ArchivePlan, resp: UpstreamResponse, data: bytes,
                verdict: str | None, answer: object) -> None:
    c = classifier(svc, state)
    admitted = c is None or (verdict is not None and c.admits(verdict))
    # an answer that fails the endpoint's declared success rule (a 2xx with an error inside) is never stored
    failed = not succeeded(_success_rule(state), resp.status, answer)
    refusal = ("not_success" if failed else f"result_{verdict}" if not admitted
               else "too_large" if len(data) > svc.settings.archive_max_bytes
               else "encoded" if encodings_applied(resp) else "bypass" if plan.key is None
               else "partial" if not storable_status(resp.status) else None)
    if refusal is not None:
        state.cache_state, state.cache_admission = MISS, refusal
        return
    try:
        await store.store(svc, key=plan.key, endpoint=state.target.endpoint_id or "", org_id=plan.org_id,
                          status=resp.status, content_type=resp.header("content-type"), body=data,
                          ttl_s=plan.policy.ttl_s)
    except TregError as exc:
        log.warning("archive store failed for %s (%s); the answer was relayed", state.target.endpoint_id, exc.code)
        state.cache_state, state.cache_admission = MISS, "store_failed"
        return
    state.cache_state, state.cache_admission = STORED, ADMITTED


async def observe(svc: Services, state: "CallState", resp: UpstreamResponse, data: bytes | None,
                  answer: object) -> None:
    """A metered answer read whole (settle stage): its ``result_state``, then the archive's store.
    ``data``: the bytes as relayed (None: spooled, never stored); ``answer``: its decoded JSON evidence."""
    ok = 200 <= resp.status < 300
    c = classifier(svc, state)
    verdict = None
    if ok and c is not None:
        verdict, state.result_reason = c.explain(answer)
        state.result_state = verdict
    plan = state.archive
    if plan is None:
        return
    skipped = _skipped(state, plan, resp) or ("spooled" if data is None else None)
    if skipped is not None or data is None:
        state.cache_state, state.cache_admission = MISS, skipped
        return
    await _keep(svc, state, plan, resp, data, verdict, answer)


def _skipped(state: "CallState", plan: ArchivePlan, resp: UpstreamResponse) -> str | None:
    """Why the archive keeps nothing of this answer, known before its body is read (None: it may)."""
    if not plan.keep:
        return "partial" if partial_request(state.inp) else "bypass"
    if not 200 <= resp.status < 300:
        return "not_2xx"
    return None if storable_status(resp.status) else "partial"


async def read_for_archive(svc: Services, state: "CallState", resp: UpstreamResponse) -> AsyncIterator[bytes]:
    """A streamed answer's body (settle stage). Untouched unless the archive may store it: then a 2xx
    with identity encoding is read up to ``TREG_ARCHIVE_MAX_BYTES``; whole within it, it is classified
    and stored before its headers go out; larger, every byte read is replayed before the rest streams."""
    plan = state.archive
    if plan is None:
        return resp.body
    limit = svc.settings.archive_max_bytes
    declared = resp.header("content-length")
    too_long = declared is not None and declared.strip().isdigit() and int(declared) > limit
    skipped = _skipped(state, plan, resp) or ("encoded" if encodings_applied(resp) else "too_large" if too_long
                                              else None)
    if skipped is not None:
        state.cache_state, state.cache_admission = MISS, skipped
        return resp.body
    if resp.whole is not None:
        data: bytes | None = resp.whole
        head: list[bytes] = [resp.whole]
        rest = None
    else:
        head, size, rest = [], 0, resp.body
        async for chunk in rest:
            head.append(chunk)
            size += len(chunk)
            if size > limit:
                break
        else:
            rest = None
        data = b"".join(head) if rest is None else None
    if data is None:
        state.cache_state, state.cache_admission = MISS, "too_large"
    else:
        c = classifier(svc, state)
        verdict = None
        answer = await metered.answer_evidence(data, ()) if c is not None or _success_rule(state) else None
        if c is not None:
            verdict, state.result_reason = c.explain(answer)
            state.result_state = verdict
        await _keep(svc, state, plan, resp, data, verdict, answer)

    async def replay() -> AsyncIterator[bytes]:
        for chunk in head:
            yield chunk
        if rest is not None:
            async for chunk in rest:
                yield chunk

    return replay()
