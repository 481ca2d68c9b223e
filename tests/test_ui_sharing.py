"""The dashboard's share of docs/sharing.md in a real browser (Debian's chromium through Playwright): the
public demo's state on the Org page (shown; the operator's CLI changes it) and a member issuing
themselves a read-only table token on the tokens page, then a spreadsheet-style read with it."""

from __future__ import annotations

import asyncio
import csv
import io
import os
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from treg import public_demo
from treg.testing import vendor_gateway
from treg.testing.browser import log_in, nav
from treg.testing.vendors.tables import PLATFORM, crm_provider, vendor_upstream

pw = pytest.importorskip("playwright.async_api", reason="playwright is not installed (pip install playwright)")

SHOTS = Path(os.environ.get("TREG_UI_SHOTS_DIR", "/tmp/treg-ui-shots"))


@pytest.fixture
async def crm(aiohttp_client, make_app):
    vendor, up = vendor_upstream()
    async with up, vendor_gateway(aiohttp_client, make_app, [crm_provider(up.url + "/v1")], platform=PLATFORM,
                                  demo_endpoints=("crm.contacts", "crm.status"), demo_calls_per_hour=7) as gw:
        yield gw


@pytest.fixture
async def page(crm, browser):
    base = f"http://127.0.0.1:{crm.client.port}"
    ctx = await browser.new_context(base_url=base, viewport={"width": 1200, "height": 900})
    p = await ctx.new_page()
    errors: list[str] = []
    p.on("response", lambda r: errors.append(r.url) if r.status >= 500 else None)
    p.errors = errors  # type: ignore[attr-defined]
    yield p
    await ctx.close()


async def test_the_org_page_shows_the_demo_state_the_operator_sets(crm, page):
    await log_in(page, crm.org["token"])
    await nav(page, "Org")
    demo = page.get_by_role("region", name="Public demo")
    await pw.expect(demo.locator("#demo-state")).to_contain_text("Disabled")
    await pw.expect(demo).to_contain_text("treg demo enable --org v")
    assert await demo.get_by_role("button").count() == 0  # CLI only: no form to change it
    await public_demo.set_enabled(crm.services, "v", True)
    await public_demo.issue_token(crm.services, "v")
    await page.reload()
    await pw.expect(demo.locator("#demo-state")).to_contain_text("Enabled")
    await pw.expect(demo).to_contain_text("1 demo token")
    await pw.expect(demo).to_contain_text("crm.contacts")
    await pw.expect(demo).to_contain_text("7")
    SHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SHOTS / "page-org-demo.png"), full_page=True)
    assert page.errors == []


async def test_a_member_issues_a_table_token_and_reads_a_table_with_it(crm, page):
    member = await crm.member("analyst@v.test")
    await log_in(page, member["token"])
    await nav(page, "Members and tokens")
    await page.get_by_role("button", name="Issue myself a table token").click()
    shown = page.get_by_role("status")
    await pw.expect(shown).to_contain_text("New table token")
    await pw.expect(shown).to_contain_text("GET /table/")
    token = await page.get_by_label("New token").input_value()
    assert token.startswith("treg_") and urlsplit(page.url).query == ""  # never in the URL
    await pw.expect(page.get_by_role("row").filter(has_text="table")).to_have_count(1)
    SHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SHOTS / "page-table-token.png"), full_page=True)
    # a reload does not show it again
    await page.reload()
    assert token not in await page.content()
    # what it may do: read a table; nothing else
    r = await crm.client.get("/table/crm.contacts?format=csv", headers={"X-Treg-Token": token})
    assert r.status == 200
    rows = list(csv.reader(io.StringIO(await r.text(), newline="")))
    assert rows[0][0] == "id" and len(rows) > 3
    r = await crm.client.get("/api/v1/me", headers={"X-Treg-Token": token})
    assert r.status == 403 and (await r.json())["error"] == "token_scope"
    await asyncio.sleep(0)
    assert page.errors == []
