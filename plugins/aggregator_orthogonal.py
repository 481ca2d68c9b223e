"""The built-in ``orthogonal`` aggregator: ``POST {URL}/v1/run`` with ``{"api", "path", "query"?, "body"?}``.

Success: 200 ``{"success": true, "price": "0.012", "data": <vendor JSON>, "requestId"}``. Failure:
``{"success": false, "error", "code"}`` with 401, 402, 429 (its own), 400/404/422 (this request refused),
or 502 ``UPSTREAM_ERROR`` carrying the vendor's answer as ``upstreamStatus`` and ``data``.
"""

from __future__ import annotations

from typing import Any, Mapping
from urllib.parse import quote

from treg import hookimpl
from treg.catalog.model import SLOT
from treg.overflow import aggregator as agg
from treg.overflow.http import NOT_JSON, exchange, message_of


class Orthogonal(agg.Aggregator):
    name = "orthogonal"
    default_url = "https://api.orth.sh"

    def check_route(self, route: Mapping[str, Any]) -> list[tuple[str, str]]:
        problems = []
        for key in sorted(set(route) - {"api", "path"}):
            problems.append((key, "unknown field of an orthogonal route; it has api and path"))
        if not isinstance(route.get("api"), str) or not route["api"].strip():
            problems.append(("api", "must name the API at Orthogonal"))
        path = route.get("path")
        if not isinstance(path, str) or not path.startswith("/"):
            problems.append(("path", "must be the vendor path starting with '/', slots as {name}"))
        return problems

    async def run(self, session, *, base_url, key, route, call, poll_max_s) -> agg.OverflowResult:
        path = SLOT.sub(lambda m: quote(str(call.path_params.get(m.group(1), "")), safe=""), route.get("path"))
        payload: dict[str, Any] = {"api": route.get("api"), "path": path}
        if call.query:
            payload["query"] = dict(call.query)
        if call.body is not None:
            payload["body"] = call.body
        ex = await exchange(session, "POST", base_url.rstrip("/") + "/v1/run", key, payload, timeout_s=poll_max_s)
        return read_answer(ex.status, ex.data, ex.error)


def read_answer(status: int | None, data: Any, error: str | None = None) -> agg.OverflowResult:
    if status is None or data is NOT_JSON or not isinstance(data, dict):
        return agg.OverflowResult(agg.NOT_ENVELOPE, message=error or "not an Orthogonal envelope",
                                  aggregator_status=status)
    if status == 200 and data.get("success") is True and "data" in data:
        price = agg.usd_to_micro(data.get("price"))
        if price is None:
            return agg.OverflowResult(agg.NOT_ENVELOPE, message="success without a readable price",
                                      aggregator_status=status)
        return agg.OverflowResult(vendor_status=200, vendor_body=data["data"], price_micro=price,
                                  aggregator_status=status)
    message = message_of(data)
    if status == 502 and isinstance(data.get("upstreamStatus"), int):
        vendor = data["upstreamStatus"]
        # the vendor's own answer, relayed unbilled: a 402 says treg's vendor account there is out
        return agg.OverflowResult(agg.VENDOR_CAPACITY if vendor == 402 else None, vendor_status=vendor,
                                  vendor_body=data.get("data"), message=message, aggregator_status=status)
    kind = {401: agg.UNAUTHORIZED, 403: agg.UNAUTHORIZED, 402: agg.WALLET, 429: agg.RATE_LIMITED,
            400: agg.REFUSED, 404: agg.REFUSED, 422: agg.REFUSED}.get(status, agg.NOT_ENVELOPE)
    return agg.OverflowResult(kind, message=message, aggregator_status=status)


@hookimpl
def treg_register_aggregators() -> list[agg.Aggregator]:
    return [Orthogonal()]
