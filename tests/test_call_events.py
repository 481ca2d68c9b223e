"""tool_called events: one per attempt, no parameters or bodies, a failing observer is contained."""

import json

from treg import hookimpl, tenancy
from treg.keys import SERVICES
from treg.testing import Events, Gateway, raw_upstream


class Broken:
    @hookimpl
    def treg_event(self, event):
        raise RuntimeError("observer bug")


async def test_tool_called_per_attempt_and_broken_observer_contained(aiohttp_client, make_app, caplog):
    rec = Events()
    client = await aiohttp_client(make_app(extra_plugins=(Broken(), rec), ssrf_allow=("127.0.0.0/8",)))
    org = await tenancy.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
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
    org = await tenancy.create_org(svc, slug="acme", email="o@acme.test")
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
