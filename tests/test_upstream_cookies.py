"""An upstream's cookies go back to that tool only (treg/call/cookies.py). Every upstream answers on treg's
origin, so a client's cookie jar files them all under treg's host; with ``Path=/`` (a session's, a load
balancer's) a cookie of tool A's vendor went out with the caller's next call of tool B, and treg relayed
that ``Cookie`` header to B's vendor. Driven with httpx's own cookie jar (the OpenAI and Anthropic SDKs'
client) over real sockets: each tool's upstream records what it received."""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator

import httpx

from treg import membership
from treg.call.cookies import scoped
from treg.keys import SERVICES
from treg.testing import Gateway, http_response, raw_upstream

SESSION = "A-session-9c1d"


def _sets_cookies(ex) -> bytes:
    return http_response(200, b"a", [("Set-Cookie", f"sid={SESSION}; Path=/; HttpOnly"),
                                     ("Set-Cookie", "lb=sticky-1; path=/; Max-Age=300")])


def _cookie(up) -> str | None:
    return up.exchanges[-1].header("cookie")


@contextlib.asynccontextmanager
async def _two_tools(make_app, aiohttp_client, answer_a) -> AsyncIterator[tuple[str, str, Any, Any]]:
    """(treg's base URL, the org's token, upstream a, upstream b): tools ``a`` (answering ``answer_a``) and
    ``b`` of one org, over real sockets."""
    async with raw_upstream(answer_a) as a, raw_upstream(lambda ex: http_response(200, b"b")) as b:
        client = await aiohttp_client(make_app(ssrf_allow=("127.0.0.0/8",)))
        org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
        gw = Gateway(client, org)
        await gw.tool("a", a.url)
        await gw.tool("b", b.url)
        try:
            yield f"http://127.0.0.1:{client.port}", org["token"], a, b
        finally:
            await client.close()


async def test_one_tools_cookies_never_reach_another_tools_upstream(make_app, aiohttp_client):
    async with _two_tools(make_app, aiohttp_client, _sets_cookies) as (base, token, a, b):
        async with httpx.AsyncClient(base_url=base, headers={"X-Treg-Token": token}) as http:
            first = await http.get("/call/a/login")
            assert first.status_code == 200
            assert first.headers.get_list("set-cookie") == [
                f"sid={SESSION}; HttpOnly; Path=/call/a", "lb=sticky-1; Max-Age=300; Path=/call/a"]
            assert (await http.get("/call/b/anything")).status_code == 200
            assert _cookie(b) is None  # tool b's vendor never sees tool a's session
            await http.get("/call/a/again")
            assert _cookie(a) == f"sid={SESSION}; lb=sticky-1"  # tool a's own calls carry it
            # the passthrough form: scoped to the host called, and again never sent to the other one
            await http.get(f"/call/{a.url}/p")
            await http.get(f"/call/{b.url}/q")
            assert _cookie(b) is None
            http.cookies.clear()
            await http.get(f"/call/{a.url}/p")
            await http.get(f"/call/{a.url}/deeper/r")
            assert _cookie(a) == f"sid={SESSION}; lb=sticky-1"
            await http.get(f"/call/{b.url}/q")
            assert _cookie(b) is None


async def test_a_cookies_domain_is_dropped_and_its_path_is_the_tools_behind_a_prefix(make_app, aiohttp_client):
    """A ``Domain`` would widen the cookie to treg's parent domain and every site under it (cookie tossing):
    dropped, in any spelling; behind a proxy's path prefix (``TREG_PUBLIC_URL``) the path carries it."""
    assert scoped("x=1; Domain=.example.com; DOMAIN = example.com ;Path=/v1; Secure", "/call/t") == \
        "x=1; Secure; Path=/call/t"
    async with raw_upstream(lambda ex: http_response(200, b"a", [("Set-Cookie", "x=1; domain=example.com")])) as up:
        client = await aiohttp_client(make_app(ssrf_allow=("127.0.0.0/8",), public_url="https://gw.example.com/treg"))
        org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
        gw = Gateway(client, org)
        await gw.tool("t", up.url)
        try:
            r = await gw.call("GET", "/call/t/x")
            assert r.headers.getall("Set-Cookie") == ["x=1; Path=/treg/call/t"]
        finally:
            await client.close()


async def test_a_set_cookie_a_client_reads_as_two_cookies_is_not_relayed(make_app, aiohttp_client):
    """``a=1 b=2`` is two cookies to Python's ``http.cookies`` (aiohttp's client jar), the first with no
    ``Path``: the client's default path, ``/call`` for a call of ``/call/<tool>`` itself, so every tool.
    Such a value is left out; a quoted value with a blank is one cookie and is relayed, scoped. Driven with
    aiohttp's own cookie jar."""
    import aiohttp

    answers = [("Set-Cookie", "sid=A-1 other=2"), ("Set-Cookie", "lb=3, x=4"), ("Set-Cookie", 'q="two words"')]
    answer = lambda ex: http_response(200, b"a", answers)  # noqa: E731
    async with _two_tools(make_app, aiohttp_client, answer) as (base, token, a, b):
        async with aiohttp.ClientSession(base, cookie_jar=aiohttp.CookieJar(unsafe=True),
                                         headers={"X-Treg-Token": token}) as http:
            async with http.get("/call/a") as r:  # the tool's root: a path-less cookie would cover /call
                assert r.status == 200
                assert r.headers.getall("Set-Cookie") == ['q="two words"; Path=/call/a']
            async with http.get("/call/b/x") as r:
                assert r.status == 200
            assert _cookie(b) is None
