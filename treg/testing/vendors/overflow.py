"""A treg with overflow routes, over real sockets: a fake vendor, a fake Orthogonal and a fake Monid on
127.0.0.1 speaking the contract's envelopes, pointed at by ``TREG_OVERFLOW_URL_<NAME>``
(tests/test_overflow_*.py)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from treg import hookimpl, membership, money
from treg.keys import SERVICES
from treg.settings import SecretStr
from treg.testing.events import Events
from treg.testing.gateway import Gateway

ORTH_KEY = "sk-orth-very-secret-1"
MONID_KEY = "sk-monid-very-secret-2"
PLATFORM_KEY = "pk-acme-platform-3"
DIRECT_PRICE = 2000
ORTH_PRICE = 12000
MONID_PRICE = 15000
CREDITS = 1_000_000


def acme(base_url: str) -> dict[str, Any]:
    return {
        "id": "acme", "base_url": base_url,
        "auth": [{"location": "header", "name": "Authorization", "format": "Bearer {secret}"}],
        "endpoints": [
            {"id": "acme.items.get", "method": "GET", "path": "/items/{item_id}",
             "params": [{"name": "item_id", "in": "path", "required": True},
                        {"name": "fields", "in": "query"}],
             "price": {"per_call_micro": DIRECT_PRICE}, "capability": "items.lookup",
             "overflow": [{"aggregator": "orthogonal", "api": "acme", "path": "/items/{item_id}",
                           "price_micro": ORTH_PRICE},
                          {"aggregator": "monid", "provider": "acme", "endpoint": "items-get",
                           "price_micro": MONID_PRICE}]},
            {"id": "acme.items.create", "method": "POST", "path": "/items",
             "params": [{"name": "name", "in": "body"}], "price": {"per_call_micro": 300},
             "overflow": [{"aggregator": "orthogonal", "api": "acme", "path": "/items", "price_micro": 5000}]},
            {"id": "acme.items.other", "method": "GET", "path": "/other/{item_id}",
             "params": [{"name": "item_id", "in": "path", "required": True}],
             "price": {"per_call_micro": 700}, "capability": "items.lookup"},
        ],
    }


SIGNATURES = [
    {"provider": "acme", "kind": "balance", "status": [402], "body_contains": "insufficient credits"},
    {"provider": "acme", "kind": "quota", "status": [429], "header": {"name": "x-quota", "equals": "daily"}},
    # a 401 a signature would call "balance": still never overflowed (treg's key refused is not "out")
    {"provider": "acme", "kind": "balance", "status": [401], "body_contains": "account suspended"},
]


class AcmePlugin:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    @hookimpl
    def treg_register_providers(self):
        return [acme(self.base_url)]

    @hookimpl
    def treg_register_capacity_signatures(self):
        return SIGNATURES


@dataclass
class Fake:
    """One fake server: ``reply`` is (status, headers, body) or an async callable(request, n) -> Response."""

    reply: Any = (200, {}, b"{}")
    seen: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        self.seen.append({"method": request.method, "path": request.path_qs, "auth": request.headers.get("Authorization"),
                          "json": json.loads(raw) if raw else None})
        if callable(self.reply):
            return await self.reply(request, len(self.seen))
        status, headers, body = self.reply
        if not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        return web.Response(status=status, headers=headers, body=body if isinstance(body, bytes) else body.encode(),
                            content_type=headers.get("Content-Type", "application/json"))


async def serve(aiohttp_server, fake: Fake) -> Fake:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", fake.handle)
    server = await aiohttp_server(app)
    fake.url = str(server.make_url("")).rstrip("/")
    return fake


def vendor_402() -> tuple[int, dict[str, str], Any]:
    return 402, {}, {"error": "insufficient credits on this account"}


def orth_ok(price: str = "0.011", data: Any = None) -> tuple[int, dict[str, str], Any]:
    return 200, {}, {"success": True, "price": price, "data": data if data is not None else {"via": "orthogonal"},
                     "requestId": "req-1"}


def monid_async(cost: float = 0.015, body: Any = None, running_polls: int = 1):
    """202 RUNNING, ``running_polls`` polls still RUNNING, then COMPLETED."""
    async def reply(request: web.Request, n: int) -> web.Response:
        if request.method == "POST":
            return web.json_response({"runId": "run-7", "status": "RUNNING"}, status=202)
        if n - 1 <= running_polls:
            return web.json_response({"runId": "run-7", "status": "RUNNING"})
        return web.json_response({"runId": "run-7", "status": "COMPLETED",
                                  "providerResponse": {"httpStatus": 200, "body": body or {"via": "monid"}},
                                  "cost": {"value": cost, "currency": "USD"}})
    return reply


@dataclass
class World:
    gw: Gateway
    vendor: Fake
    orth: Fake
    monid: Fake
    events: Events

    @property
    def svc(self) -> Any:
        return self.gw.services

    async def call(self, query: str = "item_id=a%2Fb&fields=all", endpoint: str = "acme.items.get", **kw: Any):
        r = await self.gw.call(kw.pop("method", "GET"), f"/catalog/call/{endpoint}?{query}", **kw)
        body = await r.read()
        return r, body

    async def holds(self) -> dict[str, dict[str, Any]]:
        async with self.svc.db.tx() as tx:
            rows = await tx.fetch_all("SELECT id, state, amount_micro, settled_micro FROM holds")
        return {r["id"]: r for r in rows}

    async def rows(self) -> dict[str, dict[str, Any]]:
        await self.svc.audit.flush()
        async with self.svc.db.tx() as tx:
            rows = await tx.fetch_all("SELECT * FROM calls")
        return {r["id"]: r for r in rows}

    async def balance(self) -> Any:
        return await money.balance(self.svc, self.gw.org["org_id"])

    async def spend(self, aggregator: str) -> int:
        async with self.svc.db.tx() as tx:
            return int(await tx.scalar("SELECT coalesce(sum(spent_micro), 0) FROM overflow_spend WHERE aggregator = "
                                       "%(a)s", {"a": aggregator}) or 0)

    async def marks(self) -> set[str]:
        async with self.svc.db.tx() as tx:
            return {r["mark"] for r in await tx.fetch_all("SELECT mark FROM overflow_health WHERE until > now()")}

    async def lock(self, kind: str = "balance", *, probe_spent: bool = True) -> None:
        """Two strikes (the gap is 0 in these apps): the provider's key is locked; ``probe_spent``: and
        this process's probe slot taken, as after the lock's first call (which goes to the vendor)."""
        breaker = self.svc.breaker
        await breaker.strike(kind, "acme", "acme.items.get")
        await asyncio.sleep(0.01)
        out = await breaker.strike(kind, "acme", "acme.items.get")
        # a direct answer of the test may have struck already (the breaker runs on every call)
        assert out.outcome in ("locked", "already_locked"), out
        lock = await self.svc.lock_view.lookup("acme", "acme.items.get")
        assert lock is not None
        if probe_spent:
            self.svc.lock_view.take_probe(lock)  # False when an earlier call of the test was the probe


def settings_for(vendor: Fake, orth: Fake, monid: Fake, **over: Any) -> dict[str, Any]:
    base: dict[str, Any] = dict(
        ssrf_allow=("127.0.0.0/8",), platform={"TREG_PLATFORM_KEY_ACME": SecretStr(PLATFORM_KEY)},
        overflow_mode="on", overflow_keys={"ORTHOGONAL": SecretStr(ORTH_KEY), "MONID": SecretStr(MONID_KEY)},
        overflow_urls={"ORTHOGONAL": orth.url, "MONID": monid.url}, overflow_poll_max_s=5.0,
        capacity_strike_gap_s=0.0)
    base.update(over)
    return base


async def make_world(make_app, aiohttp_server, aiohttp_client, *, credits: int = CREDITS, org_slug: str = "acme",
                     **over: Any) -> World:
    vendor = await serve(aiohttp_server, Fake(reply=vendor_402()))
    orth = await serve(aiohttp_server, Fake(reply=orth_ok()))
    monid = await serve(aiohttp_server, Fake(reply=monid_async()))
    events = Events()
    app = make_app(extra_plugins=(AcmePlugin(vendor.url + "/v1"), events), **settings_for(vendor, orth, monid, **over))
    client = await aiohttp_client(app)
    svc = client.app[SERVICES]
    org = await membership.create_org(svc, slug=org_slug, email=f"owner@{org_slug}.test")
    if credits:
        await money.grant(svc, org_id=org["org_id"], amount_micro=credits, actor="test")
    return World(Gateway(client, org), vendor, orth, monid, events)
