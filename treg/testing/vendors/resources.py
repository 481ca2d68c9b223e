"""A fake vendor with durable objects (webhooks) on 127.0.0.1, and the provider plugin declaring its
managed_resource endpoints, for the owned resources' tests (tests/test_resources*.py)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from treg.testing.upstreams import Exchange, http_response

PLATFORM_KEY = "hooky-platform-key-1"
TEAM_KEY = "hooky-team-key-2"


def hooky_provider(base_url: str, **over: Any) -> dict[str, Any]:
    """Provider ``hooky``: webhooks created, updated, pinged (used), read and deleted by id."""
    wid = [{"name": "webhook_id", "in": "path", "required": True}]
    row: dict[str, Any] = {
        "id": "hooky",
        "base_url": base_url,
        "auth": [{"location": "header", "name": "Authorization", "format": "Bearer {secret}"}],
        "required_headers": {"X-Hooky-Version": "7"},
        "endpoints": [
            {"id": "hooky.webhooks.create", "method": "POST", "path": "/webhooks", "params": [],
             "price": {"per_call_micro": 5000},
             "managed_resource": {"kind": "webhook", "role": "create", "id_path": "data.id"}},
            {"id": "hooky.webhooks.update", "method": "PATCH", "path": "/webhooks/{webhook_id}", "params": wid,
             "price": {"per_call_micro": 1000},
             "managed_resource": {"kind": "webhook", "role": "update", "id_param": "webhook_id"}},
            {"id": "hooky.webhooks.ping", "method": "POST", "path": "/webhooks/{webhook_id}/ping", "params": wid,
             "price": {"per_call_micro": 0},
             "managed_resource": {"kind": "webhook", "role": "use", "id_param": "webhook_id"}},
            {"id": "hooky.webhooks.get", "method": "GET", "path": "/hooks",
             "params": [{"name": "hook", "in": "query", "required": True}], "price": {"per_call_micro": 300},
             "managed_resource": {"kind": "webhook", "role": "use", "id_param": "hook"}},
            {"id": "hooky.webhooks.test_event", "method": "POST", "path": "/test-events",
             "params": [{"name": "webhook_id", "in": "body", "required": True, "type": "string"}],
             "price": {"per_call_micro": 200},
             "managed_resource": {"kind": "webhook", "role": "use", "id_param": "webhook_id"}},
            {"id": "hooky.webhooks.delete", "method": "DELETE", "path": "/webhooks/{webhook_id}", "params": wid,
             "price": {"per_call_micro": 0},
             "managed_resource": {"kind": "webhook", "role": "delete", "id_param": "webhook_id"}},
            {"id": "hooky.status", "method": "GET", "path": "/status", "params": [], "price": {"per_call_micro": 100}},
        ],
    }
    row.update(over)
    return row


@dataclass
class FakeVendor:
    """The vendor's side: objects by id, deduplicating creates by Idempotency-Key like real vendors do.
    ``fail_next`` answers the next request with that status; ``force_id`` makes creates name that id."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)
    counter: int = 0
    fail_next: int | None = None
    force_id: str | None = None
    omit_id: bool = False
    #: the status every DELETE answers (None: the normal behaviour)
    delete_status: int | None = None

    @staticmethod
    def _json(status: int, obj: Any, reason: str = "OK") -> bytes:
        return http_response(status, json.dumps(obj).encode(), [("Content-Type", "application/json")], reason=reason)

    def __call__(self, ex: Exchange) -> bytes:
        method, target = ex.method, ex.target
        path, _, query = target.partition("?")
        if self.fail_next is not None:
            status, self.fail_next = self.fail_next, None
            return self._json(status, {"error": "vendor failed"}, reason="Failed")
        if method == "POST" and path == "/v1/webhooks":
            key = ex.header("Idempotency-Key")
            if key is not None and key in self.keys:  # the vendor's dedup: the same job again
                wid = self.keys[key]
                return self._json(201, {"data": {"id": wid, **self.objects.get(wid, {})}}, "Created")
            self.counter += 1
            wid = self.force_id or f"wh_{self.counter}"
            self.objects[wid] = json.loads(ex.body or b"{}")
            if key is not None:
                self.keys[key] = wid
            if self.omit_id:
                return self._json(201, {"data": {"url": "x"}}, "Created")
            return self._json(201, {"data": {"id": wid, **self.objects[wid]}}, "Created")
        if path.startswith("/v1/webhooks/"):
            rest = path[len("/v1/webhooks/"):]
            wid, _, action = rest.partition("/")
            if wid not in self.objects:
                return self._json(404, {"error": "no such webhook"}, "Not Found")
            if method == "PATCH":
                self.objects[wid].update(json.loads(ex.body or b"{}"))
                return self._json(200, {"data": {"id": wid, **self.objects[wid]}})
            if method == "POST" and action == "ping":
                return self._json(200, {"pinged": wid})
            if method == "DELETE" and self.delete_status is not None:
                return self._json(self.delete_status, {"error": "cannot delete now"}, "Failed")
            if method == "DELETE":
                del self.objects[wid]
                return http_response(204, b"", reason="No Content")
        if method == "GET" and path == "/v1/hooks":
            wid = query.partition("=")[2]
            if wid not in self.objects:
                return self._json(404, {"error": "no such webhook"}, "Not Found")
            return self._json(200, {"data": {"id": wid, **self.objects[wid]}})
        if method == "POST" and path == "/v1/test-events":
            wid = json.loads(ex.body or b"{}").get("webhook_id")
            if wid not in self.objects:
                return self._json(404, {"error": "no such webhook"}, "Not Found")
            return self._json(202, {"sent_to": wid}, "Accepted")
        if path == "/v1/status":
            return self._json(200, {"ok": True})
        return self._json(400, {"error": f"unexpected {method} {target}"}, "Bad Request")
