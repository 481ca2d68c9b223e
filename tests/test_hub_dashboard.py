"""The dashboard's Hub page in Debian's chromium (Playwright): an owner publishes one of the org's tools
and unpublishes it, a refused name is shown under its field, and a member of another org browses every
published tool with its price, never its base URL or credential, and no form to change anything."""

from __future__ import annotations

import pytest

from treg.testing.browser import logged_in
from treg.testing.vendors.hub import hub_pair, leaks

pw = pytest.importorskip("playwright.async_api", reason="playwright is not installed (pip install playwright)")


async def _logged_in(browser, pair, token):
    page = await logged_in(browser, f"http://127.0.0.1:{pair.client.port}", token)
    await page.get_by_role("navigation", name="Main").get_by_role("link", name="Hub", exact=True).click()
    await pw.expect(page.get_by_role("heading", level=1)).to_have_text("Hub")
    return page


async def test_publish_browse_and_unpublish_from_the_hub_page(aiohttp_client, make_app, browser):
    async with hub_pair(aiohttp_client, make_app, price=250) as pair:
        page = await _logged_in(browser, pair, pair.publisher.org["token"])
        await pw.expect(page.get_by_role("row").filter(has_text="pub.search")).to_contain_text("yours")
        await page.get_by_label("Tool", exact=True).select_option(pair.tool["id"])
        await page.get_by_label("Name (the ref is pub.<name>)").fill("lookup")
        await page.get_by_label("Description").fill("look a thing up")
        await page.get_by_label("Price per call (micro-USD; empty or 0: free)").fill("500")
        await page.get_by_label("Max runs at once (empty: the org's limit)").fill("2")
        await page.get_by_role("button", name="Publish", exact=True).click()
        await pw.expect(page.get_by_role("status")).to_contain_text("Published pub.lookup.")
        row = page.get_by_role("row").filter(has_text="pub.lookup")
        await pw.expect(row).to_contain_text("look a thing up")
        await pw.expect(row).to_contain_text("500")
        # a ref this org published already: refused under the name field, the form kept
        await page.get_by_label("Name (the ref is pub.<name>)").fill("search")
        await page.get_by_role("button", name="Publish", exact=True).click()
        await pw.expect(page.locator("#name-error")).to_contain_text("already published pub.search")
        await pw.expect(page.get_by_label("Name (the ref is pub.<name>)")).to_have_value("search")

        # a member of another org: both refs, their prices, nothing of the publisher's setup, no forms
        other = await _logged_in(browser, pair, pair.caller_member["token"])
        await pw.expect(other.get_by_role("row").filter(has_text="pub.lookup")).to_contain_text("500")
        await pw.expect(other.get_by_role("row").filter(has_text="pub.search")).to_contain_text("250")
        content = await other.content()
        assert pair.upstream.url not in content and "127.0.0.1:%d" % pair.upstream.port not in content
        assert leaks(content) == [] and "yours" not in content
        assert await other.get_by_role("button", name="Publish", exact=True).count() == 0
        assert await other.get_by_role("button", name="Unpublish pub.lookup").count() == 0

        await page.get_by_role("button", name="Unpublish pub.lookup").click()
        await pw.expect(page.get_by_role("status")).to_contain_text("Unpublished.")
        await pw.expect(page.get_by_role("row").filter(has_text="pub.lookup")).to_have_count(0)
        r = await pair.caller.call("GET", "/call/pub.lookup/x")
        assert r.status == 404
        assert page.seen_5xx == [] and other.seen_5xx == []
        await page.context.close()
        await other.context.close()


async def test_both_orgs_see_the_call_on_its_page(aiohttp_client, make_app, browser):
    async with hub_pair(aiohttp_client, make_app, price=250) as pair:
        r = await pair.call("GET", "/x")
        call_id = r.headers["X-Treg-Call-Id"]
        await pair.row(pair.publisher, call_id)
        for token, says in ((pair.publisher.org["token"], "pub.search, called by the org callr"),
                            (pair.caller.org["token"], "pub.search")):
            page = await logged_in(browser, f"http://127.0.0.1:{pair.client.port}", token)
            await page.goto(f"/ui/activity/{call_id}")
            await pw.expect(page.locator("dl.facts")).to_contain_text(f"Hub tool{says}")
            content = await page.content()
            assert leaks(content) == []
            if token == pair.caller.org["token"]:
                assert "called by" not in content and str(pair.upstream.port) not in content
            await page.context.close()
