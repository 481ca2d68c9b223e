"""``TRACE`` is answered with the request the upstream received (RFC 9110, 9.3.8), so a TRACE carrying an
injected credential would hand the caller the key treg exists to keep from it: refused before anything
is sent, ``400 trace_not_relayed``, and audited. A TRACE with no credential is relayed as any method is.

Real parts: treg on a real socket, an upstream on a raw socket that answers TRACE as servers that allow it
do (the request it received, as ``message/http``)."""

from __future__ import annotations

from treg import membership
from treg.keys import SERVICES
from treg.testing import Gateway, audit_row, http_response, raw_upstream

KEY = "sk_live_trace_3f9a0c"


def _echo(ex) -> bytes:
    return http_response(200, ex.raw, headers=[("Content-Type", "message/http")])


async def test_a_trace_that_would_carry_a_credential_is_refused_and_one_without_is_relayed(make_app, aiohttp_client):
    async with raw_upstream(_echo) as up:
        client = await aiohttp_client(make_app(ssrf_allow=("127.0.0.0/8",)))
        org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
        gw = Gateway(client, org)
        sid = await gw.secret(KEY)
        await gw.tool("keyed", up.url + "/k", [{"location": "header", "name": "Authorization", "format": "Bearer {secret}",
                                         "secret_id": sid}])
        await gw.tool("query", up.url + "/q", [{"location": "query", "name": "api_key", "secret_id": sid}])
        await gw.tool("open", up.url + "/o")
        try:
            for target in ("/call/keyed/x", "/call/query/x", f"/call/{up.url}/k/x"):
                r = await gw.call("TRACE", target)
                body = await r.json()
                assert r.status == 400 and body["error"] == "trace_not_relayed", (target, body)
                assert KEY not in await r.text()
                row = await audit_row(gw, r.headers["X-Treg-Call-Id"])
                assert (row["outcome"], row["error_code"]) == ("refused", "trace_not_relayed")
            assert up.exchanges == []  # nothing reached the upstream
            # the same tools answer every other method, and a TRACE with no credential is relayed
            assert (await gw.call("GET", "/call/keyed/x")).status == 200
            assert up.exchanges[-1].header("Authorization") == f"Bearer {KEY}"
            r = await gw.call("TRACE", "/call/open/x")
            assert r.status == 200 and (await r.read()).startswith(b"TRACE /o/x HTTP/1.1")
            assert len(up.exchanges) == 2
        finally:
            await client.close()


async def test_a_trace_asked_through_a_method_override_is_refused_when_it_would_carry_a_credential(make_app,
                                                                                                    aiohttp_client):
    """A framework that honours ``X-HTTP-Method-Override`` (or its kin, or a ``_method`` query parameter)
    answers the request as the TRACE it names: with a credential injected it is refused as a TRACE is,
    however the override is written; without one, or naming another method, it is relayed."""
    async with raw_upstream(_echo) as up:
        client = await aiohttp_client(make_app(ssrf_allow=("127.0.0.0/8",)))
        org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
        gw = Gateway(client, org)
        sid = await gw.secret(KEY)
        await gw.tool("keyed", up.url + "/k", [{"location": "header", "name": "Authorization",
                                                "format": "Bearer {secret}", "secret_id": sid}])
        await gw.tool("open", up.url + "/o")
        asks = [
            ("", {"X-HTTP-Method-Override": "TRACE"}),
            ("", {"x-http-method": "trace"}),
            ("", {"X-Method-Override": "GET, Trace"}),
            ("?_method=TRACE", {}),
            ("?a=1&_METHOD=trace", {}),
            ("?_m%65thod=%54RACE", {}),
            ("?+_method=TRACE", {}),
            ("?.method=TRACE", {}),
        ]
        try:
            for query, headers in asks:
                r = await gw.call("POST", f"/call/keyed/x{query}", headers=headers, data=b"{}")
                body = await r.json()
                assert r.status == 400 and body["error"] == "trace_not_relayed", (query, headers, body)
                assert KEY not in await r.text()
            assert up.exchanges == []  # none reached the upstream
            for query, headers in [("", {"X-HTTP-Method-Override": "PUT"}), ("?_method=PATCH", {}),
                                   ("?method=TRACE", {})]:  # another method, or a name no framework reads
                assert (await gw.call("POST", f"/call/keyed/x{query}", headers=headers, data=b"{}")).status == 200
            assert len(up.exchanges) == 3
            for query, headers in asks[:4]:  # no credential: relayed as any override is
                assert (await gw.call("POST", f"/call/open/x{query}", headers=headers, data=b"{}")).status == 200
            assert len(up.exchanges) == 7
        finally:
            await client.close()
