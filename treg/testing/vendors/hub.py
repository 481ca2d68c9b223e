"""Two orgs on one treg for the hub's tests (docs/sharing.md "Hub"): a publishing org whose tool injects a
secret into a ``RawUpstream`` and is published as ``<slug>.<name>``, and a calling org with credits;
each org has its owner and one plain member (``hub_pair``). Also what a test of the credential's
secrecy looks for: every spelling of it a redactor knows (``spellings``)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from dataclasses import dataclass
from typing import Any, AsyncIterator
from urllib.parse import quote

from treg.testing.gateway import Gateway, open_org
from treg.testing.upstreams import RawUpstream, Responder, http_response, raw_upstream

#: the publishing org's credential: it must reach the upstream and nothing the caller can read
SECRET = "sk_live_PUBLISHER_only_9f3a7c21"


def spellings(value: str = SECRET) -> list[str]:
    """``value`` as an answer or a row could spell it: raw, base64 (both alphabets), hex, percent-encoded."""
    raw = value.encode()
    return [value, base64.b64encode(raw).decode().rstrip("="), base64.urlsafe_b64encode(raw).decode().rstrip("="),
            raw.hex(), raw.hex().upper(), quote(value, safe=""), value[4:20]]


def leaks(text: str | bytes, value: str = SECRET) -> list[str]:
    """The spellings of ``value`` found in ``text`` (a JSON document, an answer's bytes)."""
    if isinstance(text, bytes):
        text = text.decode("latin-1")
    return [s for s in spellings(value) if s in text]


@dataclass
class HubPair:
    client: Any
    publisher: Gateway  # org ``pub`` (by default), its owner
    caller: Gateway  # org ``callr``, its owner
    publisher_member: dict[str, Any]
    caller_member: dict[str, Any]
    upstream: RawUpstream
    tool: dict[str, Any]
    hub: dict[str, Any]  # the publish answer

    @property
    def ref(self) -> str:
        return self.hub["ref"]

    @property
    def services(self) -> Any:
        return self.publisher.services

    async def call(self, method: str, path: str, *, as_: dict[str, str] | None = None, **kw: Any) -> Any:
        """``/call/<ref><path>`` as the calling org's member (or ``as_``), once its hold close is written."""
        return await self.caller.call(method, f"/call/{self.ref}{path}", as_=as_ or self.caller_member["headers"],
                                      **kw)

    async def row(self, gw: Gateway, call_id: str) -> dict[str, Any]:
        """``call_id``'s audit row as ``gw``'s owner reads it (polled until written)."""
        for _ in range(500):
            r = await gw.call("GET", f"/api/v1/calls/{call_id}")
            if r.status == 200:
                return await r.json()
            await asyncio.sleep(0.02)
        raise AssertionError(f"no audit row {call_id} in {gw.org['org_slug']}")


def echo_answer(status: int = 200):  # type: ignore[no-untyped-def]
    """A responder answering ``status`` with the request's Authorization echoed in its body (raw and
    base64) and a header, and a cookie of the publisher's account: what a careless upstream does."""
    def answer(ex: Any) -> bytes:
        auth = ex.header("authorization") or ""
        body = json.dumps({"path": ex.target, "auth": auth, "b64": base64.b64encode(auth.encode()).decode(),
                           "note": f"your key {auth[7:]} is fine"}).encode()
        return http_response(status, body, [("Content-Type", "application/json"), ("X-Echo-Auth", auth),
                                             ("Set-Cookie", "session=publisher-account; Path=/")])
    return answer


@contextlib.asynccontextmanager
async def hub_pair(aiohttp_client: Any, make_app: Any, responder: Responder | None = None, *, price: int = 0,
                   max_runs: int | None = None, credits: int = 1_000_000, publisher_slug: str = "pub",
                   name: str = "search", plugins: tuple[Any, ...] = (), **settings: Any) -> AsyncIterator[HubPair]:
    """A treg (relaying to 127.0.0.0/8) with the two orgs; the publisher's tool ``search`` (base
    ``<upstream>/v1``, ``Authorization: Bearer <SECRET>``) published as ``<publisher_slug>.<name>``."""
    async with raw_upstream(responder) as up:
        client = await aiohttp_client(make_app(extra_plugins=plugins, ssrf_allow=("127.0.0.0/8",), **settings))
        try:
            pub = await open_org(client, publisher_slug, f"owner@{publisher_slug}.test")
            caller = await open_org(client, "callr", "owner@callr.test", credits=credits)
            pm = await pub.member(f"dev@{publisher_slug}.test")
            cm = await caller.member("dev@callr.test")
            sid = await pub.secret(SECRET)
            tool = await pub.tool("search", up.url + "/v1", [{"location": "header", "name": "Authorization",
                                                             "format": "Bearer {secret}", "secret_id": sid}])
            body: dict[str, Any] = {"tool_id": tool["id"], "name": name, "description": "search the publisher's index",
                                    "price_micro": price}
            if max_runs is not None:
                body["max_runs"] = max_runs
            hub = await pub.api("POST", "/api/v1/hub/tools", json=body, expect=201)
            yield HubPair(client, pub, caller, pm, cm, up, tool, hub)
        finally:
            await client.close()
