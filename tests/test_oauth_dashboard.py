"""The dashboard's Connections page in Debian's chromium (Playwright): Connect opens the consent flow and
comes back connected, Refresh refreshes, Revoke revokes at the provider and deletes; a pending connection
shows its connect link; a member sees only theirs and the shared ones (docs/dashboard.md, docs/oauth.md)."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from treg.testing.vendors.oauth import oauth_gateway, provider_row

pw = pytest.importorskip("playwright.async_api", reason="playwright is not installed (pip install playwright)")


@pytest.fixture
def fake(fake_oauth):
    return fake_oauth


@pytest.fixture
async def gw(make_app, aiohttp_client, fake):
    async with oauth_gateway(aiohttp_client, make_app, provider_row(fake.url)) as g:
        yield g


async def _logged_in(browser, gw, token):
    base = f"http://127.0.0.1:{gw.client.port}"
    ctx = await browser.new_context(base_url=base)
    page = await ctx.new_page()
    page.seen_5xx = []  # type: ignore[attr-defined]
    page.on("response", lambda r: page.seen_5xx.append(r.url) if r.status >= 500 else None)
    await page.goto("/ui/login")
    await page.get_by_label("Token").fill(token)
    await page.get_by_role("button", name="Log in").click()
    await page.wait_for_url("**/ui/")
    return page


async def test_connect_refresh_and_revoke_from_the_connections_page(gw, fake, browser):
    page = await _logged_in(browser, gw, gw.org["token"])
    await page.get_by_role("navigation", name="Main").get_by_role("link", name="Connections", exact=True).click()
    await pw.expect(page.get_by_role("heading", level=1)).to_have_text("Connections")
    await pw.expect(page.get_by_text("No connections yet.")).to_be_visible()
    await page.get_by_label("Provider").select_option("oauthy")
    await page.get_by_label("Name (optional)").fill("my oauthy")
    await page.get_by_role("button", name="Connect").click()
    # the consent page: one button, then the provider, then back on the Connections page
    await pw.expect(page.get_by_role("heading", level=1)).to_have_text("Connect Oauthy")
    await pw.expect(page.locator("main")).to_contain_text("owner@acme.test")
    await pw.expect(page.locator("main")).to_contain_text("items.read")
    await page.get_by_role("button", name="Continue to Oauthy").click()
    await page.wait_for_url("**/ui/connections")
    row = page.get_by_role("row").filter(has_text="my oauthy")
    await pw.expect(row).to_contain_text("active")
    assert fake.authorize_requests and fake.authorize_requests[0]["code_challenge_method"] == "S256"
    await row.get_by_role("button", name="Refresh connection my oauthy").click()
    await pw.expect(page.get_by_role("status")).to_contain_text("refreshed")
    assert fake.refreshes() == 1
    content = await page.content()
    assert all(t not in content for t in list(fake.access) + list(fake.refresh_tokens))
    row = page.get_by_role("row").filter(has_text="my oauthy")
    await row.get_by_role("button", name="Revoke connection my oauthy").click()
    await pw.expect(page.get_by_role("status")).to_contain_text("revoked")
    assert len(fake.revoked) == 1 and fake.revoked[0]["token_type_hint"] == "refresh_token"
    await pw.expect(page.get_by_text("No connections yet.")).to_be_visible()
    assert page.seen_5xx == []
    await page.context.close()


async def test_a_pending_connection_shows_its_link_and_a_member_sees_only_their_own(gw, fake, browser):
    member = await gw.member("dev@acme.test")
    mine = await gw.api("POST", "/api/v1/connections", as_=member["headers"], json={"provider": "oauthy",
                                                                                   "name": "dev's"}, expect=201)
    await gw.api("POST", "/api/v1/connections", json={"provider": "oauthy", "name": "owner's"}, expect=201)
    page = await _logged_in(browser, gw, member["token"])
    await page.goto("/ui/connections")
    await pw.expect(page.get_by_role("row").filter(has_text="dev's")).to_contain_text("pending")
    assert await page.get_by_role("row").filter(has_text="owner's").count() == 0
    link = page.get_by_role("link", name="Open the connect link of dev's")
    assert urlsplit(await link.get_attribute("href")).path == urlsplit(mine["connect_url"]).path
    assert await page.get_by_label("Shared with the team (the org's connection)").count() == 0  # a member's form
    await link.click()
    await pw.expect(page.get_by_role("heading", level=1)).to_have_text("Connect Oauthy")
    await page.get_by_role("button", name="Continue to Oauthy").click()
    await pw.expect(page.get_by_role("heading", level=1)).to_contain_text("connected")
    await page.context.close()
