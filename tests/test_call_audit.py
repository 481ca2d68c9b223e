"""Audit rows for every attempt, failed-call evidence (redacted, truncated, managers only), retention."""

import json

import pytest

from treg.call.audit import prune_evidence
from treg.call_record import CallRecord
from treg.testing import http_response, raw_upstream

SECRET = "sk_live_TOPSECRET_9f8e7d"


def _echo_key(ex):
    # an upstream that echoes the key back in its error body and a header
    body = json.dumps({"error": "bad key", "got": ex.header("Authorization"), "pad": "x" * 20000}).encode()
    return http_response(401, body, [("Content-Type", "application/json"), ("WWW-Authenticate", ex.header("Authorization"))],
                         reason="Unauthorized")


@pytest.fixture
async def tool(gateway):
    async with raw_upstream(_echo_key) as up:
        sid = await gateway.secret(SECRET)
        await gateway.tool("t", up.url, [{"location": "header", "name": "Authorization", "format": "Bearer {secret}",
                                          "secret_id": sid},
                                         {"location": "query", "name": "api_key", "secret_id": sid}])
        yield gateway, up


async def test_failed_call_keeps_redacted_evidence(tool):
    gateway, up = tool
    r = await gateway.call("POST", "/call/t/things?page=2&token=callers-own", data=b'{"q": 1}',
                           headers={"Content-Type": "application/json", "Cookie": "sid=abc"})
    assert r.status == 401
    raw = await r.read()
    assert SECRET.encode() in raw  # the caller gets the upstream's answer untouched
    assert "X-Treg-Error" not in r.headers
    detail = await gateway.api("GET", f"/api/v1/calls/{r.headers['X-Treg-Call-Id']}", expect=200)
    assert detail["outcome"] == "upstream_error" and detail["status"] == 401 and detail["blame"] == "upstream"
    stored = json.dumps(detail)
    assert SECRET not in stored  # masked wherever it appears
    req, resp = detail["error_request"], detail["error_response"]
    assert req["method"] == "POST" and "page=2" in req["url"] and "callers-own" not in req["url"]
    assert req["body"] == '{"q": 1}' and req["body_truncated"] is False
    headers = dict((k.lower(), v) for k, v in req["headers"])
    assert headers["authorization"] == "[REDACTED]" and headers["cookie"] == "[REDACTED]"
    assert resp["status"] == 401 and resp["body_truncated"] is True
    assert len(resp["body"]) <= 8 * 1024 and "[REDACTED]" in resp["body"]
    assert dict((k.lower(), v) for k, v in resp["headers"])["www-authenticate"] == "[REDACTED]"


async def test_success_keeps_no_content(tool):
    gateway, up = tool
    up.responder = lambda ex: http_response(200, b"fine")
    r = await gateway.call("GET", "/call/t/ok")
    assert r.status == 200 and await r.read() == b"fine"
    detail = await gateway.api("GET", f"/api/v1/calls/{r.headers['X-Treg-Call-Id']}", expect=200)
    assert detail["outcome"] == "ok" and detail["error_request"] is None and detail["error_response"] is None
    assert detail["response_bytes"] == 4 and detail["tool_name"] == "t" and detail["duration_ms"] is not None


async def test_members_see_own_calls_and_no_evidence(tool):
    gateway, up = tool
    m = await gateway.member("m@acme.test")
    r_owner = await gateway.call("GET", "/call/t/a")
    r_member = await gateway.call("GET", "/call/t/b", as_=m["headers"])
    mine = await gateway.calls(as_=m["headers"])
    assert [c["call_id"] for c in mine] == [r_member.headers["X-Treg-Call-Id"]]
    all_ids = {c["call_id"] for c in await gateway.calls()}
    assert {r_owner.headers["X-Treg-Call-Id"], r_member.headers["X-Treg-Call-Id"]} <= all_ids
    detail = await gateway.api("GET", f"/api/v1/calls/{r_member.headers['X-Treg-Call-Id']}", as_=m["headers"],
                               expect=200)
    assert "error_request" not in detail and "error_response" not in detail
    await gateway.api("GET", f"/api/v1/calls/{r_owner.headers['X-Treg-Call-Id']}", as_=m["headers"], expect=404)


async def test_refusals_recorded_and_401_not(gateway):
    r = await gateway.call("GET", "/call/missing/x")
    assert r.status == 404
    r401 = await gateway.client.get("/call/missing/x", headers={"X-Treg-Token": "treg_wrong"})
    assert r401.status == 401 and r401.headers["X-Treg-Call-Id"]
    calls = await gateway.calls()
    assert [c["call_id"] for c in calls] == [r.headers["X-Treg-Call-Id"]]
    assert calls[0]["outcome"] == "refused" and calls[0]["status"] == 404


async def test_unreachable_upstream_is_502_with_evidence(gateway):
    await gateway.tool("dead", "http://127.0.0.1:9/")  # discard port: nothing listens
    r = await gateway.call("GET", "/call/dead/x")
    body = await r.json()
    assert r.status == 502 and r.headers["X-Treg-Error"] == "1" and body["blame"] == "upstream"
    detail = await gateway.api("GET", f"/api/v1/calls/{r.headers['X-Treg-Call-Id']}", expect=200)
    assert detail["outcome"] == "gateway_failed" and detail["error_response"]["status"] == 502


async def test_large_or_chunked_upload_keeps_only_query(tool):
    gateway, up = tool
    big = b"a" * (70 * 1024)
    r = await gateway.call("POST", "/call/t/up?x=1", data=big)
    assert r.status == 401
    detail = await gateway.api("GET", f"/api/v1/calls/{r.headers['X-Treg-Call-Id']}", expect=200)
    assert detail["error_request"]["body"] is None and detail["error_request"]["body_truncated"] is True
    assert "x=1" in detail["error_request"]["url"]
    assert up.last.body == big


async def test_retention_prunes_old_evidence(tool):
    gateway, up = tool
    r = await gateway.call("GET", "/call/t/x")
    await gateway.calls()  # flushes the audit writer
    svc = gateway.services
    async with svc.db.tx() as tx:
        await tx.execute("UPDATE calls SET created_at = now() - interval '40 days'")
    assert await prune_evidence(svc) == 1
    detail = await gateway.api("GET", f"/api/v1/calls/{r.headers['X-Treg-Call-Id']}", expect=200)
    assert detail["error_request"] is None and detail["outcome"] == "upstream_error"


async def test_text_postgresql_cannot_store_loses_no_rows(tool):
    """A NUL in an upstream's error body (and a lone surrogate, which no request line can carry but a
    plugin's text might) reach the audit batch as text JSONB refuses; stored with U+FFFD, and the rows
    beside them in the batch too."""
    gateway, up = tool
    up.responder = lambda ex: http_response(400, b'{"error": "bad\x00byte"}', [("Content-Type", "application/json")])
    nul = await gateway.call("GET", "/call/t/nul")
    assert nul.status == 400 and await nul.read() == b'{"error": "bad\x00byte"}'  # the caller's bytes untouched
    fine = await gateway.call("GET", "/call/missing/y")
    org_id = gateway.org["org_id"]
    gateway.services.audit.record(CallRecord(id="call_surrogate", org_id=org_id, member_id=None,
                                                       surface="call", method="GET", target="a\ud800b\\u0000",
                                                       outcome="refused"))
    calls = {c["call_id"]: c for c in await gateway.calls()}
    assert {nul.headers["X-Treg-Call-Id"], fine.headers["X-Treg-Call-Id"], "call_surrogate"} <= set(calls)
    detail = await gateway.api("GET", f"/api/v1/calls/{nul.headers['X-Treg-Call-Id']}", expect=200)
    assert detail["error_response"]["body"] == '{"error": "bad\ufffdbyte"}'
    assert calls["call_surrogate"]["target"] == "a\ufffdb\\u0000"  # an escaped backslash-u stays as it was


def test_record_fills_every_column_from_its_source():
    """CallState.record builds the row positionally (it runs on every call): each column must come
    from its own source, checked by name."""
    from types import SimpleNamespace

    from treg.bindings import Binding
    from treg.call.service import CallState
    from treg.call.types import CallInput

    inp = CallInput(call_id="call_1", surface="call", method="POST", rest="t/x", raw_query="", headers=(),
                    token="tok", org_hint=None, body=None, content_length=None, tag="tag-1",
                    parent_call_id="call_0", user_agent="sdk/1.0 " + "x" * 300)
    state = CallState(inp)
    state.ident = SimpleNamespace(org_id="org_1", member_id="mem_1", scope="demo")
    state.target = SimpleNamespace(upstream_url="https://api.example/x?key=K", provider="api.example",
                                   endpoint_id="ep_1", credential_tier="tool", hub=None,
                                   tool=SimpleNamespace(id="tool_1", name="t"),
                                   bindings=(Binding("header", "X-Key", secret_id="sec_1"),
                                             Binding("header", "Authorization", connection_id="conn_1")))
    state.cost_micro, state.hold_state, state.ttfb_ms, state.kind = 7, "settled", 3, "async_poll"
    state.result_state, state.cache_state = "miss", "stored"
    state.result_reason, state.cache_admission = "miss_rule", "result_miss"
    state.capacity_probe, state.smoothed = object(), ("wait=12", "retry=1")
    state.hold = SimpleNamespace(lease_id="lse_1")  # the credit lease its hold was taken from
    from treg.capacity.classify import Unrecorded

    state.capacity_signal = Unrecorded(provider="api.example", endpoint="ep_1", status=418, word="quota")
    rec = state.record(outcome="upstream_error", status=418, refused_by="deny", error_code="e", blame="upstream",
                       request_bytes=11, response_bytes=22, error_request={"a": 1}, error_response={"b": 2},
                       failure_kind="fk")
    got = rec._asdict()
    assert got.pop("duration_ms") >= 0
    assert got == {"id": "call_1", "org_id": "org_1", "member_id": "mem_1", "surface": "call", "method": "POST",
                   "target": "t/x", "outcome": "upstream_error", "status": 418,
                   "upstream_url": "https://api.example/x?key=[REDACTED]", "tool_id": "tool_1", "tool_name": "t",
                   "provider": "api.example", "endpoint_id": "ep_1", "refused_by": "deny", "error_code": "e",
                   "blame": "upstream", "credential_tier": "tool", "cost_micro": 7, "hold_state": "settled",
                   "tag": "tag-1", "request_bytes": 11, "response_bytes": 22, "ttfb_ms": 3,
                   "error_request": {"a": 1}, "error_response": {"b": 2}, "failure_kind": "fk",
                   "parent_call_id": "call_0", "result_state": "miss", "cache_state": "stored",
                   "kind": "async_poll", "capacity_signal": "unrecorded",
                   "served_via": None,  # set only on an overflow attempt's row
                   "credential_kind": "oauth", "connection_id": "conn_1",  # from the bindings (docs/oauth.md)
                   "demo": True,  # a public demo token's call (docs/sharing.md)
                   "hub_ref": None, "hub_caller_org": None,  # a hub call's (treg/call/hub_views.py)
                   "lease_id": "lse_1",  # docs/money.md "Credit leases"
                   # the event's own fields (not columns)
                   "user_agent": ("sdk/1.0 " + "x" * 300)[:256], "probe": True, "smoothed": "wait=12, retry=1",
                   "result_reason": "miss_rule", "cache_admission": "result_miss", "hub_twin": None}
    with pytest.raises(TypeError):
        state.record(outcome="ok", status=200, respones_bytes=1)  # a misspelt column is refused


def test_the_events_own_fields_never_travel_to_the_database():
    """The fields after the last column (user agent, probe, smoothing, reasons) ride the event only: a
    batch sends each record up to its last stored column."""
    import json as _json

    from treg.call.audit import insert_sql

    rec = CallRecord(id="call_ua", org_id="org_1", member_id=None, surface="call", method="GET", target="t/x",
                     outcome="ok", served_via="overflow:x", connection_id="conn_1", demo=True, hub_caller_org="callr",
                     user_agent="UA-" + "u" * 200, probe=True, smoothed="wait=3", result_reason="hit_rule",
                     cache_admission="admitted")
    _, params = insert_sql([rec])
    [row] = _json.loads(params["rows"])
    assert row[-5:] == ["conn_1", True, None, "callr", None] and len(row) == CallRecord._fields.index("lease_id") + 1
    assert "UA-" not in params["rows"] and "admitted" not in params["rows"]
