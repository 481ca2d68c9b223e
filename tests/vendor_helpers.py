"""Test helpers for calls to fake vendors (catalog providers on a raw 127.0.0.1 upstream): the gateway
set up for them with credits, a usage-priced spooled provider, and a count of hold closes."""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator, Mapping

from treg import money, tenancy
from treg.keys import SERVICES
from treg.settings import SecretStr
from treg.testing import Gateway, ProviderPlugin


def media_provider(base_url: str) -> dict[str, Any]:
    """``gem.generate``: a usage-priced answer (2 micro a token), spooled, keyed by ``X-Goog-Api-Key``."""
    return {"id": "gem", "base_url": base_url, "auth": [{"location": "header", "name": "X-Goog-Api-Key"}],
            "endpoints": [{"id": "gem.generate", "method": "POST", "path": "/generate", "params": [],
                           "price": {"usage": [{"path": "usageMetadata.totalTokenCount", "micro_per_unit": 2}],
                                     "estimate_micro": 50_000},
                           "spooled_response": True}]}


@contextlib.asynccontextmanager
async def vendor_gateway(aiohttp_client: Any, make_app: Any, providers: list[dict[str, Any]], *,
                         platform: Mapping[str, str], plugins: tuple[Any, ...] = (), slug: str = "v",
                         credits: int = 1_000_000, **settings: Any) -> AsyncIterator[Gateway]:
    """A gateway serving ``providers`` (platform keys ``platform``, env name → value) beside ``plugins``,
    relaying to 127.0.0.0/8, with org ``slug`` holding ``credits``; closed on exit."""
    app = make_app(extra_plugins=(ProviderPlugin(providers), *plugins), ssrf_allow=("127.0.0.0/8",),
                   platform={name: SecretStr(value) for name, value in platform.items()}, **settings)
    client = await aiohttp_client(app)
    try:
        org = await tenancy.create_org(client.app[SERVICES], slug=slug, email=f"{slug}@{slug}.test")
        gw = Gateway(client, org)
        if credits:
            await money.grant(gw.services, org_id=org["org_id"], amount_micro=credits, actor="t")
        yield gw
    finally:
        await client.close()


def count_hold_closes(monkeypatch: Any) -> list[tuple[str, str]]:
    """Every effective close of a hold (a settle or release that changed it), as (kind, call id)."""
    seen: list[tuple[str, str]] = []
    settle, release = money.settle, money.release

    async def counted_settle(svc: Any, call_id: str, observed: Any) -> bool:
        ok = await settle(svc, call_id, observed)
        if ok:
            seen.append(("settle", call_id))
        return ok

    async def counted_release(svc: Any, call_id: str) -> bool:
        ok = await release(svc, call_id)
        if ok:
            seen.append(("release", call_id))
        return ok

    monkeypatch.setattr(money, "settle", counted_settle)
    monkeypatch.setattr(money, "release", counted_release)
    return seen
