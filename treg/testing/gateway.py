"""A treg under test, with its first org (``Gateway``); a new org of a running treg, with credits
(``open_org``); one set up for catalog vendors (``vendor_gateway``); a call's audit row once it is
written (``audit_row``); a member added through the API by any client (``add_member``)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator, Mapping

from treg import membership, money
from treg.keys import SERVICES
from treg.settings import SecretStr
from treg.testing.client import RawReply, raw_exchange, raw_request_bytes
from treg.testing.providers import ProviderPlugin, example_provider, media_provider
from treg.testing.upstreams import raw_upstream


class Gateway:
    """A running treg (aiohttp TestClient on a real socket) with an org and its owner, plus helpers to
    set up members, secrets and tools through the management API."""

    def __init__(self, client: Any, org: dict[str, Any]) -> None:
        self.client = client
        self.org = org
        self.owner = {"X-Treg-Token": org["token"]}

    @property
    def services(self) -> Any:
        return self.client.app[SERVICES]

    async def api(self, method: str, path: str, *, as_: dict[str, str] | None = None, expect: int | None = None,
                  **kw: Any) -> Any:
        resp = await self.client.request(method, path, headers=as_ or self.owner, **kw)
        body = await resp.json() if resp.content_type == "application/json" else await resp.read()
        if expect is not None:
            assert resp.status == expect, (resp.status, body)
        return body

    async def secret(self, value: Any, name: str = "key", provider: str | None = None) -> str:
        body: dict[str, Any] = {"name": name, "value": value}
        if provider:
            body["provider"] = provider
        return (await self.api("POST", "/api/v1/secrets", json=body, expect=201))["id"]

    async def tool(self, name: str, base_url: str, bindings: list[dict[str, Any]] | None = None,
                   **extra: Any) -> dict[str, Any]:
        return await self.api("POST", "/api/v1/tools", json={"name": name, "base_url": base_url,
                                                             "bindings": bindings or [], **extra}, expect=201)

    async def member(self, email: str, role: str = "member", project_ids: list[str] | None = None) -> dict[str, Any]:
        out = await self.api("POST", "/api/v1/members", json={"email": email, "role": role,
                                                              "project_ids": project_ids}, expect=201)
        out["headers"] = {"X-Treg-Token": out["token"]}
        return out

    async def call(self, method: str, path: str, *, as_: dict[str, str] | None = None, **kw: Any) -> Any:
        """The call's answer (its body unread), once the hold close it queued is written: treg closes holds
        off the answer's path (treg/money/settler.py), and a test reading the database right after an
        answer waits for that close as treg's own read routes do."""
        headers = {**(as_ or self.owner), **kw.pop("headers", {})}
        resp = await self.client.request(method, path, headers=headers, **kw)
        await self.services.settler.drain()
        return resp

    async def raw(self, method: str, target: str, headers: list[tuple[str, str]] | None = None,
                  body: bytes | None = None, *, chunks: list[bytes] | None = None, auth: bool = True) -> "RawReply":
        """A call sent as exact bytes on a fresh socket (no client-added headers; the owner's token
        first unless ``auth`` is False), its answer read with framing kept, once the hold close it
        queued is written."""
        hs = ([("X-Treg-Token", self.org["token"])] if auth else []) + list(headers or [])
        data = raw_request_bytes(method, target, hs, body, chunks=chunks)
        reply = await raw_exchange(self.client.port, data, head_request=method.upper() == "HEAD")
        await self.services.settler.drain()  # as :meth:`call`: the hold close the call queued is written
        return reply

    async def calls(self, as_: dict[str, str] | None = None) -> list[dict[str, Any]]:
        return (await self.api("GET", "/api/v1/calls?limit=500", as_=as_, expect=200))["calls"]

    async def wait_calls(self, n: int, *, bound: float = 10.0) -> list[dict[str, Any]]:
        """The audit rows once ``n`` of them are written (the writer batches: polled, at most ``bound`` s)."""
        calls: list[dict[str, Any]] = []
        for _ in range(int(bound / 0.02)):
            calls = await self.calls()
            if len(calls) >= n:
                return calls
            await asyncio.sleep(0.02)
        raise AssertionError(f"expected {n} audit rows, got {len(calls)}")


async def audit_row(gw: Gateway, call_id: str, *, bound: float = 10.0) -> dict[str, Any]:
    """The audit row of ``call_id`` through the API once it is written (the writer batches: polled, at
    most ``bound`` s)."""
    for _ in range(int(bound / 0.02)):
        r = await gw.call("GET", f"/api/v1/calls/{call_id}")
        if r.status == 200:
            return await r.json()
        await asyncio.sleep(0.02)
    raise AssertionError(f"no audit row for {call_id}")


async def open_org(client: Any, slug: str, email: str, *, credits: int = 0, actor: str = "test") -> Gateway:
    """A new org ``slug`` (owner ``email``) of the treg ``client`` talks to, granted ``credits``."""
    org = await membership.create_org(client.app[SERVICES], slug=slug, email=email)
    gw = Gateway(client, org)
    if credits:
        await money.grant(gw.services, org_id=org["org_id"], amount_micro=credits, actor=actor)
    return gw


@contextlib.asynccontextmanager
async def vendor_gateway(aiohttp_client: Any, make_app: Any, providers: list[dict[str, Any]], *,
                         platform: Mapping[str, str], plugins: tuple[Any, ...] = (), slug: str = "v",
                         email: str | None = None, credits: int = 1_000_000,
                         **settings: Any) -> AsyncIterator[Gateway]:
    """A gateway serving ``providers`` (platform keys ``platform``, env name → value) beside ``plugins``,
    relaying to 127.0.0.0/8, with org ``slug`` (owner ``email``, ``<slug>@<slug>.test`` unless given)
    holding ``credits``; closed on exit."""
    app = make_app(extra_plugins=(ProviderPlugin(providers), *plugins), ssrf_allow=("127.0.0.0/8",),
                   platform={name: SecretStr(value) for name, value in platform.items()}, **settings)
    client = await aiohttp_client(app)
    try:
        yield await open_org(client, slug, email or f"{slug}@{slug}.test", credits=credits, actor="t")
    finally:
        await client.close()


#: treg's own keys for ``acme`` and ``gem`` (``example_provider``, ``media_provider``)
ACME_PLATFORM = {"TREG_PLATFORM_KEY_ACME": "pk-acme", "TREG_PLATFORM_KEY_GEM": "pk-gem"}


@contextlib.asynccontextmanager
async def answering_acme(aiohttp_client: Any, make_app: Any, *, credits: int = 1_000_000,
                         slug: str = "z") -> AsyncIterator[tuple[Gateway, Any, dict[str, bytes]]]:
    """(gateway, upstream, answers): ``acme`` (at ``/v1``) and ``gem`` on treg's platform keys, both served by
    one raw upstream that answers whatever ``answers["reply"]`` holds (``http_response(...)``)."""
    answers: dict[str, bytes] = {}
    async with raw_upstream(lambda ex: answers["reply"]) as up, \
            vendor_gateway(aiohttp_client, make_app, [example_provider(up.url + "/v1"), media_provider(up.url)],
                           slug=slug, credits=credits, platform=ACME_PLATFORM) as gw:
        yield gw, up, answers


async def add_member(client: Any, headers: dict[str, str], email: str, role: str = "member",
                     project_ids: Any = "absent") -> dict[str, Any]:
    """``POST /api/v1/members`` as ``headers`` (``project_ids`` left out of the body unless given); the new
    member with ``headers`` that authenticate as it."""
    body: dict[str, Any] = {"email": email, "role": role}
    if project_ids != "absent":
        body["project_ids"] = project_ids
    resp = await client.post("/api/v1/members", json=body, headers=headers)
    assert resp.status == 201, (resp.status, await resp.text())
    assert "X-Treg-Error" not in resp.headers
    out = await resp.json()
    out["headers"] = {"X-Treg-Token": out["token"]}
    return out
