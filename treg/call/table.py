"""``/table/<endpoint-id>``: the catalog call, answered as a table (docs/sharing.md).

The call runs exactly the pipeline of ``/catalog/call/<endpoint-id>`` (tiers, money, archive, audit with
``surface: table``); this module holds its four small parts, each one line in its stage:

* intake (:func:`intake`): the surface's own controls come off the request before it goes on —
  ``?format=csv|json`` (never sent upstream; any other ``format`` value is the vendor's), the caller's
  ``Accept`` (it chooses treg's answer; the vendor is asked for ``application/json``, and for
  ``identity``: treg reads the answer itself); a token in the query (``treg_token``, as spreadsheet
  add-ons write it) is refused, 400 ``token_in_query``, before it could reach a vendor or a log;
* resolve (:func:`check_endpoint`): an endpoint without a ``table`` descriptor is 400
  ``table_not_available``, before any hold or vendor contact;
* settle (:func:`read_whole`, :func:`settles`): the answer is read whole on every tier, and a 2xx holding
  no rows where the descriptor says releases its hold (the caller is not charged for an answer treg cannot
  make a table of);
* the finish (:func:`finish`): the whole answer made into the table (treg/catalog/table.py), JSON or CSV;
  a non-2xx answer becomes 502 ``table_upstream_error`` with ``upstream_status`` (its hold released by
  settle, ``X-Treg-Cost-Micro: 0``), audited as the vendor's answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote_plus

from treg.call import encodings, metered
from treg.call.bodies import read_bounded
from treg.call.record import audit, finish_once
from treg.call.state import CallOutcome, CallState
from treg.call.types import CallInput
from treg.catalog import table as tables
from treg.context import Services
from treg.errors import BadRequest, GatewayFailed

SURFACE = "table"
#: ``?format=`` values that are the table's own (any other is the vendor's parameter)
FORMATS = ("csv", "json")
#: query keys that would carry a treg token (spelled as add-ons and URL builders write them)
_TOKEN_KEYS = ("treg_token", "x-treg-token")
CSV_TYPE = "text/csv; charset=utf-8; header=present"
JSON_TYPE = "application/json"
#: headers the vendor's answer keeps on a table answer: treg's own (tier, cost, cache, replay, capacity)
_KEPT_PREFIX = "x-treg-"
#: the relayed answer's guards (docs/clients.md), on the table too
_GUARDS = (("X-Content-Type-Options", "nosniff"), ("Content-Security-Policy", "sandbox"))


@dataclass(frozen=True)
class TableCall:
    """What the caller asked of the table (``CallState.table``), and the table once settle made it."""

    csv: bool
    made: tables.Table | None = None


def intake(state: CallState) -> None:
    """A ``/table/`` call's own controls read off its input (``state.table`` set); any other call: nothing."""
    inp = state.inp
    if inp.surface != SURFACE:
        return
    kept, fmt = [], None
    for seg in inp.raw_query.split("&") if inp.raw_query else ():
        key, eq, value = seg.partition("=")
        name = unquote_plus(key).strip().lower()
        if name in _TOKEN_KEYS:
            raise BadRequest("treg does not take a token in the URL (it would reach logs, browser history and, "
                             "relayed, the vendor): send it in the X-Treg-Token header; a spreadsheet can use a "
                             "read-only table token (POST /api/v1/tokens {\"scope\": \"table\"})",
                             code="token_in_query")
        if name == "format" and eq and unquote_plus(value).strip().lower() in FORMATS:
            fmt = unquote_plus(value).strip().lower()  # the last one counts
            continue
        kept.append(seg)
    csv = tables.wants_csv(fmt, inp.header("accept"))
    headers = tuple((k, v) for k, v in inp.headers if k.lower() not in ("accept", "accept-encoding"))
    state.inp = replace(inp, raw_query="&".join(kept),
                        headers=(*headers, ("Accept", JSON_TYPE), ("Accept-Encoding", "identity")))
    state.table = TableCall(csv=csv)


def check_endpoint(svc: Services, inp: CallInput) -> None:
    """``/table/`` of an endpoint that declares no rows: refused before any hold or vendor contact (an id
    the catalog does not know is left to its own 404)."""
    if inp.surface != SURFACE:
        return
    endpoint = svc.catalog.endpoints.get(inp.rest)
    if endpoint is not None and endpoint.table is None:
        raise BadRequest(f"{endpoint.id} declares no table (its answer has no rows treg knows of); call it as "
                         f"/catalog/call/{endpoint.id}", code="table_not_available", refused_by="catalog")


def read_whole(state: CallState) -> bool:
    """A table is made of the whole answer, on every tier (not only a metered one)."""
    return state.table is not None


def settles(svc: Services, state: CallState, ok: bool, data: bytes, headers: list[tuple[str, str]]) -> bool:
    """Whether a ``/table/`` answer is a success for money: a 2xx of which a table can be made (else its
    hold is released). The table is made here, once, so what is charged and what is answered agree;
    :func:`finish` sends it. Any other call: ``ok``."""
    asked = state.table
    if not ok or asked is None:
        return ok
    made = _make(svc, state, data, headers)
    state.table = replace(asked, made=made)
    return made is not None


def _spec(state: CallState) -> tables.TableSpec | None:
    target = state.target
    return target.catalog.endpoint.table if target is not None and target.catalog is not None else None


async def _whole(outcome: CallOutcome) -> bytes:
    if outcome.whole is not None:
        return outcome.whole
    return await read_bounded(outcome.body, metered.BUFFER_MAX, lambda: GatewayFailed(
        f"the answer is larger than {metered.BUFFER_MAX} bytes, the most /table/ reads",
        code="response_buffer_limit", blame="treg"))


def _make(svc: Services, state: CallState, data: bytes, headers: list[tuple[str, str]]) -> tables.Table | None:
    """The table of a whole 2xx answer (its codings undone, bounded); None: no rows where the row says."""
    spec = _spec(state)
    applied = encodings.codings(headers)
    decoded = encodings.decode(data, applied, metered.EVIDENCE_DECODED_MAX) if applied else data
    if spec is None or decoded is None:
        return None
    try:
        doc = tables.parse(decoded)
    except ValueError:  # not JSON, not text, or nested too deeply (treg/json_text.py)
        return None
    return tables.make_table(spec, doc, svc.settings.table_max_rows)


async def finish(svc: Services, state: CallState, outcome: CallOutcome) -> CallOutcome:
    """The call's answer as a table (a ``/table/`` call; any other outcome comes back unchanged)."""
    asked = state.table
    if asked is None:
        return outcome
    spec = _spec(state)
    assert spec is not None  # check_endpoint refused the call otherwise
    kept = [(k, v) for k, v in outcome.headers if k.lower().startswith(_KEPT_PREFIX)]
    try:
        data = await _whole(outcome)
    finally:
        outcome.close()
    if not 200 <= outcome.status < 300:
        # audited as what the vendor answered (the outcome's own finish: its status and evidence)
        return _refusal(GatewayFailed(f"the provider answered {outcome.status}; no table was made and nothing "
                                      "was charged", code="table_upstream_error", blame="upstream",
                                      upstream_status=outcome.status), kept, outcome.finish)
    # made by settle when the vendor answered now; a replay's or the archive's answer is made here
    table = asked.made if asked.made is not None else _make(svc, state, data, outcome.headers)
    if table is None:
        err = GatewayFailed(f"the provider's answer holds no rows at {spec.rows or 'its top level'!r} (not JSON, "
                            "or not the shape the catalog row declares); nothing was charged",
                            code="table_upstream_error", blame="upstream", upstream_status=outcome.status)

        def record_shape(sent: int, error: BaseException | None) -> None:
            audit(svc, state.record(outcome="upstream_error", status=outcome.status, error_code=err.code,
                                    blame="upstream", response_bytes=sent,
                                    request_bytes=state.inp.content_length))
        return _refusal(err, kept, finish_once(state, record_shape))
    if asked.csv:
        body, ctype = tables.to_csv(table), CSV_TYPE
        endpoint_id = state.target.endpoint_id if state.target is not None else "table"
        kept.append(("Content-Disposition", f'inline; filename="{endpoint_id}.csv"'))
    else:
        body, ctype = tables.to_json(table), JSON_TYPE
    if table.truncated:
        kept.append(("X-Treg-Table-Truncated", "true"))
    return _whole_outcome(200, "OK", [("Content-Type", ctype), *_GUARDS, *kept], body, outcome.finish)


def _refusal(err: GatewayFailed, kept: list[tuple[str, str]], finish: Any) -> CallOutcome:
    body = json.dumps(err.body(), ensure_ascii=False).encode()
    headers = [("Content-Type", JSON_TYPE), ("X-Treg-Error", "1"), *_GUARDS,
               *((k, v) for k, v in kept if k.lower() != "x-treg-cost-micro"), ("X-Treg-Cost-Micro", "0")]
    return _whole_outcome(err.status, "Bad Gateway", headers, body, finish)


def _whole_outcome(status: int, reason: str, headers: list[tuple[str, str]], body: bytes, finish: Any) -> CallOutcome:
    # ``relayed``: as a relayed answer, it has the Content-Type given here and no Server header of the edge's
    return CallOutcome.whole_answer(status, [*headers, ("Content-Length", str(len(body)))], body, finish,
                                    reason=reason)
