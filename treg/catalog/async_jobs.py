"""The ``async`` descriptor of an endpoint row, and what it makes of the poll/fetch endpoints it names.

A submission row declares (docs/lifecycle.md "Async jobs")::

    "async": {"task_id": "data.task_id", "poll": "acme.tasks.get", "fetch": "acme.results.get",
              "task_param": "task_id", "status_path": "status", "done": ["completed"],
              "failed": ["failed", "cancelled"], "result_id_path": "result.file_id", "price_on": "done"}

Validation runs in two steps of the catalog loader (``treg/catalog/load.py``): :func:`parse_submission`
checks the descriptor's own shape with its row, :func:`link_utilities` the references once every row is
known (the poll and fetch endpoints exist, belong to the provider, are free and take ``task_param``) and
marks those endpoints as utilities (:class:`Utility`), so the call path knows a poll without a lookup.
Pure: no I/O. Every problem names the plugin, the row and the field, like the loader's own.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Callable, Literal, Mapping

from treg.catalog.model import Endpoint, Price, UsageTerm
from treg.catalog.success import from_json as success_from_json
from treg.jsonpath import dig

#: the loader's ``_Collector.add(plugin, row, field, message)``
Report = Callable[[str, str, str, str], None]

KEYS = frozenset({"task_id", "poll", "fetch", "task_param", "status_path", "done", "failed", "result_id_path",
                  "price_on"})
_PATH = re.compile(r"\A[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*\Z")
_PARAM = re.compile(r"\A[A-Za-z_][A-Za-z0-9_.-]{0,99}\Z")
PRICE_ON = ("done", "submit")


@dataclass(frozen=True)
class Submission:
    """A submission row's descriptor (``Endpoint.async_job``)."""

    task_id_path: str
    poll: str
    task_param: str
    status_path: str
    done: tuple[str, ...]
    failed: tuple[str, ...]
    fetch: str | None = None
    result_id_path: str | None = None
    #: "done": the hold stays open until a poll reads a terminal status; "submit": charged at once
    price_on: Literal["done", "submit"] = "done"

    def header(self, task_id: str) -> dict[str, Any]:
        """``X-Treg-Async``'s JSON: what a client needs to poll the job it just started."""
        return {"task_id": task_id, "poll": self.poll, "fetch": self.fetch}

    def to_json(self) -> dict[str, Any]:
        return {"task_id": self.task_id_path, "poll": self.poll, "fetch": self.fetch, "task_param": self.task_param,
                "status_path": self.status_path, "done": list(self.done), "failed": list(self.failed),
                "result_id_path": self.result_id_path, "price_on": self.price_on}


@dataclass(frozen=True)
class Utility:
    """A poll or fetch endpoint some submission names (``Endpoint.async_job`` of that endpoint): on the
    platform tier it only reads jobs (or learned fetch ids) of the caller's org."""

    kind: Literal["poll", "fetch"]
    task_param: str
    #: the submissions naming it (ids)
    submissions: tuple[str, ...]
    #: a fetch of learned result ids (some submission declares ``result_id_path``), not of task ids
    by_result_id: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"utility": self.kind, "task_param": self.task_param, "submissions": list(self.submissions)}


@dataclass(frozen=True)
class UtilityUse:
    """One way a poll or fetch endpoint reads jobs: what the guard needs to find the id a call names.
    The catalog's :class:`Utility` gives one; every job recorded gives the one of its submission, frozen
    (``async_job_utilities``), so an endpoint stays owner-only after a catalog that no longer says so.
    ``task_param`` None: a job recorded before it was frozen (the id cannot be read: refused)."""

    kind: Literal["poll", "fetch"]
    task_param: str | None
    by_result_id: bool = False

    @classmethod
    def of(cls, util: Utility) -> "UtilityUse":
        return cls(util.kind, util.task_param, util.by_result_id)


@dataclass(frozen=True)
class JobTerms:
    """What a job's polls settle by, frozen at submission on the job row (``async_jobs.terms``): a later
    catalog (a plugin update dropping or changing the ``async`` descriptor, or the price) changes
    neither who may read the job nor what it costs."""

    task_param: str
    status_path: str
    done: tuple[str, ...]
    failed: tuple[str, ...]
    result_id_path: str | None
    #: the price the done poll settles at: the submission's flat price (a table price's chosen row,
    #: as held), or its usage terms read from the done poll's answer
    price: Price
    #: the submission's declared success rule (treg.catalog.success.SuccessRule): a done poll whose answer
    #: fails it reads as failed; None: none (a job recorded before rules were frozen, too)
    success: Any = None

    @classmethod
    def at_submission(cls, sub: Submission, price: Price, table_value: str | None,
                      success: Any = None) -> "JobTerms":
        frozen = price if price.kind == "usage" else Price(kind="per_call",
                                                            per_call_micro=price.estimate_for(table_value))
        return cls(task_param=sub.task_param, status_path=sub.status_path, done=sub.done, failed=sub.failed,
                   result_id_path=sub.result_id_path, price=frozen, success=success)

    def to_json(self) -> dict[str, Any]:
        out = {"task_param": self.task_param, "status_path": self.status_path, "done": list(self.done),
               "failed": list(self.failed), "result_id_path": self.result_id_path, "price": self.price.to_json()}
        if self.success is not None:
            out["success"] = self.success.to_json()
        return out

    @classmethod
    def from_json(cls, raw: Any) -> "JobTerms | None":
        """The row's terms (None: a job recorded before terms were frozen, or a row treg cannot read)."""
        if not isinstance(raw, Mapping):
            return None
        try:
            return cls(task_param=str(raw["task_param"]), status_path=str(raw["status_path"]),
                       done=tuple(str(v) for v in raw["done"]), failed=tuple(str(v) for v in raw["failed"]),
                       result_id_path=raw.get("result_id_path"), price=_price_from_json(raw["price"]),
                       success=success_from_json(raw.get("success")))
        except (KeyError, TypeError, ValueError, InvalidOperation):
            return None

    def uses(self, kind: Literal["poll", "fetch"]) -> UtilityUse:
        return UtilityUse(kind, self.task_param, kind == "fetch" and self.result_id_path is not None)


def _price_from_json(raw: Mapping[str, Any]) -> Price:
    if "usage" in raw:
        return Price(kind="usage", estimate_micro=int(raw["estimate_micro"]),
                     usage=tuple(UsageTerm(str(t["path"]), Decimal(str(t["micro_per_unit"]))) for t in raw["usage"]))
    return Price(kind="per_call", per_call_micro=int(raw["per_call_micro"]))


def value_at(doc: Any, path: str | None) -> Any:
    """The value at a dotted path of a parsed JSON answer (a digit part indexes a list); None: absent."""
    return None if path is None else dig(doc, path)


def _strings(raw: Any) -> tuple[str, ...] | None:
    if not isinstance(raw, (list, tuple)) or not all(isinstance(v, str) and v for v in raw):
        return None
    if len(set(raw)) != len(raw):
        return None
    return tuple(raw)


def parse_submission(add: Report, plugin: str, row: str, raw: Any, *, spooled: bool) -> Submission | None:
    """The row's ``async`` descriptor, or None (absent, or invalid: then reported)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        add(plugin, row, "async", "must be a dict {task_id, poll, task_param, status_path, done, failed, …}")
        return None
    problems: list[str] = []

    def bad(field: str, message: str) -> None:
        problems.append(field)
        add(plugin, row, f"async.{field}" if field else "async", message)

    for key in sorted(set(raw) - KEYS):
        bad(key, f"unknown async field; known: {sorted(KEYS)}")
    for key in ("task_id", "status_path", "result_id_path"):
        value = raw.get(key)
        if value is None and key == "result_id_path":
            continue
        if not isinstance(value, str) or not _PATH.fullmatch(value):
            bad(key, f"{value!r} must be a dotted path into the JSON answer (such as 'data.task_id')")
    for key in ("poll", "fetch"):
        value = raw.get(key)
        if value is None and key == "fetch":
            continue
        if not isinstance(value, str) or not value:
            bad(key, "must be the id of an endpoint of the catalog")
    param = raw.get("task_param")
    if not isinstance(param, str) or not _PARAM.fullmatch(param):
        bad("task_param", f"{param!r} must name the poll/fetch parameter that carries the id")
    done, failed = _strings(raw.get("done")), _strings(raw.get("failed", []))
    if not done:
        bad("done", "must be a non-empty list of distinct status strings")
    if failed is None:
        bad("failed", "must be a list of distinct status strings")
    elif done and set(done) & set(failed):
        bad("failed", f"{sorted(set(done) & set(failed))} are listed as done too")
    price_on = raw.get("price_on", "done")
    if price_on not in PRICE_ON:
        bad("price_on", f"{price_on!r} must be one of {', '.join(PRICE_ON)}")
    if raw.get("result_id_path") is not None and raw.get("fetch") is None:
        bad("result_id_path", "names a fetch id, but the descriptor has no fetch endpoint")
    if spooled:
        bad("", "a spooled_response answer is not read whole, so its task id could not be recorded")
    if problems:
        return None
    return Submission(task_id_path=raw["task_id"], poll=raw["poll"], task_param=param, status_path=raw["status_path"],
                      done=done or (), failed=failed or (), fetch=raw.get("fetch"),
                      result_id_path=raw.get("result_id_path"), price_on=price_on)


def link_utilities(add: Report, endpoints: Mapping[str, Endpoint]) -> dict[str, Endpoint]:
    """Check every descriptor's references against the whole catalog; returns the poll/fetch endpoints
    marked as utilities (to replace in the loader's table). Problems are reported on the submission row."""
    roles: dict[str, dict[str, Any]] = {}
    for ep in endpoints.values():
        sub = ep.async_job
        if not isinstance(sub, Submission):
            continue
        row = f"endpoint {ep.id!r}"
        for kind, uid in (("poll", sub.poll), ("fetch", sub.fetch)):
            if uid is None:
                continue
            util = endpoints.get(uid)
            field = f"async.{kind}"
            if util is None:
                add(ep.plugin, row, field, f"{uid!r} is not an endpoint of the catalog")
                continue
            if util.provider != ep.provider:
                add(ep.plugin, row, field, f"{uid!r} belongs to provider {util.provider!r}; a job is read on the "
                    "account that runs it")
                continue
            if uid == ep.id or isinstance(util.async_job, Submission):
                add(ep.plugin, row, field, f"{uid!r} is itself a submission; a poll or fetch only reads a job")
                continue
            if not util.price.is_free:
                add(ep.plugin, row, field, f"{uid!r} has a price; an owned poll or download is free (price 0)")
                continue
            if util.param(sub.task_param) is None:
                add(ep.plugin, row, "async.task_param", f"{uid!r} declares no parameter {sub.task_param!r}")
                continue
            if util.spooled_response:
                add(ep.plugin, row, field, f"{uid!r} is spooled; a poll is read whole, a fetch streamed")
                continue
            role = roles.setdefault(uid, {"kind": kind, "param": sub.task_param, "subs": [], "by_result": False})
            if role["kind"] != kind:
                add(ep.plugin, row, field, f"{uid!r} is already another submission's {role['kind']} endpoint")
                continue
            if role["param"] != sub.task_param:
                add(ep.plugin, row, "async.task_param", f"{uid!r} already reads its id from {role['param']!r}")
                continue
            by_result = kind == "fetch" and sub.result_id_path is not None
            if role["subs"] and role["by_result"] != by_result:
                add(ep.plugin, row, "async.result_id_path", f"{uid!r} is fetched by task id for another "
                    "submission and by result id for this one; one fetch endpoint reads one kind of id")
                continue
            role["by_result"] = by_result
            role["subs"].append(ep.id)
    return {uid: dataclasses.replace(endpoints[uid], async_job=Utility(
                kind=r["kind"], task_param=r["param"], submissions=tuple(r["subs"]), by_result_id=r["by_result"]))
            for uid, r in roles.items() if r["subs"]}
