"""Try it shows a relayed redirect whole (issue 20, item 9): the status, treg's rewritten ``Location``,
the headers and the link to the call — in Debian's chromium, where a script's ``fetch`` could only ever
see an opaque "Status 0". The call is the pipeline's (one upstream request, not followed)."""

from __future__ import annotations

import re

import pytest

from treg.testing import browser as chromium_browser, http_response, login

pw = pytest.importorskip("playwright.async_api", reason="playwright is not installed (pip install playwright)")
needs_chromium = pytest.mark.skipif(chromium_browser.skip_reason() is not None,
                                    reason=str(chromium_browser.skip_reason()))

@pytest.fixture
async def page(gateway):
    async with chromium_browser.chromium() as browser:
        ctx = await browser.new_context(base_url=f"http://127.0.0.1:{gateway.client.port}")
        p = await ctx.new_page()
        p.dialogs = []  # type: ignore[attr-defined]
        p.on("dialog", lambda d: (p.dialogs.append(d.message), d.dismiss()))  # type: ignore[attr-defined]
        await p.goto("/ui/login")
        await p.get_by_label("Token").fill(gateway.org["token"])
        await p.get_by_role("button", name="Log in").click()
        await p.wait_for_url("**/ui/")
        yield p
        await ctx.close()

async def _send(page, *, path: str, method: str = "GET", body: str | None = None) -> None:
    await page.goto("/ui/try")
    await page.get_by_label("Tool").select_option("up")
    await page.get_by_label("Method").select_option(method)
    await page.get_by_label("Path and query").fill(path)
    if body is not None:
        await page.get_by_label("Body").fill(body)
    await page.get_by_role("button", name="Send").click()
    await page.wait_for_load_state()

@needs_chromium
async def test_a_relayed_redirect_shows_its_status_location_headers_and_call(gateway, up, page):
    secret = await gateway.secret("s3cr3t-value", name="up-key")
    await gateway.tool("up", up.url + "/v1", [{"location": "header", "name": "Authorization",
                                               "format": "Bearer {secret}", "secret_id": secret}])
    up.responder = lambda ex: http_response(302, b"moved", reason="Found", headers=[
        ("Location", up.url + "/v1/next?page=2"), ("X-Up", "1")])
    await _send(page, path="/items?limit=1")
    await pw.expect(page.locator("#try-status")).to_have_text("Status 302 Found")
    await pw.expect(page.locator("#try-location")).to_contain_text("/call/up/next?page=2")
    headers = await page.locator("#try-headers").inner_text()
    assert "Location: /call/up/next?page=2" in headers and "X-Up: 1" in headers
    call_id = re.search(r"X-Treg-Call-Id: (call_\w+)", headers).group(1)  # type: ignore[union-attr]
    await pw.expect(page.locator("#try-answer")).to_have_text("moved")
    assert len(up.exchanges) == 1 and up.last.target == "/v1/items?limit=1"  # one call, not followed
    assert up.last.header("Authorization") == "Bearer s3cr3t-value"  # the pipeline's call: key injected
    assert b"treg_session" not in up.last.raw and b"treg_login" not in up.last.raw
    assert "s3cr3t-value" not in await page.content()
    await page.get_by_role("link", name=f"Open call {call_id}").click()
    await pw.expect(page.get_by_role("heading", level=1)).to_contain_text("Call")
    assert page.url.endswith(f"/ui/activity/{call_id}")
    await pw.expect(page.locator("main")).to_contain_text("302")

    # to another host: the /redirect/ link treg rewrote it to, with nothing of the upstream's URL
    up.responder = lambda ex: http_response(307, b"", reason="Temporary Redirect", headers=[
        ("Location", "https://elsewhere.test/landing?sig=abc")])
    await _send(page, path="/post", method="POST", body='{"a": 1}')
    await pw.expect(page.locator("#try-status")).to_have_text("Status 307 Temporary Redirect")
    location = await page.locator("#try-location code").first.inner_text()
    assert location.startswith("/redirect/") and "elsewhere" not in location
    assert up.last.method == "POST" and up.last.body == b'{"a": 1}'
    assert up.last.header("Content-Type") == "application/json"

@needs_chromium
async def test_an_answer_is_shown_as_text_never_run_and_binary_is_named(gateway, up, tool, page):
    up.responder = lambda ex: http_response(200, b"<script>alert('upstream')</script><b>x</b>",
                                            headers=[("Content-Type", "text/html")])
    await _send(page, path="/html")
    await pw.expect(page.locator("#try-answer")).to_have_text("<script>alert('upstream')</script><b>x</b>")
    assert page.dialogs == []  # type: ignore[attr-defined]
    up.responder = lambda ex: http_response(200, b"\x89PNG\r\n\x1a\n\x00\x00\x00", headers=[("Content-Type", "image/png")])
    await _send(page, path="/img")
    await pw.expect(page.locator("#try-answer")).to_have_text("(11 bytes of binary data, not shown)")
    # treg's own refusal: its error body, said to be treg's
    await gateway.api("POST", "/api/v1/deny-rules", json={"host": f"127.0.0.1:{up.port}", "path": "/v1/denied"},
                      expect=201)
    await _send(page, path="/denied")
    await pw.expect(page.locator("#try-status")).to_contain_text("(refused by treg)")
    await pw.expect(page.locator("#try-answer")).to_contain_text('"blame"')

async def test_try_it_over_plain_http_needs_the_csrf_token_and_shows_the_answer(gateway, up, tool):
    up.responder = lambda ex: http_response(301, b"", reason="Moved Permanently",
                                            headers=[("Location", up.url + "/v1/there")])
    csrf = await login(gateway.client, gateway.org["token"])
    form = {"surface": "call", "tool": "up", "method": "GET", "path": "/a b?q=ü&x=%41"}
    resp = await gateway.client.post("/ui/try", data=form)
    assert resp.status == 403 and up.exchanges == []
    resp = await gateway.client.post("/ui/try", data={**form, "csrf": csrf})
    text = await resp.text()
    assert resp.status == 200 and "Status 301 Moved Permanently" in text
    assert "Location: /call/up/there" in text
    # the request as a browser's fetch of /call/up/a b?q=ü&x=%41 would have spelled it
    assert up.last.target == "/v1/a%20b?q=%C3%BC&x=%41"
    # a method the form does not offer, an unknown tool: the form again with the refusal, never a 500
    resp = await gateway.client.post("/ui/try", data={**form, "csrf": csrf, "method": "TRACE"})
    assert resp.status == 400 and "the method must be one of" in await resp.text()
    resp = await gateway.client.post("/ui/try", data={**form, "csrf": csrf, "tool": "nope"})
    assert resp.status == 200 and "Status 404" in await resp.text()
