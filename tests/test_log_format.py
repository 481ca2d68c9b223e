"""``TREG_LOG_FORMAT``: a real ``treg serve``; in ``json`` every stderr line is one JSON object, access
lines carry the call's fields; in either format no token, secret, body or query string appears."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from treg.infra import crypto
from treg.testing import Served, http, run_treg, treg_env

SECRET = "sk_live_LOGCANARY_SECRET_4d1"
QUERY = "QUERYCANARY_9b2"
BODY = "BODYCANARY_77aa"
PASSWORD = "PWCANARY_5e0"  # of a passthrough URL's user:password@ (refused, and masked in the access line)
ACCESS_KEYS = {"call_id", "org_id", "member_id", "surface", "method", "status", "duration_ms", "client"}


def _exercise(served: Served, token: str, up_url: str) -> dict[str, str]:
    """A management write, a call with a query and a body, a refused call: what the log must show."""
    status, secret, _ = http("POST", served.base + "/api/v1/secrets", token, {"name": "k", "value": SECRET})
    assert status == 201, secret
    status, tool, _ = http("POST", served.base + "/api/v1/tools", token, {
        "name": "up", "base_url": up_url + "/v1",
        "bindings": [{"location": "header", "name": "Authorization", "format": "Bearer {secret}",
                      "secret_id": secret["id"]}]})
    assert status == 201, tool
    status, _, headers = http("POST", served.base + f"/call/up/items?api_key={QUERY}&x=1", token,
                              {"note": BODY})
    assert status == 200
    status, _, refused = http("GET", served.base + f"/call/up/items?api_key={QUERY}", "treg_not_a_token")
    assert status == 401
    # absolute-form request target with userinfo (RFC 9112 3.2.2): neither the userinfo nor the query is logged
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as s:
        s.sendall(f"GET http://user:{SECRET}@treg/call/up/abs?api_key={QUERY} HTTP/1.1\r\nHost: treg\r\n"
                  f"X-Treg-Token: {token}\r\nConnection: close\r\n\r\n".encode())
        while s.recv(65536):
            pass
    # a passthrough target with user:password@: refused (ambiguous_target), the access line masks it as
    # the audit does (it was written as sent)
    host = up_url.split("://", 1)[1]
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as s:
        s.sendall(f"GET /call/http://user:{PASSWORD}@{host}/v1/x HTTP/1.1\r\nHost: treg\r\n"
                  f"X-Treg-Token: {token}\r\nConnection: close\r\n\r\n".encode())
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
    assert reply.startswith(b"HTTP/1.1 400 ") and b"ambiguous_target" in reply, reply
    return {"call_id": headers["X-Treg-Call-Id"], "refused_call_id": refused["X-Treg-Call-Id"]}


def _start(tmp_path, dsn: str, fmt: str) -> tuple[dict[str, str], str]:
    env = treg_env(tmp_path / f"home-{fmt}", dsn, TREG_SECRET_KEY=crypto.new_key_text(), TREG_LOG_FORMAT=fmt,
                   TREG_SSRF_ALLOW="127.0.0.0/8")
    init = run_treg(env, "init", "--org", "acme", "--email", "owner@acme.test")
    assert init.returncode == 0, init.stderr
    return env, json.loads(init.stdout)


def records_of(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.parametrize("fmt", ["json", "text"])
async def test_serve_log_lines(fmt, dsn, up, tmp_path):
    env, org = await asyncio.to_thread(_start, tmp_path, dsn, fmt)
    token = org["token"]
    served = await asyncio.to_thread(Served, env, tmp_path / "serve.log")
    try:
        ids = await asyncio.to_thread(_exercise, served, token, up.url)
    finally:
        code = await asyncio.to_thread(served.stop)
    assert code == 0
    text = served.log.read_text()
    assert up.last.header("Authorization") == f"Bearer {SECRET}"  # the call did carry the secret
    for needle in (token, SECRET, QUERY, BODY, "api_key", "treg_not_a_token", PASSWORD, "user:"):
        assert needle not in text, (needle, text)
    masked = f"GET /call/http://[REDACTED]@{up.url.split('://', 1)[1]}/v1/x 400"
    if fmt == "text":
        assert "POST /call/up/items 200" in text
        assert masked in text, text
        return
    assert [r["path"] for r in records_of(text) if r.get("status") == 400] == [masked.split()[1]]

    records = records_of(text)  # every line one JSON object
    assert records and all(isinstance(r, dict) and {"ts", "level", "logger", "msg"} <= set(r) for r in records)
    assert all(r["ts"].endswith("Z") and "T" in r["ts"] for r in records)
    access = [r for r in records if r.get("call_id") == ids["call_id"]]
    assert len(access) == 1, records
    line = access[0]
    assert ACCESS_KEYS <= set(line)
    assert line == {**line, "org_id": org["org_id"], "member_id": org["member_id"], "surface": "call",
                    "method": "POST", "status": 200, "client": "127.0.0.1"}
    assert isinstance(line["duration_ms"], float) and line["duration_ms"] >= 0
    refused = [r for r in records if r.get("call_id") == ids["refused_call_id"]]
    assert len(refused) == 1 and refused[0]["status"] == 401 and refused[0]["member_id"] is None
    api_lines = [r for r in records if r.get("surface") == "api" and r.get("method") == "POST"]
    assert api_lines and all(r["member_id"] == org["member_id"] and r["call_id"] is None for r in api_lines)


def test_cli_progress_lines_are_json_in_json_mode(dsn, tmp_path):
    key = crypto.new_key_text()
    env = treg_env(tmp_path / "home", dsn, TREG_LOG_FORMAT="json", TREG_SECRET_KEY=key)
    for args in (("db", "backup", str(tmp_path / "x.dump")), ("secrets", "rotate-key")):
        proc = run_treg(env, *args)
        assert proc.returncode == 0, proc.stderr
        lines = [json.loads(line) for line in proc.stderr.splitlines()]
        assert lines and all({"ts", "level", "logger", "msg"} <= set(r) for r in lines), proc.stderr
        assert "\r" not in proc.stderr


def test_cli_error_line_is_json_in_json_mode(tmp_path):
    env = treg_env(tmp_path / "home", "postgresql://treg@127.0.0.1:1/treg", TREG_LOG_FORMAT="json")
    proc = run_treg(env, "db", "restore", str(tmp_path / "missing.dump"))
    assert proc.returncode == 2
    lines = [json.loads(line) for line in proc.stderr.splitlines()]
    assert lines and all({"ts", "level", "logger", "msg"} <= set(r) for r in lines)
    assert lines[-1]["error"] == "backup_missing" and lines[-1]["level"] == "ERROR"

    bad = run_treg({**env, "TREG_LOG_FORMAT": "yaml"}, "settings")
    assert bad.returncode == 2 and json.loads(bad.stderr.splitlines()[-1])["error"] == "bad_setting"
