"""Async jobs on the call path (platform tier only; docs/lifecycle.md "Async jobs").

Three moments of a call, each one line in its stage:

* :func:`guard` (after authorize, before reserve): a poll or fetch utility on treg's own key must name
  a job of the caller's org and provider (or a fetch id learned from one); anything else is the same
  403 ``task_not_owned``, and the vendor hears nothing. An owned poll or fetch is free and its
  ``Idempotency-Key`` label is let go: it is never claimed, so never replayed (the next poll must
  read the vendor's status again).
* :func:`read_whole` (settle): a submission and an owned poll are read whole like a metered answer
  (a fetch still streams, never buffered);
* :func:`after_answer` (settle, once the answer is in hand and before it is stored for replay): a 2xx
  submission naming a task id records the job and leaves its hold open (``X-Treg-Async`` added); one
  naming none, or failing the endpoint's declared success rule (a 2xx with an error inside), releases its
  hold at once. A 2xx poll reading ``done`` settles the submission's hold (unless the answer fails the
  submission's success rule, frozen with the job: then it reads as ``failed``), ``failed`` releases
  it, anything else renews its lease (``treg/jobs/store.py`` closes it once).

On the own and team tiers none of this applies: those ids are the caller's own account's.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_plus

from treg import money
from treg.catalog.errors import InvalidParameters
from treg.catalog.placeholders import decode_query_value
from treg.context import Services
from treg.errors import Forbidden, NotFound, TregError
from treg.jobs import store
from treg.query import split_query
from treg.catalog.async_jobs import JobTerms, Submission, Utility, UtilityUse, value_at

if TYPE_CHECKING:
    from treg.call.state import CallState

log = logging.getLogger(__name__)

SUBMIT, POLL, FETCH = "async_submit", "async_poll", "async_fetch"


class TaskNotOwned(Forbidden):
    """403: a platform-tier poll or fetch names no job of the caller's org (unknown and foreign ids
    alike: the answer must not tell them apart)."""

    code = "task_not_owned"


class TaskNotFound(NotFound):
    """404: a pinned poll or fetch (one with an ``X-Treg-Tag``) names no job of its org submitted with
    that pin (the seed's pinned predicates: one answer for unknown, foreign and another pin's ids)."""

    code = "task_not_found"


@dataclass(frozen=True)
class OwnedJob:
    """What :func:`guard` found: the job row and how the call reads it."""

    row: dict[str, Any]
    utility: UtilityUse


def _platform(state: "CallState") -> Any:
    target = state.target
    if target is None or target.catalog is None or target.credential_tier != "platform":
        return None
    return target.catalog


def _submission(state: "CallState") -> Submission | None:
    cat = _platform(state)
    job = cat.endpoint.async_job if cat is not None else None
    return job if isinstance(job, Submission) else None


def _named_id(state: "CallState", cat: Any, param: str) -> str:
    """The one id the request names in ``param`` (path slots and query parameters arrive in the query,
    read as the catalog reads them; a body parameter from the strictly parsed body)."""
    endpoint = cat.endpoint
    p = endpoint.param(param)
    if p is not None and p.location == "body":
        value = (cat.json_body or {}).get(param)
        if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
            raise InvalidParameters(f"{endpoint.id} reads a job: body field {param!r} must name its id",
                                    parameter=param)
        return str(value)
    given = [v for k, v in split_query(state.inp.raw_query) if unquote_plus(k) == param]
    if len(given) != 1 or not given[0]:
        # none would let the vendor answer for the whole account; two, one the vendor might prefer
        raise InvalidParameters(f"{endpoint.id} reads a job: pass its id once, as {param}=<id>", parameter=param)
    return decode_query_value(given[0]).decode("utf-8", errors="replace")


def _given(state: "CallState", cat: Any, param: str) -> bool:
    """Whether the request carries ``param`` at all (its value is checked by :func:`_named_id`)."""
    p = cat.endpoint.param(param)
    if p is not None and p.location == "body":
        return param in (cat.json_body or {})
    return any(unquote_plus(k) == param for k, _ in split_query(state.inp.raw_query))


async def utility_uses(svc: Services, cat: Any) -> tuple[UtilityUse, ...]:
    """How a platform-tier call of this endpoint reads jobs: as the current catalog's poll or fetch,
    and as every recorded job's frozen one (``async_job_utilities``), whatever the current catalog says
    (a plugin update that dropped the descriptor does not make a pending job's poll a free row). ()
    for an endpoint no catalog and no job made a utility."""
    util = cat.endpoint.async_job
    current = (UtilityUse.of(util),) if isinstance(util, Utility) else ()
    frozen = (await store.utility_uses(svc)).get(cat.endpoint.id, ())
    return tuple(dict.fromkeys(current + frozen))


async def guard(svc: Services, state: "CallState") -> None:
    cat = _platform(state)
    if cat is None:
        return
    uses = await utility_uses(svc, cat)
    if not uses:
        return
    # every way the call names an id must name one of the org's jobs (two parameters: the vendor may read
    # either); none named: the first readable use says which parameter is missing (400)
    readable = [u for u in uses if u.task_param is not None]
    named = [u for u in readable if _given(state, cat, u.task_param)] or readable[:1]
    if not named:  # only jobs recorded before their parameter was frozen: nothing to read the id from
        raise TaskNotOwned(f"{cat.endpoint.id} on treg's key reads only jobs this org started, and none can be "
                           "named here", refused_by="ownership")
    owned = [await _owned_row(svc, state, cat, use) for use in named]
    state.job = OwnedJob(owned[0], named[0])
    state.kind = POLL if named[0].kind == "poll" else FETCH
    if state.inp.idempotency_key is not None:
        state.inp = replace(state.inp, idempotency_key=None)


async def _owned_row(svc: Services, state: "CallState", cat: Any, use: UtilityUse) -> dict[str, Any]:
    """The org's job the call names through ``use`` (refused otherwise, before any vendor I/O)."""
    assert use.task_param is not None and state.ident is not None
    value = _named_id(state, cat, use.task_param)
    row = None
    if len(value) <= store.ID_MAX:
        row = await store.find_owned(svc, org_id=state.ident.org_id, provider=cat.provider.id,
                                     utility=cat.endpoint.id, kind=use.kind, value=value,
                                     by_result_id=use.by_result_id)
    what = "result id" if use.by_result_id else "task id"
    pin = state.inp.tag
    if pin and (row is None or row["tag"] != pin):
        # every pin must match the submission's snapshot (treg/call/resources.py pins objects the same way)
        raise TaskNotFound(f"{cat.endpoint.id} on treg's key: the {what} in {use.task_param!r} is not a job this "
                           "org started with this X-Treg-Tag", refused_by="ownership")
    if row is None:
        raise TaskNotOwned(f"{cat.endpoint.id} on treg's key reads only jobs this org started; the {what} in "
                           f"{use.task_param!r} is not one of them", refused_by="ownership")
    return row


def read_whole(state: "CallState") -> bool:
    """The answer is read whole even with no hold: an owned poll, a (free) submission."""
    if state.job is not None:
        return state.job.utility.kind == "poll"
    return _submission(state) is not None


def deferred(state: "CallState") -> bool:
    """The call's hold was left open for its job: the answer carries no ``X-Treg-Cost-Micro``."""
    return state.kind == SUBMIT and state.hold is not None and state.hold_state == money.HELD


def _id_text(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    text = str(value)
    if not text or len(text) > store.ID_MAX or any(ord(c) < 0x20 or c == "\x7f" for c in text):
        return None
    return text


async def after_answer(svc: Services, state: "CallState", status: int, answer: Any, *,
                       success: bool) -> list[tuple[str, str]]:
    """See the module docstring; returns the headers to add to the answer (and to its stored replay).
    ``success``: the answer passed its endpoint's declared success rule (treg/catalog/success.py)."""
    if not 200 <= status < 300:
        return []
    if state.job is not None:
        await _observe_poll(svc, state, status, answer)
        return []
    sub = _submission(state)
    if sub is None:
        return []
    if not success:
        await state.close_money(svc)  # a 2xx with an error inside is no accepted submission: no job, no charge
        return []
    task_id = _id_text(value_at(answer, sub.task_id_path))
    if task_id is None:
        await state.close_money(svc, settle_micro=0)  # not an accepted submission: nothing to wait for
        return []
    target, ident = state.target, state.ident
    assert target is not None and ident is not None
    try:
        cat = target.catalog
        assert cat is not None
        terms = JobTerms.at_submission(sub, cat.endpoint.price, cat.table_value, cat.endpoint.success)
        recorded = await store.record(svc, org_id=ident.org_id, member_id=ident.member_id,
                                      provider=target.provider or "", endpoint_id=target.endpoint_id or "",
                                      task_id=task_id, call_id=state.inp.call_id, poll=sub.poll, fetch=sub.fetch,
                                      terms=terms, tag=state.inp.tag)
    except TregError:
        # the vendor runs a job treg cannot bill or authorize: charge nothing, hand out no pollable id
        log.error("async job of call %s (%s) could not be recorded; its hold is released",
                  state.inp.call_id, target.endpoint_id, exc_info=True)
        await state.close_money(svc)
        return []
    if recorded is store.Recorded.FOREIGN:
        log.error("call %s: %s answered with a task id another org owns; not handed over",
                  state.inp.call_id, target.endpoint_id)
        await state.close_money(svc)
        return []
    state.kind = SUBMIT
    if recorded is store.Recorded.SAME_ORG:
        await state.close_money(svc)  # the org's earlier submission of this job keeps the one hold
    elif sub.price_on == "done" and state.hold is not None:
        state.hold_state = money.HELD  # the job owns the hold now: close_money leaves it to the polls
    return [("X-Treg-Async", json.dumps(sub.header(task_id), separators=(",", ":")))]


def _usage_known(price: Any, answer: Any) -> bool:
    if price.kind != "usage":
        return True
    for term in price.usage:
        units = value_at(answer, term.path)
        if isinstance(units, bool) or not isinstance(units, (int, float)) or units < 0 \
                or (isinstance(units, float) and not math.isfinite(units)):
            return False
    return True


def _fetch_ids(value: Any) -> list[str]:
    values = value if isinstance(value, list) else [value]
    return [t for t in (_id_text(v) for v in values) if t is not None]


def job_terms(svc: Services, row: dict[str, Any]) -> JobTerms | None:
    """What the job's polls read and settle by: frozen on its row at submission; a job recorded before
    terms were frozen reads the current catalog's submission (None: it left the catalog)."""
    frozen = JobTerms.from_json(row.get("terms"))
    if frozen is not None:
        return frozen
    endpoint = svc.catalog.get(row["endpoint_id"])
    sub = endpoint.async_job if endpoint is not None else None
    if not isinstance(sub, Submission):
        return None
    return JobTerms.at_submission(sub, endpoint.price, None, endpoint.success)  # type: ignore[union-attr]


async def _observe_poll(svc: Services, state: "CallState", status: int, answer: Any) -> None:
    """The job's state and money from an owned 2xx poll. A database fault here never costs the caller
    the vendor's answer: it is logged and relayed, and the hold stays open for the next poll or the
    reaper to close, once (the close and the job's mark are one transaction: both or neither)."""
    owned: OwnedJob = state.job
    row = owned.row
    terms = job_terms(svc, row)
    if terms is None:
        return  # the submission's terms are unknown: the reaper decides (free)
    try:
        await _settle_from_poll(svc, row, terms, status, answer)
    except TregError as exc:
        log.warning("call %s: the job of call %s could not be settled from this poll (%s); the vendor's answer "
                    "is relayed and the next poll or the reaper closes its hold", state.inp.call_id,
                    row["call_id"], exc.code)


async def _settle_from_poll(svc: Services, row: dict[str, Any], terms: JobTerms, http_status: int,
                            answer: Any) -> None:
    status = value_at(answer, terms.status_path)
    if isinstance(status, str) and status in terms.done and terms.success is not None \
            and not terms.success.holds(http_status, answer):
        # done, yet the submission's success rule fails on the result (an error inside a done job): failed,
        # released. Only a done status can be read so: a poll the caller could make fail (a bad parameter's
        # 200 with an error) must never free a job the vendor runs
        await store.finish(svc, row, store.FAILED)
    elif isinstance(status, str) and status in terms.done:
        if not _usage_known(terms.price, answer):
            await store.touch(svc, row)  # done without its meter: a later poll (or the reaper) closes it
            return
        ids = _fetch_ids(value_at(answer, terms.result_id_path)) if terms.result_id_path else []
        await store.finish(svc, row, store.DONE, settle_micro=terms.price.observed_micro(answer), fetch_ids=ids)
    elif isinstance(status, str) and status in terms.failed:
        await store.finish(svc, row, store.FAILED)
    else:
        await store.touch(svc, row)
