"""A fake vendor for the capacity tests: a third-party-style provider plugin FILE (loaded through
``TREG_PLUGINS_DIR``, no core edit) declaring providers and capacity signature rows, and a scripted
raw-socket upstream on 127.0.0.1 standing in for the vendor; a platform lock as the breaker writes it
(``strike_lock``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from treg.capacity.breaker import BreakerStore
from treg.testing.clock import T0, Clock
from treg.testing.upstreams import Exchange, http_response

#: the plugin file's text after its first line (``URL = "<upstream>"``); nothing here is treg's core
PLUGIN_BODY = '''
from treg import hookimpl

AUTH = [{"location": "header", "name": "Authorization", "format": "Bearer {secret}"}]


def _get(eid, path, price, **extra):
    slots = [p[1:-1] for p in path.split("/") if p.startswith("{")]
    return {"id": eid, "method": "GET", "path": path, "price": {"per_call_micro": price},
            "params": [{"name": s, "in": "path", "required": True} for s in slots], **extra}


@hookimpl
def treg_register_providers():
    return [
        {"id": "vend", "base_url": URL + "/v1", "auth": AUTH, "endpoints": [
            _get("vend.items.get", "/items/{item_id}", 1000, capability="items.lookup"),
            _get("vend.items.alt", "/alt/{item_id}", 700, capability="items.lookup"),
            {"id": "vend.items.create", "method": "POST", "path": "/items", "params": [],
             "price": {"per_call_micro": 500}},
            _get("vend.free", "/free", 0),
        ]},
        {"id": "other", "base_url": URL + "/o", "auth": AUTH, "endpoints": [
            _get("other.items.get", "/items/{item_id}", 1500, capability="items.lookup"),
        ]},
        {"id": "spaced", "base_url": URL + "/s", "auth": AUTH, "rate_limit": {"limit": SPACED_LIMIT, "window_s": 1},
         "endpoints": [_get("spaced.get", "/get", 100)]},
    ]


@hookimpl
def treg_register_capacity_signatures():
    return [
        {"provider": "vend", "kind": "balance", "status": [402], "body_contains": "insufficient credits"},
        {"provider": "vend", "kind": "quota", "status": [429], "header": {"name": "x-quota", "equals": "daily"},
         "resets_at": {"header": "x-quota-reset", "format": "epoch"}},
    ]
'''

PRICES = {"vend.items.get": 1000, "vend.items.alt": 700, "vend.items.create": 500, "vend.free": 0,
          "other.items.get": 1500, "spaced.get": 100}
PLATFORM_KEYS = {"TREG_PLATFORM_KEY_VEND": "pk-vend", "TREG_PLATFORM_KEY_OTHER": "pk-other",
                 "TREG_PLATFORM_KEY_SPACED": "pk-spaced"}


def write_plugin(directory: Path, url: str, spaced_limit: int = 5) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "vend_fake.py"
    path.write_text(f"URL = {url!r}\nSPACED_LIMIT = {spaced_limit!r}\n" + PLUGIN_BODY)
    return path


def ok(body: Any = None) -> bytes:
    return http_response(200, json.dumps(body if body is not None else {"ok": True}).encode(),
                         [("Content-Type", "application/json")])


def out_of_credits() -> bytes:
    return http_response(402, b'{"error": "Insufficient credits on this account"}',
                         [("Content-Type", "application/json")], reason="Payment Required")


def answer(status: int, body: bytes = b"{}", headers: list[tuple[str, str]] | None = None) -> bytes:
    return http_response(status, body, [("Content-Type", "application/json"), *(headers or [])], reason="X")


class Vendor:
    """The responder: scripted answers in order (per path prefix when given), then 200 ``{"ok": true}``."""

    def __init__(self) -> None:
        self.script: list[tuple[str, bytes]] = []
        self.seen: list[Exchange] = []
        #: when each request arrived (time.monotonic())
        self.arrived: list[float] = []

    def then(self, *answers: bytes, path: str = "") -> "Vendor":
        self.script.extend((path, a) for a in answers)
        return self

    def __call__(self, ex: Exchange) -> bytes:
        self.seen.append(ex)
        self.arrived.append(time.monotonic())
        for i, (prefix, out) in enumerate(self.script):
            if ex.target.startswith(prefix):
                del self.script[i]
                return out
        return ok()


async def strike_lock(svc: Any, kind: str, provider: str, endpoint: str) -> Any:
    """The lock two ``kind`` strikes 20 s apart put on ``provider``'s key, written by the breaker itself and
    dated in 2100 (far future: still on whenever the test, the CLI or a page reads it)."""
    clock = Clock(T0.replace(year=2100))
    store = BreakerStore(svc.db, svc.settings, clock=clock)
    await store.strike(kind, provider, endpoint)
    clock.advance(20)
    return (await store.strike(kind, provider, endpoint)).lock
