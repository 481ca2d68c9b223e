"""Hub calls over real sockets, two orgs with two members each (docs/sharing.md "Hub"): the caller never
reads the publisher's credential (the raw upstream shows it injected; the answer, both audit rows and
the evidence do not), both orgs' balances move by exactly the price, redirects stay callable, both
orgs' deny rules and the SSRF guard apply, an own tool and a catalog id shadow a ref, a routed child
never resolves one."""

from __future__ import annotations

import asyncio
import json

import pytest

from treg import authentication, money
from treg.call import hub_views, resolve, service
from treg.call.state import CallState
from treg.errors import TregError
from treg.hub import store as hub_store
from treg.keys import SERVICES
from treg.oauth.errors import ConnectionNeedsReauth
from treg.settings import SecretStr
from treg.testing import (ProviderPlugin, call_input, check_books, example_provider, http_response, open_org,
                          raw_upstream)
from treg.testing.vendors.hub import SECRET, echo_answer, hub_pair, leaks

PRICE = 1234


async def _balances(pair):
    svc = pair.services
    return ((await money.balance(svc, pair.caller.org["org_id"])).balance_micro,
            (await money.balance(svc, pair.publisher.org["org_id"])).balance_micro)


async def test_a_hub_caller_never_reads_the_publishers_credential(aiohttp_client, make_app):
    async with hub_pair(aiohttp_client, make_app, echo_answer(200), price=PRICE) as pair:
        r = await pair.call("GET", "/items?q=shoes")
        body = await r.read()
        assert r.status == 200, body
        # the publisher's credential was injected: the raw bytes the upstream received carry it
        sent = pair.upstream.exchanges[-1]
        assert sent.header("authorization") == f"Bearer {SECRET}" and sent.target == "/v1/items?q=shoes"
        assert f"Bearer {SECRET}".encode() in sent.raw
        # ... and the caller's answer spells it in no way: body, headers; no cookie of the publisher's account
        assert leaks(body) == [] and leaks(json.dumps(list(r.headers.items()))) == []
        assert json.loads(body)["auth"] == "[REDACTED]" and "Set-Cookie" not in r.headers
        assert r.headers["X-Treg-Credential-Tier"] == "hub" and r.headers["X-Treg-Cost-Micro"] == str(PRICE)
        call_id = r.headers["X-Treg-Call-Id"]
        mine = await pair.row(pair.caller, call_id)
        theirs = await pair.row(pair.publisher, call_id)
        assert mine["call_id"] == theirs["call_id"] == call_id
        assert mine["surface"] == "hub" and mine["hub_ref"] == pair.ref and mine["hub_caller_org"] is None
        assert mine["member_id"] == pair.caller_member["member_id"] and mine["cost_micro"] == PRICE
        assert mine["upstream_url"] is None and mine["tool_id"] == pair.hub["id"] and mine["provider"] is None
        assert theirs["hub_caller_org"] == "callr" and theirs["member_id"] is None and theirs["cost_micro"] == 0
        assert theirs["tool_id"] == pair.tool["id"] and theirs["upstream_url"].startswith(pair.upstream.url)
        for row in (mine, theirs):
            assert leaks(json.dumps(row, default=str)) == [], row
        # the publisher's upstream host is not in the caller's row
        assert "127.0.0.1:%d" % pair.upstream.port not in json.dumps(mine, default=str)


async def test_failed_hub_call_evidence_never_holds_the_credential(aiohttp_client, make_app):
    async with hub_pair(aiohttp_client, make_app, echo_answer(401), price=PRICE) as pair:
        r = await pair.call("POST", "/items", data=b'{"q": 1}', headers={"Content-Type": "application/json"})
        body = await r.read()
        assert r.status == 401 and leaks(body) == [] and r.headers["X-Treg-Cost-Micro"] == "0"
        call_id = r.headers["X-Treg-Call-Id"]
        mine = await pair.row(pair.caller, call_id)
        theirs = await pair.row(pair.publisher, call_id)
        assert mine["outcome"] == theirs["outcome"] == "upstream_error"
        # the caller's evidence is what it sent to treg; the publisher's is what the relay sent, redacted
        assert mine["error_request"]["url"] == f"/call/{pair.ref}/items"
        assert mine["error_request"]["body"] == '{"q": 1}'
        assert all(h[0].lower() != "authorization" for h in mine["error_request"]["headers"])
        assert theirs["error_request"]["url"].startswith(pair.upstream.url + "/v1/items")
        assert ["Authorization", "[REDACTED]"] in theirs["error_request"]["headers"]
        assert mine["error_response"]["status"] == 401
        for row in (mine, theirs):
            assert leaks(json.dumps(row, default=str)) == [], row
        # a plain member of either org does not see the other's row, nor the publisher's (no member on it)
        r = await pair.caller.call("GET", f"/api/v1/calls/{call_id}", as_=pair.caller_member["headers"])
        assert (await r.json())["call_id"] == call_id
        r = await pair.publisher.call("GET", f"/api/v1/calls/{call_id}", as_=pair.publisher_member["headers"])
        assert r.status == 404
        assert (await money.balance(pair.services, pair.caller.org["org_id"])).balance_micro == 1_000_000


async def test_both_balances_move_by_exactly_the_price(aiohttp_client, make_app):
    statuses = iter([200, 200, 500, 200, 404])

    def answer(ex):
        return http_response(next(statuses, 200), b'{"ok": true}', [("Content-Type", "application/json")])

    async with hub_pair(aiohttp_client, make_app, answer, price=PRICE) as pair:
        before = await _balances(pair)
        got = []
        for _ in range(5):
            r = await pair.call("GET", "/q")
            await r.read()
            got.append((r.status, int(r.headers["X-Treg-Cost-Micro"])))
        assert got == [(200, PRICE), (200, PRICE), (500, 0), (200, PRICE), (404, 0)]
        after = await _balances(pair)
        assert before[0] - after[0] == 3 * PRICE and after[1] - before[1] == 3 * PRICE
        svc = pair.services
        caller_books = await check_books(svc, pair.caller.org["org_id"])
        publisher_books = await check_books(svc, pair.publisher.org["org_id"])
        assert caller_books["settled"] == 3 * PRICE and caller_books["open"] == 0
        assert publisher_books["granted"] == 3 * PRICE and publisher_books["settled"] == 0
        grants = await pair.publisher.api("GET", "/api/v1/credits", expect=200)
        earnings = [g for g in grants["grants"] if g["kind"] == "earning"]
        assert len(earnings) == 3 and {g["amount_micro"] for g in earnings} == {PRICE}
        # an org calling its own ref is not charged, and writes one row, its own
        r = await pair.publisher.call("GET", f"/call/{pair.ref}/q", as_=pair.publisher_member["headers"])
        assert r.status == 200 and r.headers["X-Treg-Cost-Micro"] == "0"
        row = await pair.row(pair.publisher, r.headers["X-Treg-Call-Id"])
        assert row["hub_ref"] == pair.ref and row["hub_caller_org"] == "pub" and row["cost_micro"] == 0
        assert await _balances(pair) == after


async def test_an_org_without_credit_is_refused_before_the_upstream(aiohttp_client, make_app):
    async with hub_pair(aiohttp_client, make_app, price=PRICE, credits=PRICE - 1) as pair:
        r = await pair.call("GET", "/x")
        assert r.status == 402 and (await r.json())["error"] == "insufficient_balance"
        assert pair.upstream.exchanges == []
        await pair.services.hub.drain()  # its slot, given back off the answer's path
        async with pair.services.db.tx() as tx:
            assert await tx.scalar("SELECT count(*) FROM hub_runs") == 0


async def test_a_retry_with_the_same_key_is_charged_once_and_the_upstream_never_sees_the_label(aiohttp_client,
                                                                                               make_app):
    async with hub_pair(aiohttp_client, make_app, echo_answer(200), price=PRICE) as pair:
        before = await _balances(pair)
        first = await pair.call("POST", "/orders", data=b"{}", headers={"Idempotency-Key": "order-7"})
        body = await first.read()
        again = await pair.call("POST", "/orders", data=b"{}", headers={"Idempotency-Key": "order-7"})
        assert again.status == first.status == 200 and await again.read() == body
        assert again.headers["X-Treg-Idempotent-Replay"] == "true" and again.headers["X-Treg-Cost-Micro"] == "0"
        assert len(pair.upstream.exchanges) == 1
        sent = pair.upstream.exchanges[0].header("idempotency-key")
        assert sent and sent != "order-7" and len(sent) == 64
        after = await _balances(pair)
        assert before[0] - after[0] == PRICE and after[1] - before[1] == PRICE


async def test_redirects_stay_callable_by_the_caller_and_never_name_the_publishers_api(aiohttp_client, make_app):
    async def answer(ex):
        if ex.target.startswith("/v1/start"):
            return http_response(302, b"", [("Location", f"{ex_base[0]}/v1/next?page=2")])
        if ex.target.startswith("/v1/away"):
            return http_response(302, b"", [("Location", "http://elsewhere.test/landing")])
        return http_response(200, json.dumps({"at": ex.target, "auth": ex.header("authorization")}).encode())

    ex_base: list[str] = []
    async with hub_pair(aiohttp_client, make_app, answer) as pair:
        ex_base.append(pair.upstream.url)
        r = await pair.call("GET", "/start", allow_redirects=False)
        assert r.status == 302
        assert r.headers["Location"] == f"/call/{pair.ref}/next?page=2"
        assert "X-Treg-Upstream-Location" not in r.headers
        # the client follows it: a hub call again, the credential injected again, masked again
        r = await pair.caller.call("GET", r.headers["Location"], as_=pair.caller_member["headers"])
        assert r.status == 200 and json.loads(await r.read())["at"] == "/v1/next?page=2"
        assert pair.upstream.exchanges[-1].header("authorization") == f"Bearer {SECRET}"
        r = await pair.call("GET", "/away", allow_redirects=False)
        assert r.headers["Location"].startswith("/redirect/") and "X-Treg-Upstream-Location" not in r.headers
        assert str(pair.upstream.port) not in json.dumps(list(r.headers.items()))


async def test_both_orgs_deny_rules_apply_and_neither_names_the_publishers_host(aiohttp_client, make_app):
    async with hub_pair(aiohttp_client, make_app) as pair:
        # the publisher's rule: the caller learns that it was refused, not the rule
        await pair.publisher.api("POST", "/api/v1/deny-rules", json={"host": "127.0.0.1", "path": "/v1/admin",
                                                                      "reason": "internal only"}, expect=201)
        r = await pair.call("GET", "/admin/users")
        body = await r.json()
        assert r.status == 403 and body["error"] == "denied_by_rule" and "rule" not in body
        assert "127.0.0.1" not in body["detail"] and "internal only" not in body["detail"]
        # the caller's own rule on the ref (as if it were a host), and on where the call really goes
        rule = await pair.caller.api("POST", "/api/v1/deny-rules", json={"host": pair.ref, "method": "DELETE"},
                                     expect=201)
        r = await pair.call("DELETE", "/items/1")
        assert r.status == 403 and (await r.json())["rule"]["id"] == rule["id"]
        await pair.caller.api("POST", "/api/v1/deny-rules", json={"host": "127.0.0.1", "path": "/v1/items"},
                              expect=201)
        r = await pair.call("GET", "/items/1")
        body = await r.json()
        assert r.status == 403 and body["error"] == "denied_by_rule" and "127.0.0.1" not in body["detail"]
        assert pair.upstream.exchanges == []
        r = await pair.call("GET", "/public")
        assert r.status == 200


async def test_the_ssrf_guard_holds_for_the_publishers_tool(aiohttp_client, make_app, fake_dns):
    fake_dns.records["pub-api.test"] = [("127.0.0.1", 0)]
    async with hub_pair(aiohttp_client, make_app) as pair:
        tool = await pair.publisher.tool("inner", f"http://pub-api.test:{pair.upstream.port}/v1")
        hub = await pair.publisher.api("POST", "/api/v1/hub/tools", json={
            "tool_id": tool["id"], "name": "inner", "description": "x"}, expect=201)
        r = await pair.caller.call("GET", f"/call/{hub['ref']}/a", as_=pair.caller_member["headers"])
        assert r.status == 200
        fake_dns.records["pub-api.test"] = [("10.20.30.40", 0)]  # rebound inside
        r = await pair.caller.call("GET", f"/call/{hub['ref']}/a", as_=pair.caller_member["headers"])
        body = await r.json()
        assert r.status == 502 and body["error"] == "ssrf_refused"
        assert "pub-api.test" not in json.dumps(body) and "10.20.30.40" not in json.dumps(body)
        assert len(pair.upstream.exchanges) == 1


async def test_an_own_tool_shadows_a_ref_and_unpublishing_removes_it(aiohttp_client, make_app):
    async with hub_pair(aiohttp_client, make_app) as pair, raw_upstream() as own:
        await pair.caller.tool(pair.ref, own.url + "/own")
        r = await pair.call("GET", "/x")
        assert r.status == 200 and r.headers.get("X-Treg-Credential-Tier") is None
        assert own.exchanges[-1].target == "/own/x" and pair.upstream.exchanges == []
        # another org's member still reaches the hub tool
        third = await open_org(pair.client, "third", "o@third.test")
        r = await third.call("GET", f"/call/{pair.ref}/x")
        assert r.status == 200 and r.headers["X-Treg-Credential-Tier"] == "hub"
        await pair.publisher.api("DELETE", f"/api/v1/hub/tools/{pair.hub['id']}", expect=204)
        r = await third.call("GET", f"/call/{pair.ref}/x")
        assert r.status == 404 and (await r.json())["error"] == "tool_not_found"


async def test_a_catalog_id_shadows_a_ref(aiohttp_client, make_app):
    async with raw_upstream() as vendor:
        # published while no catalog named acme.search; a plugin that does is installed afterwards
        async with hub_pair(aiohttp_client, make_app, publisher_slug="acme", name="search") as pair:
            assert pair.ref == "acme.search"
            r = await pair.call("GET", "?q=1")
            assert r.status == 200 and pair.upstream.exchanges
            caller_token = pair.caller.org["token"]
            tool_id = pair.tool["id"]
        plugin = ProviderPlugin([example_provider(vendor.url)])
        client = await aiohttp_client(make_app(extra_plugins=(plugin,), ssrf_allow=("127.0.0.0/8",),
                                               platform={"TREG_PLATFORM_KEY_ACME": SecretStr("pk")}))
        try:
            r = await client.get("/call/acme.search?q=1", headers={"X-Treg-Token": caller_token})
            await r.read()
            assert r.status == 200 and r.headers["X-Treg-Credential-Tier"] == "platform"
            assert vendor.exchanges[-1].target == "/search?q=1"
            # and the ref can no longer be published again: 409
            svc = client.app[SERVICES]
            async with svc.db.tx() as tx:
                await tx.execute("DELETE FROM hub_tools")
            r = await client.post("/api/v1/hub/tools", headers={"X-Treg-Token": pair.publisher.org["token"]},
                                  json={"tool_id": tool_id, "name": "search", "description": ""})
            assert r.status == 409 and (await r.json())["error"] == "hub_ref_taken"
        finally:
            await client.close()


async def test_a_routed_child_or_a_followed_redirect_never_resolves_a_ref(aiohttp_client, make_app):
    async with hub_pair(aiohttp_client, make_app) as pair:
        svc = pair.services
        token = pair.caller.org["token"]
        out = await service.execute(svc, call_input(f"{pair.ref}/x", token=token))
        out.finish(0, None)
        assert out.status == 200
        for extra in ({"deferred": object()}, {"parent_call_id": "call_parent"}):
            with pytest.raises(TregError) as err:
                await service.execute(svc, call_input(f"{pair.ref}/x", token=token, **extra))
            assert err.value.code == "tool_not_found", extra
        assert len(pair.upstream.exchanges) == 1
        assert await hub_store.lookup(svc, pair.ref) is not None


async def test_a_publishers_missing_secret_is_named_by_code_only(aiohttp_client, make_app):
    async with hub_pair(aiohttp_client, make_app) as pair:
        async with pair.services.db.tx() as tx:  # the secret gone under the tool (as a broken restore leaves it)
            await tx.execute("DELETE FROM secrets")
            await tx.execute("SELECT pg_notify('treg_changes', %(p)s)",
                             {"p": f"secrets:{pair.publisher.org['org_id']}"})
        await asyncio.sleep(0.3)
        r = await pair.call("GET", "/x")
        body = await r.json()
        assert r.status == 502 and body["error"] == "secret_missing" and body["blame"] == "org_connection"
        assert "publishing org" in body["detail"]


async def test_members_of_both_orgs_see_the_hub_and_only_managers_publish(aiohttp_client, make_app):
    async with hub_pair(aiohttp_client, make_app, price=PRICE, max_runs=3) as pair:
        listed = await pair.caller.api("GET", "/api/v1/hub/tools", as_=pair.caller_member["headers"], expect=200)
        (entry,) = listed["tools"]
        assert entry == {**entry, "ref": "pub.search", "price_micro": PRICE, "max_runs": 3, "own": False,
                         "description": "search the publisher's index"}
        text = json.dumps(listed)
        assert "tool_id" not in entry and pair.upstream.url not in text and "bindings" not in text
        assert "127.0.0.1" not in text and leaks(text) == []
        own = await pair.publisher.api("GET", "/api/v1/hub/tools", as_=pair.publisher_member["headers"], expect=200)
        assert own["tools"][0]["own"] is True and own["tools"][0]["tool_id"] == pair.tool["id"]
        body = {"tool_id": pair.tool["id"], "name": "other", "description": "d"}
        r = await pair.publisher.client.post("/api/v1/hub/tools", json=body, headers=pair.publisher_member["headers"])
        assert r.status == 403 and (await r.json())["error"] == "forbidden_role"
        # another org's tool id, an unknown field, a bad price: refused with the contract's body
        for bad, code in (({**body, "tool_id": pair.tool["id"]}, "tool_not_found"),
                          ({**body, "base_url": "x"}, "invalid_field"),
                          ({**body, "price_micro": -1}, "invalid_price"),
                          ({**body, "max_runs": 0}, "invalid_max_runs"),
                          ({**body, "name": "a/b"}, "invalid_name")):
            r = await pair.caller.client.post("/api/v1/hub/tools", json=bad, headers=pair.caller.owner)
            assert (await r.json())["error"] == code, (bad, await r.text())
        r = await pair.publisher.client.post("/api/v1/hub/tools", json={**body, "name": "search"},
                                             headers=pair.publisher.owner)
        assert r.status == 409 and (await r.json())["error"] == "hub_ref_taken"
        r = await pair.caller.client.delete(f"/api/v1/hub/tools/{pair.hub['id']}", headers=pair.caller.owner)
        assert r.status == 404 and (await r.json())["error"] == "hub_tool_not_found"
        # the publisher's account exists from the moment it published: a settled call has a row to credit
        async with pair.services.db.tx() as tx:
            assert await tx.scalar("SELECT count(*) FROM org_balances WHERE org_id = %(o)s",
                                   {"o": pair.publisher.org["org_id"]}) == 1


async def test_a_publishers_connection_needing_consent_never_hands_the_caller_its_link(aiohttp_client, make_app):
    async with hub_pair(aiohttp_client, make_app) as pair:
        svc = pair.services
        inp = call_input(f"{pair.ref}/x", token=pair.caller.org["token"])
        state = CallState(inp)
        state.ident = await authentication.authenticate(svc, pair.caller.org["token"], None)
        state.target = await resolve.resolve_target(svc, state.ident, state)
        link = "http://127.0.0.1/oauth/connect/opaque-link-of-the-publisher"
        exc = ConnectionNeedsReauth(f"connection conn_1 of {pair.upstream.url} needs consent", connect_url=link)
        hub_views.scrub_error(exc, state.ident, state.target, state.masked)
        body = json.dumps(exc.body())
        assert link not in body and "connect_url" not in body and pair.upstream.url not in body
        assert exc.code == "connection_needs_reauth" and pair.ref in exc.detail
        # the org's own ref: its own connection, its own link (nothing to hide from itself)
        own = CallState(inp)
        own.ident = await authentication.authenticate(svc, pair.publisher.org["token"], None)
        own.target = state.target
        mine = ConnectionNeedsReauth("needs consent", connect_url=link)
        hub_views.scrub_error(mine, own.ident, own.target, own.masked)
        assert mine.body()["connect_url"] == link


async def test_a_compressed_answer_is_checked_decoded_and_one_treg_cannot_read_is_withheld(aiohttp_client,
                                                                                          make_app):
    import gzip

    def answer(ex):
        kind = ex.target.rsplit("/", 1)[-1]
        if kind == "echo":  # the key inside a gzip body: it must be read decoded to be masked
            body = gzip.compress(json.dumps({"auth": ex.header("authorization")}).encode())
            return http_response(200, body, [("Content-Encoding", "gzip"), ("Content-Type", "application/json")])
        if kind == "plain":  # nothing to mask: relayed as it came, coding and all
            return http_response(200, gzip.compress(b'{"fine": true}'), [("Content-Encoding", "gzip")])
        return http_response(200, b"\x00opaque", [("Content-Encoding", "x-secret-coding")])

    async with hub_pair(aiohttp_client, make_app, answer, price=PRICE) as pair:
        r = await pair.call("GET", "/echo", headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
        raw = await r.read()
        assert r.status == 200 and "Content-Encoding" not in r.headers and leaks(raw) == []
        assert json.loads(raw) == {"auth": "[REDACTED]"} and r.headers["Content-Length"] == str(len(raw))
        r = await pair.call("GET", "/plain", headers={"Accept-Encoding": "gzip"}, auto_decompress=False)
        assert r.headers["Content-Encoding"] == "gzip" and gzip.decompress(await r.read()) == b'{"fine": true}'
        before = await _balances(pair)
        r = await pair.call("GET", "/odd", headers={"Accept-Encoding": "x-secret-coding"})
        body = await r.json()
        assert r.status == 502 and body["error"] == "hub_answer_unreadable" and r.headers["X-Treg-Cost-Micro"] == "0"
        assert await _balances(pair) == before


@pytest.mark.parametrize("latin1", [False, True], ids=["utf8-head", "latin1-head"])
async def test_the_status_lines_reason_phrase_never_carries_the_publishers_credential(aiohttp_client, make_app,
                                                                                     latin1):
    """The reason phrase is the upstream's free text too: one echoing the Authorization it got must not hand
    it to another org's caller (in either of the edge's ways of writing a head: aiohttp's, and the raw one
    a latin-1 header value needs)."""
    def answer(ex):
        auth = ex.header("authorization") or ""
        head = http_response(200, b'{"ok": true}', [("Content-Type", "application/json")], reason=f"OK {auth}")
        if latin1:  # a header that is not UTF-8: the head is written from its own bytes (treg/web/call.py)
            head = head.replace(b"\r\n\r\n", b"\r\nX-Note: caf\xe9\r\n\r\n", 1)
        return head

    async with hub_pair(aiohttp_client, make_app, answer, price=PRICE) as pair:
        host, port = pair.client.server.host, pair.client.server.port
        reader, writer = await asyncio.open_connection(host, port)
        token = pair.caller_member["headers"]["X-Treg-Token"]
        writer.write(f"GET /call/{pair.ref}/items HTTP/1.1\r\nHost: x\r\nX-Treg-Token: {token}\r\n"
                     "Connection: close\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        status_line, _, rest = raw.partition(b"\r\n")
        assert status_line == b"HTTP/1.1 200 OK", status_line
        assert leaks(raw.decode("latin-1")) == [] and (b"caf\xe9" in rest) == latin1
        # the publisher calling its own ref is its own tool's call: relayed as it came
        r = await pair.publisher.call("GET", f"/call/{pair.ref}/items")
        assert r.status == 200 and r.reason.startswith("OK Bearer ")
