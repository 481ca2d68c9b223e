"""A scripted vendor for the catalog's declared success rules and request guards (tests/test_success_rule.py,
tests/test_request_guards.py): the ``scrape`` provider's rows and a raw-socket responder whose answers a
test sets per path.

``Scripted`` answers each request with what :meth:`Scripted.answer` set for its path (status, body,
headers), else ``200 {"data": [1]}``; its async job (``POST /v1/jobs`` → ``{"data": {"task_id": "j<n>"}}``,
``GET /v1/jobs/<id>`` → the status and extra fields a test set) is for the rule's poll cases.
``scrape_gateway`` is a treg serving them, treg's key configured.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from treg.testing.gateway import Gateway, vendor_gateway
from treg.testing.upstreams import Exchange, RawUpstream, http_response, raw_upstream

PLATFORM_KEY = "pk-scrape-0123456789"
ENV = {"TREG_PLATFORM_KEY_SCRAPE": PLATFORM_KEY}
#: what each billed row costs, micro-USD
PRICES = {"scrape.search": 3000, "scrape.strict": 1000, "scrape.plain": 1000, "scrape.bulk": 5000,
          "scrape.cached": 2000, "scrape.jobs.create": 4000, "scrape.search_dear": 6000, "scrape.big": 1500}

NO_ERROR = {"path": "error", "absent": True}
ASYNC = {"task_id": "data.task_id", "poll": "scrape.jobs.get", "task_param": "id", "status_path": "status",
         "done": ["completed"], "failed": ["failed"]}


def scrape_provider(base_url: str) -> dict[str, Any]:
    """``scrape``: a vendor answering 200 with an error inside, its rows declaring success rules and guards."""
    def row(eid: str, method: str, path: str, **over: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"id": eid, "method": method, "path": path, "params": [],
                               "price": {"per_call_micro": PRICES.get(eid, 0)}}
        out.update(over)
        return out

    return {
        "id": "scrape", "base_url": base_url,
        "auth": [{"location": "header", "name": "X-Key"}],
        "endpoints": [
            row("scrape.search", "GET", "/search", params=[{"name": "q", "in": "query"}], success=NO_ERROR,
                capability="web.search",
                guards=[{"param": "limit", "in": "query", "type": "integer", "min": 1, "max": 100, "default": 25},
                        {"param": "offset", "in": "query", "type": "integer", "min": 0, "max": 1000}]),
            row("scrape.search_dear", "GET", "/search2", params=[{"name": "q", "in": "query"}], success=NO_ERROR,
                capability="web.search"),
            row("scrape.strict", "GET", "/status", success={"status": [200], "path": "status", "equals": "ok"}),
            row("scrape.plain", "GET", "/plain"),
            row("scrape.bulk", "POST", "/bulk", success={"path": "data", "nonempty": True},
                guards=[{"param": "page_size", "in": "body", "type": "integer", "min": 1, "max": 50, "default": 10},
                        {"param": "pages", "in": "body", "type": "integer", "max": 3}]),
            row("scrape.cached", "GET", "/cached", params=[{"name": "q", "in": "query"}], success=NO_ERROR,
                archive={"ttl_s": 3600}),
            row("scrape.jobs.create", "POST", "/jobs", success=NO_ERROR, **{"async": ASYNC}),
            row("scrape.jobs.get", "GET", "/jobs/{id}", params=[{"name": "id", "in": "path"}]),
            row("scrape.big", "POST", "/big", success=NO_ERROR,
                price={"usage": [{"path": "usage.pages", "micro_per_unit": 500}], "estimate_micro": PRICES["scrape.big"]},
                spooled_response=True),
        ],
    }


@dataclass
class Scripted:
    """The vendor's answers by path (``/v1/search``), and its async jobs."""

    answers: dict[str, tuple[int, bytes, list[tuple[str, str]]]] = field(default_factory=dict)
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def answer(self, path: str, status: int, body: Any, content_type: str | None = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.answers[path] = (status, data, [("Content-Type", content_type)] if content_type else [])

    def respond(self, ex: Exchange) -> bytes:
        path = ex.target.partition("?")[0]
        if path in self.answers:
            status, body, headers = self.answers[path]
            return http_response(status, body, headers, reason="OK" if status < 400 else "Error")
        if ex.method == "POST" and path == "/v1/jobs":
            task_id = f"j{len(self.jobs) + 1}"
            self.jobs[task_id] = {"status": "running"}
            return _json({"data": {"task_id": task_id}})
        m = re.fullmatch(r"/v1/jobs/([^/]+)", path)
        if m and m.group(1) in self.jobs:
            return _json(self.jobs[m.group(1)])
        return _json({"data": [1]})


def _json(obj: Any) -> bytes:
    return http_response(200, json.dumps(obj).encode(), [("Content-Type", "application/json")])


@contextlib.asynccontextmanager
async def scrape_gateway(aiohttp_client: Any, make_app: Any, credits: int = 100_000
                         ) -> AsyncIterator[tuple[Gateway, Scripted, RawUpstream]]:
    """(gateway, vendor, upstream): the scrape rows on a scripted raw upstream, treg's key configured, the
    org holding ``credits``."""
    vendor = Scripted()
    async with raw_upstream(vendor.respond) as up, \
            vendor_gateway(aiohttp_client, make_app, [scrape_provider(up.url + "/v1")], platform=ENV,
                           credits=credits) as gw:
        yield gw, vendor, up
