"""The audit batch's rows written into its statement as a dollar-quoted literal (treg/call/audit.py
``batch_statement``): whatever a row holds — the delimiter itself, quotes, ``%``, backslashes, escapes
PostgreSQL must not read as its own, a closing ``$$`` — is stored exactly as the parameterized
statement stores it, nothing of it becomes SQL, and token ids outside treg's own alphabet go as
parameters. Real parts: the writer on the test's own database."""

from __future__ import annotations

import json

import psycopg2
import pytest

from treg import membership
from treg.call import audit
from treg.call_record import CallRecord
from treg.keys import SERVICES
from treg.testing import run_sql

HOSTILE = [
    "$treg_rows$", "$treg_rows$::jsonb) AS r; DROP TABLE calls; --", "'); DELETE FROM calls; --", "%s %(rows)s %%",
    "back\\slash \\u0000 \\ud800", "$$", "$", "dollar $treg_rows", "quote \" and ' both", "\u0000nul", "\ud800lone",
    "é ünïcödé ☃ \U0001f600", "line\nbreak\r\ttab",
]


def _record(org_id: str, n: int, text: str) -> CallRecord:
    return CallRecord(id=f"call_lit_{n}", org_id=org_id, member_id=None, surface="call", method="GET",
                      target=text, outcome="ok", status=200, tag=None,
                      error_response={"status": 500, "body": text, "headers": [["X-Echo", text]]})


async def test_hostile_rows_are_stored_exactly_as_the_parameterized_statement_stores_them(make_app, aiohttp_client,
                                                                                           dsn):
    client = await aiohttp_client(make_app(audit_flush_ms=600_000))
    svc = client.app[SERVICES]
    org = await membership.create_org(svc, slug="acme", email="o@acme.test")
    org_id = org["org_id"]
    for n, text in enumerate(HOSTILE):
        svc.audit.record(_record(org_id, n, text))
    assert await svc.audit.flush() is True
    assert svc.audit.dropped == 0
    # the same rows through the parameterized statement, under other ids: the reference
    reference = [_record(org_id, n + 100, text) for n, text in enumerate(HOSTILE)]
    sql, params = audit.insert_sql(reference)
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            cur.execute(sql, params)
    finally:
        conn.close()
    stored = {r[0]: (r[1], r[2]) for r in run_sql(
        dsn, "SELECT id, target, error_response::text FROM calls WHERE org_id = %s", org_id)}
    for n in range(len(HOSTILE)):
        assert stored[f"call_lit_{n}"] == stored[f"call_lit_{n + 100}"], HOSTILE[n]
    assert stored["call_lit_0"][0] == "$treg_rows$"
    assert json.loads(stored["call_lit_3"][1])["body"] == "%s %(rows)s %%"
    assert run_sql(dsn, "SELECT count(*) FROM calls") == [(2 * len(HOSTILE),)]  # nothing deleted, nothing dropped


def test_the_delimiter_is_never_one_the_rows_hold():
    rows = audit.insert_sql([_record("org_1", 1, "$treg_rows$")])[1]["rows"]
    sql, params = audit.batch_statement(rows, ["tok_abc"])
    assert params is None and "$treg_rows$" in rows
    tag = sql[sql.index("jsonb_array_elements(") + len("jsonb_array_elements("):].split("$")[1]
    assert tag != "treg_rows" and f"${tag}$" not in rows
    assert sql.endswith(f"${tag}$::jsonb) AS r") and sql.count(f"${tag}$") == 2
    # what a failure's log line shows (its first 200 characters) holds no row
    assert rows[:20] not in sql[:200] and "$" not in sql[:200]


@pytest.mark.parametrize("ids", [["tok_1", "tok'); DROP TABLE calls; --"], ["tok 1"], ["tok_é"]])
def test_token_ids_outside_treg_s_alphabet_go_as_parameters(ids):
    sql, params = audit.batch_statement("[]", ids)
    assert params == {"rows": "[]", "ids": ids} and "%(ids)s" in sql and "%(rows)s" in sql


def test_plain_ids_and_no_ids_are_written_into_the_text():
    sql, params = audit.batch_statement("[]", ["tok_A1", "tok_b2"])
    assert params is None and "ARRAY['tok_A1','tok_b2']::text[]" in sql
    sql, params = audit.batch_statement("[]", [])
    assert params is None and "ARRAY[]::text[]" in sql
