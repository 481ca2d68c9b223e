"""The dashboard in a real browser (Debian's chromium through Playwright), as a new user tries it: log in,
create a secret and a tool, run Try-it, find the call in Activity, open its permalink; a member sees
only what the API shows a member; every page answers without a 5xx and loads nothing from another host.
Screenshots of each page go to ``TREG_UI_SHOTS_DIR`` (default /tmp/treg-ui-shots)."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

import pytest


pw = pytest.importorskip("playwright.async_api", reason="playwright is not installed (pip install playwright)")


SHOTS = Path(os.environ.get("TREG_UI_SHOTS_DIR", "/tmp/treg-ui-shots"))
PAGES = ("Overview", "Tools", "Secrets", "Connections", "Members and tokens", "Deny rules", "Activity", "Catalog",
         "Capacity", "Org",
         "Try it")


@pytest.fixture
async def ui(gateway, browser):
    """A fresh browser context on the gateway; records every request's host and every 5xx."""
    base = f"http://127.0.0.1:{gateway.client.port}"
    ctx = await browser.new_context(base_url=base, viewport={"width": 1200, "height": 900})
    page = await ctx.new_page()
    seen = {"hosts": set(), "5xx": []}
    page.on("request", lambda r: seen["hosts"].add(urlsplit(r.url).netloc))
    page.on("response", lambda r: seen["5xx"].append(r.url) if r.status >= 500 else None)
    page.seen = seen  # type: ignore[attr-defined]
    page.base = base  # type: ignore[attr-defined]
    yield page
    await ctx.close()


async def log_in(page, token: str) -> None:
    await page.goto("/ui/login")
    await page.get_by_label("Token").fill(token)
    await page.get_by_role("button", name="Log in").click()
    await page.wait_for_url("**/ui/")


async def nav(page, name: str) -> None:
    await page.get_by_role("navigation", name="Main").get_by_role("link", name=name, exact=True).click()


async def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


async def test_a_new_user_creates_a_secret_and_tool_tries_it_and_finds_the_call(gateway, up, ui):
    page = ui
    await page.goto("/ui/login")
    await shot(page, "01-login")
    # a bad token: the form again, with a message, never a 500
    await page.get_by_label("Token").fill("treg_not_a_token")
    await page.get_by_role("button", name="Log in").click()
    await pw.expect(page.get_by_role("alert")).to_contain_text("unknown or revoked")
    await log_in(page, gateway.org["token"])
    await shot(page, "02-overview")

    await nav(page, "Secrets")
    await page.get_by_label("Name").fill("up-key")
    await page.get_by_label("Value", exact=True).fill("s3cr3t-value")
    await page.get_by_role("button", name="Store secret").click()
    await pw.expect(page.get_by_role("status")).to_contain_text("will not be shown again")
    assert "s3cr3t-value" not in await page.content()
    await shot(page, "03-secrets")

    await nav(page, "Tools")
    # an internal base URL: the SSRF guard's message beside the field, the form kept
    await page.get_by_label("Name", exact=True).fill("up")
    await page.get_by_label("Base URL").fill("http://10.1.2.3/v1")
    await page.get_by_role("button", name="Create tool").click()
    await pw.expect(page.locator("#base_url-error")).to_contain_text("internal address")
    await shot(page, "04-tools-ssrf-refused")
    await page.get_by_label("Base URL").fill(up.url + "/v1")
    await page.get_by_label("Binding 1 name").fill("Authorization")
    await page.get_by_label("Binding 1 format").fill("Bearer {secret}")
    await page.get_by_label("Binding 1 secret", exact=True).select_option(label="up-key")
    await page.get_by_role("button", name="Create tool").click()
    await pw.expect(page.get_by_role("status")).to_contain_text("Tool up created")
    await shot(page, "05-tools")

    await nav(page, "Try it")
    await page.get_by_label("Tool").select_option("up")
    await page.get_by_label("Path and query").fill("/items?limit=1")
    await page.get_by_role("button", name="Send").click()
    await pw.expect(page.locator("#try-status")).to_contain_text("Status 200")
    await pw.expect(page.locator("#try-answer")).to_have_text("ok")
    await shot(page, "06-try-it")
    sent = up.last
    assert sent.target == "/v1/items?limit=1"
    assert sent.header("Authorization") == "Bearer s3cr3t-value"
    assert b"treg_session" not in sent.raw and b"X-Treg" not in sent.raw  # the cookie scrub, end to end
    await page.get_by_role("link", name="Open call").click()
    await pw.expect(page.get_by_role("heading", level=1)).to_contain_text("Call")
    call_url = page.url
    await shot(page, "07-call-permalink")

    await nav(page, "Activity")
    row = page.get_by_role("row").filter(has_text="up/items")
    await pw.expect(row).to_contain_text("200")
    await row.get_by_role("link").click()
    assert page.url == call_url
    await nav(page, "Activity")
    await shot(page, "08-activity")

    for name in PAGES:
        await nav(page, name)
        await pw.expect(page.get_by_role("heading", level=1)).to_be_visible()
        await shot(page, "page-" + name.lower().replace(" ", "-"))
    assert page.seen["5xx"] == []
    assert page.seen["hosts"] == {urlsplit(page.base).netloc}  # nothing from another host

    # a failed call's evidence is shown to an owner
    up.responder = lambda ex: b"HTTP/1.1 500 Boom\r\nContent-Length: 4\r\n\r\nboom"
    await nav(page, "Try it")
    await page.get_by_role("button", name="Send").click()
    await pw.expect(page.locator("#try-status")).to_contain_text("Status 500")
    await page.get_by_role("link", name="Open call").click()
    await pw.expect(page.get_by_role("heading", name="Evidence")).to_be_visible()
    await pw.expect(page.locator("pre").first).to_contain_text("[REDACTED]")  # the injected key, masked
    assert "s3cr3t-value" not in await page.content()
    await shot(page, "09-call-evidence")


async def test_a_member_sees_only_what_the_api_shows_a_member(gateway, up, tool, ui):
    member = await gateway.member("dev@acme.test")
    await gateway.call("GET", "/call/up/owner-only")
    await gateway.call("GET", "/call/up/mine", as_=member["headers"])
    page = ui
    await log_in(page, member["token"])
    await nav(page, "Activity")
    await pw.expect(page.get_by_role("row").filter(has_text="up/mine")).to_be_visible()
    assert await page.get_by_role("row").filter(has_text="owner-only").count() == 0
    await shot(page, "10-member-activity")
    await page.get_by_role("row").filter(has_text="up/mine").get_by_role("link").click()
    assert await page.get_by_role("heading", name="Evidence").count() == 0
    await nav(page, "Secrets")
    await pw.expect(page.get_by_text("Only an org owner or admin manages secrets")).to_be_visible()
    await nav(page, "Tools")
    assert await page.get_by_role("button", name="Create tool").count() == 0
    # the owner's call is not reachable by its permalink either
    owner_calls = await gateway.api("GET", "/api/v1/calls")
    theirs = next(c for c in owner_calls["calls"] if "owner-only" in c["target"])
    resp = await page.goto(f"/ui/activity/{theirs['call_id']}")
    assert resp is not None and resp.status == 404
    await shot(page, "11-member-forbidden-call")
    assert page.seen["5xx"] == []


async def test_keyboard_and_narrow_screen(gateway, browser):
    ctx = await browser.new_context(base_url=f"http://127.0.0.1:{gateway.client.port}",
                                    viewport={"width": 360, "height": 740})
    page = await ctx.new_page()
    await page.goto("/ui/login")
    await page.keyboard.press("Tab")  # the skip link
    await page.keyboard.press("Tab")
    await page.keyboard.type(gateway.org["token"])
    await page.keyboard.press("Enter")
    await page.wait_for_url("**/ui/")
    await page.goto("/ui/tools")
    width = await page.evaluate("document.documentElement.scrollWidth")
    assert width <= 360 + 1, width  # nothing wider than the screen (tables scroll inside their box)
    await shot(page, "12-narrow-tools")
    await ctx.close()
