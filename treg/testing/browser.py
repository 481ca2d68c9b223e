"""Debian's chromium driven by Playwright, for tests of the dashboard (and of what a browser does with
treg's answers: cookies, Origin, redirects). Playwright cannot download browsers here, so the system's
binary is used; a test skips (with the reason) when there is none or Playwright is not installed."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any, AsyncIterator

CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")


def chromium_path() -> str | None:
    """``$TREG_CHROMIUM``, else the first system chromium found, else None."""
    env = os.environ.get("TREG_CHROMIUM")
    for path in ((env,) if env else ()) + CANDIDATES:
        if path and Path(path).exists():
            return path
    return shutil.which("chromium")


def skip_reason() -> str | None:
    """Why a browser test cannot run here (None: it can)."""
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright)"
    if chromium_path() is None:
        return "no chromium binary (apt-get install -y chromium); Playwright cannot download browsers here"
    return None


@contextlib.asynccontextmanager
async def chromium(*, args: tuple[str, ...] = ()) -> AsyncIterator[Any]:
    """A launched headless chromium (a Playwright ``Browser``), closed on exit. ``args`` adds command-line
    switches (``--ignore-certificate-errors`` for a test's self-signed certificate)."""
    from playwright.async_api import async_playwright

    path = chromium_path()
    if path is None:
        raise RuntimeError(skip_reason())
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=path, args=["--no-sandbox", *args])
        try:
            yield browser
        finally:
            await browser.close()


async def log_in(page: Any, token: str) -> None:
    """Log a Playwright page into the dashboard with ``token``, as a person does (the form, its button)."""
    await page.goto("/ui/login")
    await page.get_by_label("Token").fill(token)
    await page.get_by_role("button", name="Log in").click()
    await page.wait_for_url("**/ui/")


async def logged_in(browser: Any, base_url: str, token: str) -> Any:
    """A page of a new context of ``browser``, logged in to the dashboard at ``base_url`` with ``token``
    (on the Overview, ``/ui/``); ``page.seen_5xx`` collects the URL of every answer of 500 or more."""
    ctx = await browser.new_context(base_url=base_url)
    page = await ctx.new_page()
    page.seen_5xx = []
    page.on("response", lambda r: page.seen_5xx.append(r.url) if r.status >= 500 else None)
    await log_in(page, token)
    return page


async def nav(page: Any, name: str) -> None:
    """Follow the dashboard's main navigation link ``name``."""
    await page.get_by_role("navigation", name="Main").get_by_role("link", name=name, exact=True).click()
