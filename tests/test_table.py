"""``/table/<endpoint-id>`` over real HTTP (docs/sharing.md): the catalog call's pipeline with a tabular
finish, read by real consumers (Python's ``csv`` module, pandas ``read_csv`` fetching the URL itself), no
formula surviving into a cell; read-only table tokens."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import re

import pandas
import pytest

from treg import money
from treg.catalog.table import TRIGGERS
from treg.testing import audit_row, check_books, post_login
from treg.testing.vendors.tables import HOSTILE, PLATFORM_KEY, PRICE, crm_gateway

CSV_TRIGGERS = tuple(TRIGGERS)


@pytest.fixture
async def crm(aiohttp_client, make_app):
    """(gateway, vendor, upstream): ``crm`` on treg's platform key, its ``status`` keyless too."""
    async with crm_gateway(aiohttp_client, make_app) as world:
        yield world


def parsed_csv(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline="")))


#: a JSON number, as the vendor wrote it (a spreadsheet reads ``-5`` as the number it is, nothing runs)
NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


def no_formula(cell: str) -> bool:
    """A cell a spreadsheet does not run: a number, or text that does not begin with a trigger, before
    or after blanks."""
    if NUMBER.fullmatch(cell):
        return True
    return not cell[:1] in CSV_TRIGGERS and not cell.lstrip(" \t\r\n\xa0")[:1] in CSV_TRIGGERS


async def test_json_table_with_declared_columns(crm):
    gw, vendor, up = crm
    r = await gw.call("GET", "/table/crm.contacts?q=a")
    raw = await r.read()
    assert r.status == 200, raw
    assert r.headers["Content-Type"].startswith("application/json")
    assert r.headers["X-Treg-Credential-Tier"] == "platform" and r.headers["X-Treg-Cost-Micro"] == str(PRICE)
    assert r.headers.getall("Cache-Control") == ["no-store"]  # treg's own answer, for this caller only
    body = json.loads(raw)
    assert body["columns"] == ["id", "name", "email", "score", "vip", "extra"]
    assert body["truncated"] is False and len(body["rows"]) == 3 + len(HOSTILE)
    assert body["rows"][0] == [1, "Ada", "ada@example.com", 1.5, True, None]
    assert body["rows"][1][2] is None and body["rows"][2][2] is None  # null, and a missing key
    assert body["rows"][2][5] == {"nested": [1, {"x": "=1"}]}
    # numbers keep the vendor's spelling (a float would be 1.5, 1000.0 and a rounded id)
    assert b"1.50" in raw and b"1e3" in raw and b"12345678901234567890123" in raw
    # the vendor was asked for JSON, for identity, without the table's own controls
    sent = up.last
    assert sent.target == "/v1/contacts?q=a"
    assert sent.header("Accept") == "application/json" and sent.header("Accept-Encoding") == "identity"
    assert sent.header("Authorization") == f"Bearer {PLATFORM_KEY}"
    row = await audit_row(gw, r.headers["X-Treg-Call-Id"])
    assert row["surface"] == "table" and row["endpoint_id"] == "crm.contacts" and row["outcome"] == "ok"
    assert row["hold_state"] == "settled" and row["cost_micro"] == PRICE
    await check_books(gw.services, gw.org["org_id"])


async def test_csv_by_accept_and_by_format_read_by_the_csv_module(crm):
    gw, vendor, up = crm
    by_accept = await gw.call("GET", "/table/crm.contacts", headers={"Accept": "text/csv"})
    by_query = await gw.call("GET", "/table/crm.contacts?format=csv")
    assert by_accept.status == by_query.status == 200
    assert up.exchanges[-1].target == "/v1/contacts"  # ?format=csv is treg's, never sent upstream
    text = await by_accept.text()
    assert text == await by_query.text()
    assert by_accept.headers["Content-Type"] == "text/csv; charset=utf-8; header=present"
    assert "X-Treg-Table-Truncated" not in by_accept.headers
    assert text.endswith("\r\n") and "\r\n" in text  # RFC 4180 line ends
    rows = parsed_csv(text)
    assert rows[0] == ["id", "name", "email", "score", "vip", "extra"]
    assert rows[1] == ["1", "Ada", "ada@example.com", "1.50", "true", ""]
    assert rows[2] == ["12345678901234567890123", 'hello, "world"\nline2', "", "1e3", "false", ""]
    # the number -5 as written; the string "-5" defused; a nested value as its JSON text
    assert rows[3][:2] == ["-5", "'-5"] and json.loads(rows[3][5]) == {"nested": [1, {"x": "=1"}]}
    hostile = rows[4:]
    assert len(hostile) == len(HOSTILE)
    for cells, original in zip(hostile, HOSTILE):
        assert cells[1] == "'" + original and cells[2] == "'" + original  # shown as text, nothing lost
    for cells in rows:
        for cell in cells:
            if not cell.startswith("{"):
                assert no_formula(cell), cell


async def test_pandas_reads_the_csv_over_http_and_no_cell_is_a_formula(crm):
    gw, vendor, up = crm
    url = f"http://127.0.0.1:{gw.client.port}/table/crm.contacts?format=csv"
    token = gw.org["token"]
    # pandas fetches the URL itself (urllib, as a spreadsheet's import would), the token in a header
    frame = await asyncio.to_thread(pandas.read_csv, url, storage_options={"X-Treg-Token": token},
                                    dtype=str, keep_default_na=False)
    assert list(frame.columns) == ["id", "name", "email", "score", "vip", "extra"]
    assert len(frame) == 3 + len(HOSTILE)
    assert frame["name"].iloc[1] == 'hello, "world"\nline2'
    assert frame["id"].iloc[1] == "12345678901234567890123" and frame["score"].iloc[0] == "1.50"
    for column in ("name", "email"):
        for cell in frame[column]:
            assert no_formula(cell), cell
    # read with pandas' own typing, the numbers are numbers and the defused strings stay strings
    typed = await asyncio.to_thread(pandas.read_csv, url, storage_options={"X-Treg-Token": token})
    assert typed["score"].iloc[0] == 1.5 and typed["score"].iloc[1] == 1000
    assert str(typed["name"].iloc[2]) == "'-5" and str(typed["name"].iloc[3]) == "'=1+1"
    # a table token (read-only, issued by the member for themselves) works for pandas as well
    table_token = (await gw.api("POST", "/api/v1/tokens", json={"scope": "table"}, expect=201))["token"]
    again = await asyncio.to_thread(pandas.read_csv, url, storage_options={"X-Treg-Token": table_token}, dtype=str)
    assert len(again) == len(frame)


async def test_columns_default_to_the_union_of_top_level_keys_in_first_seen_order(crm):
    gw, vendor, up = crm
    r = await gw.call("GET", "/table/crm.contacts_all")
    body = await r.json()
    assert body["columns"] == ["id", "name", "contact", "score", "vip", "tags", "extra"]
    assert body["rows"][0] == [1, "Ada", {"email": "ada@example.com"}, 1.5, True, None, None]
    assert body["rows"][1][5] == ["a", "b"]
    r = await gw.call("GET", "/table/crm.contacts_all?format=csv")
    rows = parsed_csv(await r.text())
    assert rows[1][2] == '{"email":"ada@example.com"}' and rows[2][5] == '["a","b"]'


async def test_row_limit_truncates_and_says_so(aiohttp_client, make_app):
    async with crm_gateway(aiohttp_client, make_app, table_max_rows=5) as (gw, _, _):
        r = await gw.call("GET", "/table/crm.bulk?n=8")
        body = await r.json()
        assert [row[0] for row in body["rows"]] == [0, 1, 2, 3, 4] and body["truncated"] is True
        r = await gw.call("GET", "/table/crm.bulk?n=8&format=csv")
        assert r.headers["X-Treg-Table-Truncated"] == "true"
        assert len(parsed_csv(await r.text())) == 1 + 5
        r = await gw.call("GET", "/table/crm.bulk?n=5&format=csv")
        assert "X-Treg-Table-Truncated" not in r.headers and len(parsed_csv(await r.text())) == 6
        assert (await (await gw.call("GET", "/table/crm.bulk?n=5")).json())["truncated"] is False


async def test_endpoint_without_table_is_refused_before_any_hold_or_vendor_contact(crm):
    gw, vendor, up = crm
    before = await money.balance(gw.services, gw.org["org_id"])
    r = await gw.call("GET", "/table/crm.people")
    body = await r.json()
    assert r.status == 400 and body["error"] == "table_not_available" and r.headers["X-Treg-Error"] == "1"
    assert up.exchanges == []
    after = await money.balance(gw.services, gw.org["org_id"])
    assert after.balance_micro == before.balance_micro and after.held_micro == 0
    row = await audit_row(gw, r.headers["X-Treg-Call-Id"])
    assert row["outcome"] == "refused" and row["surface"] == "table" and row["hold_state"] is None
    # an unknown id is the catalog's own 404, as on /catalog/call/
    r = await gw.call("GET", "/table/crm.nope")
    assert r.status == 404 and up.exchanges == []


async def test_non_2xx_upstream_is_502_with_the_hold_released(crm):
    gw, vendor, up = crm
    vendor.broken_status = 503
    before = await money.balance(gw.services, gw.org["org_id"])
    for fmt in ("json", "csv"):
        r = await gw.call("GET", f"/table/crm.broken?format={fmt}")
        body = await r.json()
        assert r.status == 502 and body["error"] == "table_upstream_error" and body["upstream_status"] == 503
        assert body["blame"] == "upstream" and r.headers["X-Treg-Error"] == "1"
        assert r.headers["X-Treg-Cost-Micro"] == "0"
        row = await audit_row(gw, r.headers["X-Treg-Call-Id"])
        assert row["hold_state"] == "released" and row["cost_micro"] == 0 and row["status"] == 503
    after = await money.balance(gw.services, gw.org["org_id"])
    assert after.balance_micro == before.balance_micro and after.held_micro == 0
    await check_books(gw.services, gw.org["org_id"])


@pytest.mark.parametrize("body", [b"not json at all", b'{"data": {"items": {"not": "a list"}}}', b'{"data": 1}',
                                  b'{"data": {"items": [NaN]}}', b""])
async def test_a_2xx_with_no_rows_is_502_and_not_charged(crm, body):
    gw, vendor, up = crm
    vendor.broken_status, vendor.broken_body = 200, body
    before = await money.balance(gw.services, gw.org["org_id"])
    r = await gw.call("GET", "/table/crm.broken")
    err = await r.json()
    assert r.status == 502 and err["error"] == "table_upstream_error" and err["upstream_status"] == 200
    assert r.headers["X-Treg-Cost-Micro"] == "0"
    row = await audit_row(gw, r.headers["X-Treg-Call-Id"])
    assert row["hold_state"] == "released" and row["cost_micro"] == 0 and row["error_code"] == "table_upstream_error"
    after = await money.balance(gw.services, gw.org["org_id"])
    assert after.balance_micro == before.balance_micro
    await check_books(gw.services, gw.org["org_id"])


async def test_keyless_endpoint_and_a_top_level_array(crm):
    gw, vendor, up = crm
    r = await gw.call("GET", "/table/crm.status?format=csv")
    assert r.status == 200 and r.headers["X-Treg-Credential-Tier"] == "anonymous"
    assert r.headers["X-Treg-Cost-Micro"] == "0"
    assert parsed_csv(await r.text()) == [["service", "up"], ["api", "true"], ["db", "false"]]
    assert up.last.header("Authorization") is None


async def test_format_of_the_vendor_passes_and_a_token_in_the_query_is_refused(crm):
    gw, vendor, up = crm
    r = await gw.call("GET", "/table/crm.contacts?format=xml&q=1")
    assert r.status == 200 and up.last.target == "/v1/contacts?format=xml&q=1"  # not the table's: relayed
    sent = len(up.exchanges)
    token = gw.org["token"]
    for query in (f"treg_token={token}", f"TREG%5FTOKEN={token}", f"x-treg-token={token}"):
        r = await gw.call("GET", f"/table/crm.contacts?{query}&format=csv")
        body = await r.json()
        assert r.status == 400 and body["error"] == "token_in_query", query
        assert token not in json.dumps(body)
    # without the header, a token in the query is not a token: 401
    r = await gw.client.get(f"/table/crm.contacts?treg_token={token}")
    assert r.status == 401
    assert len(up.exchanges) == sent  # none of them reached the vendor


async def test_table_tokens_are_read_only_and_only_for_table_gets(crm):
    gw, vendor, up = crm
    member = await gw.member("m@crm.test")
    made = await gw.api("POST", "/api/v1/tokens", as_=member["headers"], json={"scope": "table"}, expect=201)
    assert made["scope"] == "table" and made["member_id"] == member["member_id"]
    table = {"X-Treg-Token": made["token"]}
    listed = await gw.api("GET", "/api/v1/tokens", as_=member["headers"], expect=200)
    assert {t["scope"] for t in listed["tokens"]} == {"full", "table"}
    r = await gw.call("GET", "/table/crm.contacts?format=csv", as_=table)
    assert r.status == 200
    sent = len(up.exchanges)
    refusals = [("POST", "/table/crm.contacts"), ("HEAD", "/table/crm.contacts"), ("GET", "/call/crm.contacts"),
                ("GET", "/catalog/call/crm.contacts"), ("GET", "/api/v1/me"), ("GET", "/api/v1/calls"),
                ("POST", "/api/v1/tokens"), ("GET", "/api/v1/org")]
    for method, path in refusals:
        r = await gw.call(method, path, as_=table)
        assert r.status == 403, (method, path, r.status)
        if method != "HEAD":
            assert (await r.json())["error"] == "token_scope", (method, path)
    r = await gw.client.post("/mcp", headers={**table, "Accept": "application/json", "Content-Type": "application/json"},
                             json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    assert r.status == 403 and (await r.json())["error"] == "token_scope"
    r = await post_login(gw.client, {"token": made["token"]}, allow_redirects=False)
    assert r.status == 403 and "read-only table token" in await r.text() and "treg_session" not in r.cookies
    assert len(up.exchanges) == sent
    # a table token is issued to oneself only; a manager cannot make one for a member
    r = await gw.call("POST", "/api/v1/tokens", json={"scope": "table", "member_id": member["member_id"]})
    assert r.status == 403
    r = await gw.call("POST", "/api/v1/tokens", json={"scope": "demo"})
    assert r.status == 400 and (await r.json())["error"] == "invalid_scope"
    # revoked, it stops at once
    tok = next(t for t in listed["tokens"] if t["scope"] == "table")
    await gw.api("DELETE", f"/api/v1/tokens/{tok['id']}", as_=member["headers"], expect=204)
    assert (await gw.call("GET", "/table/crm.contacts", as_=table)).status == 401


async def test_idempotent_replay_is_answered_as_a_table_without_a_second_charge(crm):
    gw, vendor, up = crm
    headers = {"Idempotency-Key": "k-1"}
    first = await gw.call("GET", "/table/crm.contacts?format=csv", headers=headers)
    second = await gw.call("GET", "/table/crm.contacts?format=csv", headers=headers)
    assert first.status == second.status == 200
    assert await first.text() == await second.text()
    assert second.headers["X-Treg-Cost-Micro"] == "0" and len(up.exchanges) == 1
    bal = await money.balance(gw.services, gw.org["org_id"])
    assert bal.balance_micro == 100_000 - PRICE
