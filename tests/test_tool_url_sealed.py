"""A tool base URL's user-info is a credential: encrypted at rest (``tools.base_url`` keeps it masked,
``base_url_sealed`` holds the sealed URL), never read back, still sent (api.md "Hosts": a base URL may
carry user-info). Over a real relay to a raw-socket upstream."""

from __future__ import annotations

import json

from sqlalchemy import select, update

from treg import tool_urls
from treg.infra.schema import tools
from treg.keys import SERVICES

PW = "pw-9137-sealed"
BASIC = "Basic c3ZjOnB3LTkxMzctc2VhbGVk"  # base64("svc:pw-9137-sealed")


def _svc(gateway):
    return gateway.client.app[SERVICES]


async def _row(gateway, tool_id: str) -> dict:
    async with _svc(gateway).db.tx() as tx:
        row = await tx.fetch_one(select(tools).where(tools.c.id == tool_id))
    assert row is not None
    return dict(row)


async def test_user_info_is_sealed_at_rest_and_still_sent(gateway, up):
    t = up.url.removeprefix("http://")
    tool = await gateway.tool("basic", f"http://svc:{PW}@{t}/v1")
    assert tool["base_url"] == f"http://[REDACTED]@{t}/v1"
    row = await _row(gateway, tool["id"])
    assert row["base_url"] == f"http://[REDACTED]@{t}/v1"
    sealed = bytes(row["base_url_sealed"])
    assert PW.encode() not in sealed and b"svc:" not in sealed
    assert PW not in json.dumps({k: v for k, v in row.items() if k != "base_url_sealed"}, default=str)
    r = await gateway.raw("GET", "/call/basic/things")
    assert r.status == 200
    assert up.last.header("Authorization") == BASIC
    assert up.last.target == "/v1/things"


async def test_the_masked_url_sent_back_keeps_the_credential(gateway, up):
    """An edit form shows the masked URL; saving it unchanged must not seal "[REDACTED]" as user-info."""
    t = up.url.removeprefix("http://")
    tool = await gateway.tool("basic", f"http://svc:{PW}@{t}/v1")
    await gateway.api("PATCH", f"/api/v1/tools/{tool['id']}", json={"base_url": tool["base_url"], "name": "b2"},
                      expect=200)
    r = await gateway.raw("GET", "/call/b2/x")
    assert r.status == 200 and up.last.header("Authorization") == BASIC
    # a new URL without user-info drops the sealed one
    await gateway.api("PATCH", f"/api/v1/tools/{tool['id']}", json={"base_url": f"http://{t}/v2"}, expect=200)
    row = await _row(gateway, tool["id"])
    assert row["base_url_sealed"] is None and row["base_url"] == f"http://{t}/v2"
    r = await gateway.raw("GET", "/call/b2/x")
    assert r.status == 200 and up.last.header("Authorization") is None


async def test_an_ambiguous_passthrough_lists_candidates_masked(gateway, up):
    """Two tools dialling one host equally well: the 409 names both, and a member reading it must not
    learn the other tool's user-info."""
    t = up.url.removeprefix("http://")
    await gateway.tool("one", f"http://svc:{PW}@{t}/v1")
    await gateway.tool("two", f"http://{t}/v1")
    r = await gateway.call("GET", f"/call/http://{t}/v1/x")
    assert r.status == 409
    body = await r.json()
    assert body["error"] == "ambiguous_tool"
    assert PW not in json.dumps(body)
    assert {c["base_url"] for c in body["candidates"]} == {f"http://[REDACTED]@{t}/v1", f"http://{t}/v1"}


async def test_a_row_written_before_sealing_is_sealed_at_startup(gateway, up):
    t = up.url.removeprefix("http://")
    tool = await gateway.tool("legacy", f"http://{t}/v1")
    svc = _svc(gateway)
    async with svc.db.tx() as tx:  # as an older treg stored it: in plain text
        await tx.execute(update(tools).where(tools.c.id == tool["id"]).values(base_url=f"http://svc:{PW}@{t}/v1"))
    assert await tool_urls.seal_legacy(svc) == 1
    row = await _row(gateway, tool["id"])
    assert row["base_url"] == f"http://[REDACTED]@{t}/v1" and row["base_url_sealed"] is not None
    assert await tool_urls.seal_legacy(svc) == 0  # once
    r = await gateway.raw("GET", "/call/legacy/x")
    assert r.status == 200 and up.last.header("Authorization") == BASIC
