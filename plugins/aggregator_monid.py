"""The built-in ``monid`` aggregator: ``POST {URL}/v1/run`` with ``{"provider", "endpoint", "input":
{"body", "queryParams", "pathParams"}}``; 200 with the run, or 202 ``{"runId", "status": "RUNNING"}``
then ``GET {URL}/v1/runs/{runId}`` polled (bounded by ``TREG_OVERFLOW_POLL_MAX_S``) until ``COMPLETED``
(``providerResponse: {httpStatus, body}``, ``cost: {value, currency: "USD"}``) or
``FAILED``/``TIMED_OUT``/``STOPPED``/``BLOCKED`` (unbilled). Its own 402 is its wallet; a vendor 402 comes
back as an unbilled 502.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Mapping
from urllib.parse import quote

from treg import hookimpl
from treg.overflow import aggregator as agg
from treg.overflow.http import NOT_JSON, exchange, message_of

_UNBILLED_ENDS = ("FAILED", "TIMED_OUT", "STOPPED", "BLOCKED")
_RUNNING = ("RUNNING", "PENDING", "QUEUED", "READY")
#: first poll delay; doubles up to _POLL_MAX_DELAY_S
_POLL_FIRST_DELAY_S = 0.1
_POLL_MAX_DELAY_S = 2.0


class Monid(agg.Aggregator):
    name = "monid"
    default_url = "https://api.monid.ai"

    def check_route(self, route: Mapping[str, Any]) -> list[tuple[str, str]]:
        problems = []
        for key in sorted(set(route) - {"provider", "endpoint"}):
            problems.append((key, "unknown field of a monid route; it has provider and endpoint"))
        for key in ("provider", "endpoint"):
            if not isinstance(route.get(key), str) or not route[key].strip():
                problems.append((key, f"must name the {key} at Monid"))
        return problems

    async def run(self, session, *, base_url, key, route, call, poll_max_s) -> agg.OverflowResult:
        base = base_url.rstrip("/")
        payload = {"provider": route.get("provider"), "endpoint": route.get("endpoint"),
                   "input": {"body": call.body, "queryParams": dict(call.query), "pathParams": dict(call.path_params)}}
        deadline = time.monotonic() + poll_max_s
        ex = await exchange(session, "POST", base + "/v1/run", key, payload, timeout_s=poll_max_s)
        # 202 (or a 200 whose run is still going): poll the run until it ends or the bound passes
        if ex.status in (200, 202) and isinstance(ex.data, dict) and isinstance(ex.data.get("runId"), str) \
                and (ex.status == 202 or ex.data.get("status") in _RUNNING):
            run_url = f"{base}/v1/runs/{quote(ex.data['runId'], safe='')}"
            delay = _POLL_FIRST_DELAY_S
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return agg.OverflowResult(agg.NOT_ENVELOPE, message=f"run not finished within {poll_max_s:g} s")
                await asyncio.sleep(min(delay, left))
                delay = min(delay * 2, _POLL_MAX_DELAY_S)
                ex = await exchange(session, "GET", run_url, key, timeout_s=max(0.1, deadline - time.monotonic()))
                if ex.status == 200 and isinstance(ex.data, dict) and ex.data.get("status") in _RUNNING:
                    continue
                break
        return read_answer(ex.status, ex.data, ex.error)


def read_answer(status: int | None, data: Any, error: str | None = None) -> agg.OverflowResult:
    if status is None or data is NOT_JSON or not isinstance(data, dict):
        return agg.OverflowResult(agg.NOT_ENVELOPE, message=error or "not a Monid envelope", aggregator_status=status)
    message = message_of(data)
    if status == 200:
        run_status = data.get("status")
        if run_status == "COMPLETED":
            resp, cost = data.get("providerResponse"), data.get("cost")
            vendor = resp.get("httpStatus") if isinstance(resp, dict) else None
            price = agg.usd_to_micro(cost.get("value")) if isinstance(cost, dict) and cost.get("currency") == "USD" \
                else None
            if not isinstance(vendor, int) or isinstance(vendor, bool) or price is None:
                return agg.OverflowResult(agg.NOT_ENVELOPE, message="a COMPLETED run without providerResponse.httpStatus "
                                          "or a USD cost", aggregator_status=status)
            if vendor == 402:
                return agg.OverflowResult(agg.VENDOR_CAPACITY, vendor_status=vendor, vendor_body=resp.get("body"),
                                          message=message, aggregator_status=status)
            return agg.OverflowResult(vendor_status=vendor, vendor_body=resp.get("body"), price_micro=price,
                                      aggregator_status=status)
        if run_status == "BLOCKED":
            return agg.OverflowResult(agg.REFUSED, message=message or "run BLOCKED", aggregator_status=status)
        if run_status in _UNBILLED_ENDS:
            return agg.OverflowResult(agg.NOT_ENVELOPE, message=message or f"run {run_status}",
                                      aggregator_status=status)
        return agg.OverflowResult(agg.NOT_ENVELOPE, message=f"run status {run_status!r}", aggregator_status=status)
    if status == 502:
        # a vendor 402 comes back as an unbilled 502: treg's vendor account behind Monid is out
        return agg.OverflowResult(agg.VENDOR_CAPACITY, vendor_status=402, message=message, aggregator_status=status)
    kind = {401: agg.UNAUTHORIZED, 403: agg.UNAUTHORIZED, 402: agg.WALLET, 429: agg.RATE_LIMITED,
            400: agg.REFUSED, 404: agg.REFUSED, 422: agg.REFUSED}.get(status, agg.NOT_ENVELOPE)
    return agg.OverflowResult(kind, message=message, aggregator_status=status)


@hookimpl
def treg_register_aggregators() -> list[agg.Aggregator]:
    return [Monid()]
