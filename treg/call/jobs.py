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
  naming none settles at 0 at once. A 2xx poll reading ``done`` settles the submission's hold,
  ``failed`` releases it, anything else renews its lease (``treg/jobs/store.py`` closes it once).

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
from treg.call.types import split_query
from treg.catalog.errors import InvalidParameters
from treg.catalog.placeholders import decode_query_value
from treg.context import Services
from treg.errors import Forbidden, TregError
from treg.jobs import store
from treg.jobs.spec import Submission, Utility, value_at

if TYPE_CHECKING:
    from treg.call.state import CallState

log = logging.getLogger(__name__)

SUBMIT, POLL, FETCH = "async_submit", "async_poll", "async_fetch"


class TaskNotOwned(Forbidden):
    """403: a platform-tier poll or fetch names no job of the caller's org (unknown and foreign ids
    alike: the answer must not tell them apart)."""

    code = "task_not_owned"


@dataclass(frozen=True)
class OwnedJob:
    """What :func:`guard` found: the job row and the utility reading it."""

    row: dict[str, Any]
    utility: Utility


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


async def guard(svc: Services, state: "CallState") -> None:
    cat = _platform(state)
    util = cat.endpoint.async_job if cat is not None else None
    if not isinstance(util, Utility):
        return
    value = _named_id(state, cat, util.task_param)
    row = None
    if len(value) <= store.ID_MAX:
        row = await store.find_owned(svc, org_id=state.ident.org_id, provider=cat.provider.id,  # type: ignore[union-attr]
                                     utility=cat.endpoint.id, kind=util.kind, value=value,
                                     by_result_id=util.by_result_id)
    if row is None:
        what = "result id" if util.by_result_id else "task id"
        raise TaskNotOwned(f"{cat.endpoint.id} on treg's key reads only jobs this org started; the {what} in "
                           f"{util.task_param!r} is not one of them", refused_by="ownership")
    state.job = OwnedJob(row, util)
    state.kind = POLL if util.kind == "poll" else FETCH
    if state.inp.idempotency_key is not None:
        state.inp = replace(state.inp, idempotency_key=None)


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


async def after_answer(svc: Services, state: "CallState", status: int, answer: Any) -> list[tuple[str, str]]:
    """See the module docstring; returns the headers to add to the answer (and to its stored replay)."""
    if not 200 <= status < 300:
        return []
    if state.job is not None:
        await _observe_poll(svc, state, answer)
        return []
    sub = _submission(state)
    if sub is None:
        return []
    task_id = _id_text(value_at(answer, sub.task_id_path))
    if task_id is None:
        await state.close_money(svc, settle_micro=0)  # not an accepted submission: nothing to wait for
        return []
    target, ident = state.target, state.ident
    assert target is not None and ident is not None
    try:
        recorded = await store.record(svc, org_id=ident.org_id, member_id=ident.member_id,
                                      provider=target.provider or "", endpoint_id=target.endpoint_id or "",
                                      task_id=task_id, call_id=state.inp.call_id, poll=sub.poll, fetch=sub.fetch)
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


async def _observe_poll(svc: Services, state: "CallState", answer: Any) -> None:
    owned: OwnedJob = state.job
    row = owned.row
    endpoint = svc.catalog.get(row["endpoint_id"])
    sub = endpoint.async_job if endpoint is not None else None
    if not isinstance(sub, Submission):
        # the submission left the catalog since: its terms are unknown, so the reaper decides (free)
        return
    status = value_at(answer, sub.status_path)
    if isinstance(status, str) and status in sub.done:
        if not _usage_known(endpoint.price, answer):  # type: ignore[union-attr]
            await store.touch(svc, row)  # done without its meter: a later poll (or the reaper) closes it
            return
        ids = _fetch_ids(value_at(answer, sub.result_id_path)) if sub.result_id_path else []
        await store.finish(svc, row, store.DONE, settle_micro=endpoint.price.observed_micro(answer),  # type: ignore[union-attr]
                           fetch_ids=ids)
    elif isinstance(status, str) and status in sub.failed:
        await store.finish(svc, row, store.FAILED)
    else:
        await store.touch(svc, row)
