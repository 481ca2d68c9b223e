"""A secret's value is absent from every API answer, from the logs, and from every file under TREG_HOME.

This test's TREG_HOME holds the generated master key; the database is the shared test server (its
data folder lives under the test home, not this TREG_HOME). The embedded-database case, where the
PostgreSQL data folder sits inside TREG_HOME and is searched byte for byte, is
tests/test_embedded_pg.py::test_serve_end_to_end_on_embedded_postgres.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from treg import membership
from treg.keys import SERVICES

VALUE = "sk_live_LEAKCANARY_7f3a9c"
JSON_VALUE = {"access_token": "at_LEAKCANARY_json_51d2", "note": "x"}
CANARIES = (VALUE, JSON_VALUE["access_token"])


def files_containing(root: Path, needles: tuple[str, ...]) -> list[str]:
    """Every file under ``root`` whose bytes contain a needle (text or binary: both are searched)."""
    hits = []
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            try:
                data = path.read_bytes()
            except (PermissionError, FileNotFoundError, IsADirectoryError):
                continue
            if any(n.encode() in data for n in needles):
                hits.append(str(path))
    return hits


async def test_value_never_in_answers_logs_or_files(make_app, aiohttp_client, caplog):
    caplog.set_level(logging.DEBUG)  # every logger, every level
    client = await aiohttp_client(make_app(secret_key=None))  # the master key is written into TREG_HOME
    svc = client.app[SERVICES]
    org = await membership.create_org(svc, slug="acme", email="owner@acme.test")
    h = {"X-Treg-Token": org["token"]}
    seen: list[str] = []

    async def call(method: str, path: str, **kw: Any) -> Any:
        kw["headers"] = {**h, **kw.get("headers", {})}
        resp = await client.request(method, path, **kw)
        text = await resp.text()
        seen.append(f"{resp.status} {dict(resp.headers)} {text}")
        return resp, text

    resp, text = await call("POST", "/api/v1/secrets", json={"name": "stripe", "value": VALUE, "provider": "stripe"})
    assert resp.status == 201

    sid = json.loads(text)["id"]
    resp, text = await call("POST", "/api/v1/secrets", json={"name": "oauth", "value": JSON_VALUE})
    jsid = json.loads(text)["id"]
    # refusals that carry the value in their request must not echo it
    await call("POST", "/api/v1/secrets", json={"name": "", "value": VALUE})
    await call("POST", "/api/v1/secrets", json={"name": "bad", "value": VALUE, "provider": "Not Valid"})
    await call("POST", "/api/v1/secrets", json={"name": "bad", "value": [VALUE]})
    await call("POST", "/api/v1/secrets", data=b'{"name": "x", "value": "' + VALUE.encode() + b'"',
               headers={**h, "Content-Type": "application/json"})
    await call("POST", "/api/v1/secrets", json={"name": "x" * 300, "value": VALUE})
    await call("GET", "/api/v1/secrets")
    bindings = [{"location": "header", "name": "Authorization", "format": "Bearer {secret}", "secret_id": sid},
                {"location": "query", "name": "token", "secret_id": jsid, "secret_field": "access_token"}]
    resp, text = await call("POST", "/api/v1/tools", json={"name": "stripe", "base_url": "https://api.example.com",
                                                          "bindings": bindings})
    assert resp.status == 201, text
    tid = json.loads(text)["id"]
    # a refused tool whose binding carries the value where a secret id belongs
    await call("POST", "/api/v1/tools", json={"name": "bad", "base_url": "https://api.example.com",
                                             "bindings": [{"location": "header", "name": "X", "secret_id": VALUE}]})
    await call("POST", "/api/v1/tools", json={"name": "bad", "base_url": "https://api.example.com",
                                             "bindings": [{"location": "header", "name": "X", "format": VALUE + "{",
                                                           "secret_id": sid}]})
    await call("GET", "/api/v1/tools")
    await call("GET", f"/api/v1/tools/{tid}")
    await call("PATCH", f"/api/v1/tools/{tid}", json={"name": "stripe2"})
    await call("GET", "/api/v1/me")
    await call("GET", "/api/v1/tokens")
    await call("DELETE", f"/api/v1/secrets/{sid}")  # 409: still bound

    assert len(seen) == 17
    for answer in seen:
        for canary in CANARIES:
            assert canary not in answer, answer

    assert caplog.records, "logging was captured"
    for record in caplog.records:
        line = record.getMessage() + " " + repr(record.args) + " " + str(record.exc_text or "")
        for canary in CANARIES:
            assert canary not in line, (record.name, line)

    home = svc.settings.home
    assert (home / "secret.key").exists(), "the test writes into TREG_HOME"
    assert files_containing(home, CANARIES) == []
    # the search itself works: a planted canary is found
    (home / "planted.txt").write_text(VALUE)
    assert files_containing(home, CANARIES) == [str(home / "planted.txt")]


def test_stage_values_keep_secrets_out_of_their_repr():
    """A stage value in a log line or a traceback's locals must not carry a token or an injected key."""
    from types import SimpleNamespace

    from treg.call.types import PreparedRequest
    from treg.call.service import CallOutcome, CallState
    from treg.call.types import CallInput
    from treg.infra.upstream import CloseOnce, UpstreamRequest, UpstreamResponse

    key, token = "sk_live_REPR_KEY_123", "treg_REPR_TOKEN_456"
    inp = CallInput(call_id="c", surface="call", method="POST", rest="t/x", raw_query="", content_length=3,
                    headers=(("X-Treg-Token", token),), token=token, org_hint=None, body=key.encode())
    req = UpstreamRequest("POST", f"https://api.example/x?api_key={key}", (("Authorization", f"Bearer {key}"),),
                          key.encode())
    prepared = PreparedRequest(req, (key, f"Bearer {key}"), True)
    resp = UpstreamResponse(status=401, reason="no", headers=(("WWW-Authenticate", key),), body=None,  # type: ignore[arg-type]
                            closer=CloseOnce(SimpleNamespace()), index={"WWW-Authenticate": key},  # type: ignore[arg-type]
                            whole=key.encode())
    outcome = CallOutcome(status=401, reason="no", headers=[("X-Echo", key)], body=None, close=lambda: None,  # type: ignore[arg-type]
                          finish=lambda sent, err: None, whole=key.encode())
    state = CallState(inp)
    state.prepared, state.secret_values = prepared, prepared.secret_values
    for value in (inp, req, prepared, resp, outcome, state):
        text = repr(value)
        assert key not in text and token not in text, text


def test_upstream_urls_with_a_query_or_credentials_are_never_memoized():
    """Parsed upstream URLs are kept only when nothing secret can be in them: a query may carry an
    injected key, ``user:pw@`` a caller's credentials (docs/architecture.md)."""
    from treg.infra import upstream

    memo = upstream._parse_url_memo
    memo.cache_clear()
    assert upstream.parse_url("http://127.0.0.1:9/v1/things").raw_path == "/v1/things"
    assert upstream.parse_url("http://127.0.0.1:9/v1/things") is upstream.parse_url("http://127.0.0.1:9/v1/things")
    assert memo.cache_info().currsize == 1
    assert upstream.parse_url("http://127.0.0.1:9/v1?api_key=sk-live-123").raw_query_string == "api_key=sk-live-123"
    assert upstream.parse_url("http://user:pw@127.0.0.1:9/v1").raw_password == "pw"
    assert memo.cache_info().currsize == 1  # neither was kept
