"""tool_called events: one per attempt, no parameters or bodies, a failing observer is contained."""

import json

from treg import hookimpl, membership
from treg.keys import SERVICES
from treg.testing import Events, Gateway, raw_upstream


class Broken:
    @hookimpl
    def treg_event(self, event):
        raise RuntimeError("observer bug")


async def test_tool_called_per_attempt_and_broken_observer_contained(aiohttp_client, make_app, caplog):
    rec = Events()
    client = await aiohttp_client(make_app(extra_plugins=(Broken(), rec), ssrf_allow=("127.0.0.0/8",)))
    org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
    gw = Gateway(client, org)
    async with raw_upstream() as up:
        port = up.port
        sid = await gw.secret("very-secret-value")
        await gw.tool("t", up.url, [{"location": "header", "name": "X-K", "secret_id": sid}])
        ok = await gw.call("POST", "/call/t/path?param=sensitive-param", data=b"body-bytes")
        assert ok.status == 200  # the broken observer did not break the call
        missing = await gw.call("GET", "/call/none/x")
        assert missing.status == 404
    called = [e for e in rec.seen if e.name == "tool_called"]
    assert [e.props["call_id"] for e in called] == [ok.headers["X-Treg-Call-Id"], missing.headers["X-Treg-Call-Id"]]
    first = called[0].props
    assert first["outcome"] == "ok" and first["status"] == 200 and first["tool_name"] == "t"
    assert first["provider"] == "127.0.0.1:%d" % port and first["duration_ms"] is not None
    assert called[1].props["outcome"] == "refused"
    dumped = json.dumps([e.props for e in called])
    for leak in ("sensitive-param", "body-bytes", "very-secret-value"):
        assert leak not in dumped
    assert "observer bug" in caplog.text or "failed in treg_event" in caplog.text
    await client.close()


async def test_clean_shutdown_loses_no_audit_rows(aiohttp_client, make_app):
    client = await aiohttp_client(make_app(ssrf_allow=("127.0.0.0/8",), audit_flush_ms=60_000))
    svc = client.app[SERVICES]
    org = await membership.create_org(svc, slug="acme", email="o@acme.test")
    gw = Gateway(client, org)
    async with raw_upstream() as up:
        await gw.tool("t", up.url)
        ids = [(await gw.call("GET", f"/call/t/{i}")).headers["X-Treg-Call-Id"] for i in range(5)]
    dsn = svc.db.dsn
    await client.close()  # flushes on cleanup even though the flush interval is a minute
    import psycopg2

    conn = psycopg2.connect(dsn)
    with conn.cursor() as cur:
        cur.execute("SELECT id FROM calls")
        stored = {r[0] for r in cur.fetchall()}
    conn.close()
    assert set(ids) <= stored


# -- the fields of tool_called, as docs/plugins.md lists them (issue 20 item 13) ---------------------

def _documented_fields() -> set[str]:
    """The field names of docs/plugins.md's tool_called table (its first column, ``a``, ``b`` split)."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "docs" / "plugins.md").read_text()
    table = text.split("The fields of a `tool_called` event's `props`", 1)[1].split("\n\n", 2)[1]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([a-z_]+)`", row.split("|")[1])}


async def test_the_event_carries_exactly_the_documented_fields(aiohttp_client, make_app):
    rec = Events()
    client = await aiohttp_client(make_app(extra_plugins=(rec,), ssrf_allow=("127.0.0.0/8",)))
    org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
    gw = Gateway(client, org)
    async with raw_upstream() as up:
        await gw.tool("t", up.url)
        assert (await gw.call("GET", "/call/t/x")).status == 200
    [event] = [e for e in rec.seen if e.name == "tool_called"]
    documented = _documented_fields()
    assert len(documented) >= 30  # the table was found and read
    assert set(event.props) - documented == set(), "tool_called fields docs/plugins.md does not list"
    assert documented - set(event.props) == set(), "documented tool_called fields the event lacks"
    await client.close()


async def test_the_user_agent_and_the_tag_ride_the_event(aiohttp_client, make_app):
    """Read at intake and once dropped: which client calls, and under which tag. A long User-Agent is
    cut to its first 256 characters; the signals of a plain own-tool call are empty."""
    rec = Events()
    client = await aiohttp_client(make_app(extra_plugins=(rec,), ssrf_allow=("127.0.0.0/8",)))
    org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
    gw = Gateway(client, org)
    long_ua = "agent/9 " + "z" * 1000
    async with raw_upstream() as up:
        await gw.tool("t", up.url)
        a = await gw.call("GET", "/call/t/a", headers={"User-Agent": "OpenAI/Python 1.2.3", "X-Treg-Tag": "team-a"})
        b = await gw.call("GET", "/call/t/b", headers={"User-Agent": long_ua})
        c = await gw.call("GET", "/call/none/x", headers={"User-Agent": "curl/8.5.0", "X-Treg-Tag": "ops"})
    props = {e.props["call_id"]: e.props for e in rec.seen if e.name == "tool_called"}
    first, second, refused = (props[r.headers["X-Treg-Call-Id"]] for r in (a, b, c))
    assert (first["user_agent"], first["tag"]) == ("OpenAI/Python 1.2.3", "team-a")
    assert (second["user_agent"], second["tag"]) == (long_ua[:256], None)
    assert (refused["user_agent"], refused["tag"], refused["outcome"]) == ("curl/8.5.0", "ops", "refused")
    for p in (first, second):
        assert (p["probe"], p["smoothed"], p["result_reason"], p["cache_admission"]) == (False, None, None, None)
    await client.close()
