"""The management API fuzzed with schemathesis from its own OpenAPI document (GET /api/v1/openapi.json).

treg is served on a real 127.0.0.1 socket; schemathesis (a synchronous client) runs in a worker thread
while the test's loop serves. Every operation gets bounded examples, valid and invalid by the document,
some aimed at real objects (a tool, a secret, a deny rule, a member) so the paths past "not found" are
reached. Each answer must be:

* never a 5xx (the document allows 502 for the SSRF refusal of a tool's host, and 503 for the database
  being down: neither may happen here, so 5xx is refused outright);
* conformant: a documented status, content type, headers and body schema;
* when not 2xx, the contract's error body with ``X-Treg-Error: 1``;
* when not 2xx, nothing stored: every table a management route writes is fingerprinted before and
  after the request.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import hypothesis
import psycopg2
import pytest
import requests
import schemathesis
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.specs.openapi import checks as oa_checks
from schemathesis.checks import not_a_server_error

from treg import membership
from treg.keys import SERVICES

#: examples per operation and mode (positive, negative), and the cap on the whole run
EXAMPLES = 12
TIME_CAP_S = 150.0

#: what a management route may write; tokens without last_used_at (every authenticated request touches it)
_FINGERPRINTS = {
    "orgs": "SELECT * FROM orgs", "users": "SELECT * FROM users", "members": "SELECT * FROM members",
    "tokens": "SELECT id, member_id, org_id, token_hash, prefix, created_at, revoked_at FROM tokens",
    "projects": "SELECT * FROM projects", "secrets": "SELECT * FROM secrets", "tools": "SELECT * FROM tools",
    "deny_rules": "SELECT * FROM deny_rules", "org_balances": "SELECT * FROM org_balances",
    "credit_grants": "SELECT * FROM credit_grants", "member_caps": "SELECT * FROM member_caps",
    "tag_budgets": "SELECT * FROM tag_budgets",
}
_FINGERPRINT_SQL = "SELECT " + ", ".join(
    f"(SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM ({sql}) t) AS {name}"
    for name, sql in _FINGERPRINTS.items())


def fingerprint(conn: Any) -> dict[str, str]:
    with conn.cursor() as cur:
        cur.execute(_FINGERPRINT_SQL)
        return dict(zip(_FINGERPRINTS, cur.fetchone()))


class Findings:
    def __init__(self) -> None:
        self.problems: list[str] = []
        self.statuses: dict[str, set[int]] = {}

    def add(self, label: str, case: Any, what: str) -> None:
        body = getattr(case, "body", None)
        body = body[:200] if isinstance(body, bytes) else body if isinstance(body, (dict, list, str)) else "-"
        self.problems.append(f"{label} path={case.path_parameters} query={case.query} body={body!r:.300}: {what}")


def fuzz(doc: dict[str, Any], base_url: str, headers: dict[str, str], dsn: str,
         real_ids: dict[str, list[str]]) -> Findings:
    schema = schemathesis.openapi.from_dict(doc)
    found = Findings()
    session = requests.Session()
    session.trust_env = False  # a proxy from the environment must not see test traffic
    conn = psycopg2.connect(dsn)
    conn.autocommit = True
    deadline = time.monotonic() + TIME_CAP_S
    conformance = [not_a_server_error, oa_checks.status_code_conformance, oa_checks.content_type_conformance,
                   oa_checks.response_headers_conformance, oa_checks.response_schema_conformance]
    try:
        for result in schema.get_all_operations():
            op = result.ok()
            label = f"{op.method.upper()} {op.path}"
            strategies = [op.as_strategy(GenerationMode.POSITIVE), op.as_strategy(GenerationMode.NEGATIVE)]
            names = [p.name for p in op.path_parameters]
            for name in names:
                if real_ids.get(name):
                    strategies.append(st.sampled_from(real_ids[name]).flatmap(
                        lambda v, n=name: op.as_strategy(GenerationMode.POSITIVE, path_parameters={n: v})))
            seen = found.statuses.setdefault(label, set())

            @hypothesis.given(case=st.one_of(*strategies))
            @hypothesis.settings(max_examples=EXAMPLES * len(strategies), deadline=None, database=None,
                                 derandomize=True, phases=[hypothesis.Phase.generate],
                                 suppress_health_check=list(hypothesis.HealthCheck))
            def run(case: Any) -> None:
                if time.monotonic() > deadline:
                    return
                writes = op.method.upper() != "GET"
                before = fingerprint(conn) if writes else None
                resp = case.call(base_url=base_url, session=session, headers=headers, timeout=15)
                seen.add(resp.status_code)
                if resp.status_code >= 500:
                    found.add(label, case, f"answered {resp.status_code}: {resp.text[:300]}")
                    return
                if resp.status_code >= 300:
                    if resp.headers.get("x-treg-error") != ["1"]:  # schemathesis: lower-case names, lists
                        found.add(label, case, f"{resp.status_code} without X-Treg-Error: 1")
                    try:
                        body = json.loads(resp.content)
                    except ValueError:
                        body = None
                    if not (isinstance(body, dict) and {"error", "detail", "blame"} <= set(body)):
                        found.add(label, case, f"{resp.status_code} without the error body: {resp.text[:200]}")
                    if writes:
                        after = fingerprint(conn)
                        changed = [t for t in before if before[t] != after[t]]
                        if changed:
                            found.add(label, case, f"refused with {resp.status_code} but changed {changed}")
                try:
                    case.validate_response(resp, checks=conformance)
                except Exception as exc:  # noqa: BLE001 (schemathesis' FailureGroup: collected, reported at the end)
                    found.add(label, case, f"not as documented: {str(exc)[:400]}")

            run()
    finally:
        conn.close()
        session.close()
    return found


async def _setup(gw_api, owner_headers) -> dict[str, list[str]]:
    """Real objects for the path parameters: the fuzzer also hits what exists, not only 404s."""
    member = await gw_api("POST", "/api/v1/members", {"email": "fuzz-member@acme.test", "role": "member"})
    secret = await gw_api("POST", "/api/v1/secrets", {"name": "fuzz", "value": "s3cret-value"})
    project = await gw_api("POST", "/api/v1/projects", {"name": "fuzz"})
    rule = await gw_api("POST", "/api/v1/deny-rules", {"host": "example.com", "path": "/admin"})
    tool = await gw_api("POST", "/api/v1/tools", {"name": "fuzztool", "base_url": "http://127.0.0.1:9/v1"})
    tokens = await gw_api("GET", "/api/v1/tokens", None)
    other_tokens = [t["id"] for t in tokens["tokens"] if t["member_id"] == member["member_id"]]
    return {"tool_id": [tool["id"]], "secret_id": [secret["id"]], "rule_id": [rule["id"]],
            "member_id": [member["member_id"]], "token_id": other_tokens, "project_id": [project["id"]],
            "endpoint_id": ["weather.forecast", "github.get_user"], "tag": ["fuzz-tag"]}


async def test_the_management_api_survives_its_own_document(make_app, aiohttp_client, dsn):
    client = await aiohttp_client(make_app(ssrf_allow=("127.0.0.0/8",)))
    org = await membership.create_org(client.app[SERVICES], slug="acme", email="owner@acme.test")
    headers = {"X-Treg-Token": org["token"]}

    async def api(method: str, path: str, body: Any) -> Any:
        resp = await client.request(method, path, headers=headers, json=body)
        assert resp.status < 300, (method, path, resp.status, await resp.text())
        return await resp.json()

    real_ids = await _setup(api, headers)
    doc = await (await client.get("/api/v1/openapi.json")).json()
    base_url = str(client.make_url("")).rstrip("/")
    found = await asyncio.to_thread(fuzz, doc, base_url, headers, dsn, real_ids)
    assert not found.problems, f"{len(found.problems)} problems:\n" + "\n".join(found.problems[:40])
    # the run really reached the API: every operation answered, and some writes were accepted
    assert set(found.statuses) == {f"{m.upper()} {p}" for p, ops in doc["paths"].items() for m in ops}
    assert all(found.statuses.values()), found.statuses
    assert any(s < 300 for s in found.statuses["POST /api/v1/projects"]), found.statuses
