"""What one process keeps for OAuth: the session its token requests go through, its refreshes in flight,
and the name its refresh leases carry (docs/oauth.md "Refresh").

The session is opened by :func:`setup` (an app component, ``treg.app.COMPONENTS``): one long-lived
``ClientSession`` whose connector is the vetting one the aggregator session uses
(:class:`treg.infra.dns.VettingConnector`): a token, revocation or exchange request is dialled only at
addresses the SSRF guard passed (``TREG_SSRF_ALLOW`` exempts), no cookies, no proxy from the
environment, no redirect followed. Until it opens (a CLI command, a domain test) the null session
refuses every request, so nothing is ever sent unvetted.

A field of the services (``Services.oauth``), so it sits below them, beside the other parts a process
holds; the rest of OAuth is ``treg/oauth/``.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from treg.ids import new_id
from treg.infra.upstream import NotServing

if TYPE_CHECKING:
    import aiohttp


@dataclass
class OAuthRuntime:
    #: the token endpoints' session (the null session until the component opens it)
    session: "aiohttp.ClientSession | NotServing" = field(default_factory=NotServing)
    #: connection id → this process's one refresh of it in flight (every call of the process waits on it)
    inflight: dict[str, "asyncio.Task[Any]"] = field(default_factory=dict)
    #: this process in a lease's holder column (pid: an operator reading the table sees which process)
    name: str = field(default_factory=lambda: f"{os.getpid()}:{new_id('p')[2:14]}")


async def setup(app: Any, svc: Any) -> Any:
    """Component: the token endpoints' session, closed (and the null session put back) at shutdown."""
    import aiohttp

    from treg.infra.dns import VettingConnector, VettingResolver

    connector = VettingConnector(svc.resolver) if isinstance(svc.resolver, VettingResolver) else None
    session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False,
                                    timeout=aiohttp.ClientTimeout(total=None, connect=10))
    svc.oauth.session = session

    async def close() -> None:
        svc.oauth.session = NotServing()
        for task in list(svc.oauth.inflight.values()):
            task.cancel()
        await session.close()

    return close
