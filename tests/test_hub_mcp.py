"""Hub tools over MCP with the official SDK, both protocol revisions (docs/mcp.md "Hub tools"): another
org's published tool is listed on ``/mcp`` with its price (never its base URL), a ``tools/call`` of it
is a hub call (the publisher's credential injected upstream, masked in the result, the caller charged and
the publisher credited), and the org's own published tool is listed once, as its own tool."""

from __future__ import annotations

import json

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from treg import money
from treg.hub import store as hub_store
from treg.testing import check_books
from treg.testing.vendors.hub import SECRET, echo_answer, hub_pair, leaks

PRICE = 3000


def sdk(pair, token: str, mode: str):
    http = httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=30)
    return http, Client(streamable_http_client(str(pair.client.make_url("/mcp")), http_client=http), mode=mode)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_hub_tool_is_listed_with_its_price_and_called_as_a_hub_call(aiohttp_client, make_app, mode):
    async with hub_pair(aiohttp_client, make_app, echo_answer(200), price=PRICE) as pair:
        await pair.caller.tool("mine", pair.upstream.url + "/own")
        http, client = sdk(pair, pair.caller_member["token"], mode)
        async with http, client as c:
            listed = await c.list_tools()
            assert [t.name for t in listed.tools] == ["mine", "pub.search", "catalog_search", "catalog_call"]
            hub = listed.tools[1]
            assert f"{PRICE} micro-USD" in hub.description and "search the publisher's index" in hub.description
            assert hub.meta == {"treg/hub_ref": "pub.search", "treg/price_micro": PRICE}
            assert pair.upstream.url not in json.dumps(hub.model_dump(mode="json"))
            result = await c.call_tool("pub.search", {"path": "/items", "query": {"q": "boots"}})
        assert result.is_error is False
        sc = result.structured_content
        assert sc["status"] == 200 and sc["credential_tier"] == "hub" and sc["cost_micro"] == PRICE
        assert leaks(json.dumps(sc)) == [] and leaks(result.content[0].text) == []
        assert pair.upstream.exchanges[-1].header("authorization") == f"Bearer {SECRET}"
        assert pair.upstream.exchanges[-1].target == "/v1/items?q=boots"
        row = await pair.row(pair.caller, sc["call_id"])
        assert row["surface"] == "hub" and row["hub_ref"] == "pub.search"
        theirs = await pair.row(pair.publisher, sc["call_id"])
        assert theirs["hub_caller_org"] == "callr"
        svc = pair.services
        assert (await money.balance(svc, pair.caller.org["org_id"])).balance_micro == 1_000_000 - PRICE
        assert (await money.balance(svc, pair.publisher.org["org_id"])).balance_micro == PRICE
        await check_books(svc, pair.caller.org["org_id"])
        await check_books(svc, pair.publisher.org["org_id"])


async def test_the_publishers_own_tool_is_listed_once_and_a_busy_hub_tool_is_an_error_result(aiohttp_client,
                                                                                             make_app):
    async with hub_pair(aiohttp_client, make_app, hub_max_runs_per_team=1) as pair:
        http, client = sdk(pair, pair.publisher.org["token"], "legacy")
        async with http, client as c:
            names = [t.name for t in (await c.list_tools()).tools]
        assert names == ["search", "catalog_search", "catalog_call"]
        # the caller's MCP call while the publisher's one slot is taken: an error result naming hub_busy
        svc = pair.services
        await svc.hub.take(svc, "call_elsewhere", await hub_store.lookup(svc, pair.ref), pair.caller.org["org_id"])
        http, client = sdk(pair, pair.caller.org["token"], "auto")
        async with http, client as c:
            result = await c.call_tool("pub.search", {})
        assert result.is_error is True and result.structured_content["error"] == "hub_busy"
        assert result.structured_content["limit"] == 1 and pair.upstream.exchanges == []



async def test_a_ref_the_callers_own_tool_shadows_is_not_listed(aiohttp_client, make_app):
    """A tool of the caller's org named like the ref wins ``/call/<ref>`` (resolution's order), so MCP does
    not list the hub tool under another name that would run the org's own tool instead."""
    async with hub_pair(aiohttp_client, make_app, echo_answer(200), price=PRICE) as pair:
        await pair.caller.tool("pub.search", pair.upstream.url + "/own")  # the caller's own, same name
        http, client = sdk(pair, pair.caller_member["token"], "auto")
        async with http, client as c:
            listed = await c.list_tools()
        assert [t.name for t in listed.tools] == ["pub.search", "catalog_search", "catalog_call"]
        assert "treg/hub_ref" not in (listed.tools[0].meta or {})  # the one listed is the org's own
