"""A small OAuth 2.0 provider over a real socket on 127.0.0.1, for the tests that must count and script the
token endpoint (the real, independent server is :mod:`treg.testing.oauth_server`, Django OAuth Toolkit).

``FakeOAuth`` serves:

* ``GET /authorize``: checks what an authorization request must carry (``response_type=code``, the
  client id, the redirect URI, PKCE S256) and answers 302 to the redirect URI with a code (``deny=True``:
  ``error=access_denied``), as a provider does once its user consented;
* ``POST /token``: ``authorization_code`` (the PKCE verifier checked against the challenge, each code once)
  and ``refresh_token`` (rotating the refresh token when ``rotate``), client authentication checked
  (HTTP Basic or in the body); every request counted (``token_requests``), its form kept;
  ``mode`` scripts the refresh answer: ``ok``, ``slow`` (``delay_s`` first), ``down`` (500),
  ``not_json``, ``invalid_grant``;
* ``POST /revoke`` (RFC 7009), recorded;
* ``GET /api/items`` and ``GET /api/me``: the resource, 200 with the token's grant, 401 for an unknown,
  revoked or expired token.

``provider_row(fake)`` is the catalog row declaring it (``oauthy``); ``write_plugin`` writes the same row
as a plugin file for ``treg serve`` processes; ``oauth_gateway`` is a treg serving a row, with an org
and its OAuth app.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import html
import json
import re
import secrets as pysecrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator
from urllib.parse import parse_qsl, unquote_plus, urlencode

from aiohttp import web

CLIENT_ID = "treg-test-client"
CLIENT_SECRET = "cs-very-secret-client-9f1e"
PROVIDER = "oauthy"


@dataclass
class Grant:
    user: str
    scope: str
    refresh_token: str | None


@dataclass
class FakeOAuth:
    client_id: str = CLIENT_ID
    client_secret: str = CLIENT_SECRET
    expires_in: int | None = 3600
    rotate: bool = True
    mode: str = "ok"
    delay_s: float = 0.0
    deny: bool = False
    #: answer without a refresh_token on the code exchange
    no_refresh: bool = False
    token_requests: list[dict[str, str]] = field(default_factory=list)
    revoked: list[dict[str, str]] = field(default_factory=list)
    authorize_requests: list[dict[str, str]] = field(default_factory=list)
    resource_calls: list[str] = field(default_factory=list)
    #: access token → (grant, expiry)
    access: dict[str, tuple[Grant, float]] = field(default_factory=dict)
    refresh_tokens: dict[str, Grant] = field(default_factory=dict)
    codes: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # code → (challenge, redirect, scope)
    port: int = 0
    _runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def refreshes(self) -> int:
        return sum(1 for f in self.token_requests if f.get("grant_type") == "refresh_token")

    # -- the server ---------------------------------------------------------------------------------
    async def __aenter__(self) -> "FakeOAuth":
        app = web.Application()
        app.router.add_get("/authorize", self._authorize)
        app.router.add_post("/token", self._token)
        app.router.add_post("/revoke", self._revoke)
        app.router.add_get("/api/items", self._resource)
        app.router.add_get("/api/me", self._resource)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _authorize(self, request: web.Request) -> web.Response:
        q = dict(request.query)
        self.authorize_requests.append(q)
        redirect = q.get("redirect_uri", "")
        ok = (q.get("response_type") == "code" and q.get("client_id") == self.client_id and redirect
              and q.get("code_challenge_method") == "S256" and q.get("code_challenge") and q.get("state"))
        if not ok:
            return web.Response(status=400, text="bad authorization request")
        if self.deny:
            raise web.HTTPFound(redirect + "?" + urlencode({"error": "access_denied", "state": q["state"]}))
        code = "code-" + pysecrets.token_urlsafe(16)
        self.codes[code] = (q["code_challenge"], redirect, q.get("scope", ""))
        raise web.HTTPFound(redirect + ("&" if "?" in redirect else "?") + urlencode({"code": code,
                                                                                       "state": q["state"]}))

    def _client_ok(self, request: web.Request, form: dict[str, str]) -> bool:
        auth = request.headers.get("Authorization", "")
        if auth.startswith("Basic "):
            user, _, pw = base64.b64decode(auth[6:]).decode().partition(":")
            return unquote_plus(user) == self.client_id and unquote_plus(pw) == self.client_secret
        return form.get("client_id") == self.client_id and form.get("client_secret") == self.client_secret

    def _issue(self, grant: Grant, *, new_refresh: bool) -> dict[str, Any]:
        token = "at-" + pysecrets.token_urlsafe(24)
        self.access[token] = (grant, time.time() + (self.expires_in if self.expires_in is not None else 10 ** 9))
        out: dict[str, Any] = {"access_token": token, "token_type": "Bearer", "scope": grant.scope}
        if self.expires_in is not None:
            out["expires_in"] = self.expires_in
        if new_refresh:
            refresh = "rt-" + pysecrets.token_urlsafe(24)
            if grant.refresh_token:
                self.refresh_tokens.pop(grant.refresh_token, None)
            grant.refresh_token = refresh
            self.refresh_tokens[refresh] = grant
            out["refresh_token"] = refresh
        return out

    async def _token(self, request: web.Request) -> web.Response:
        form = dict(parse_qsl((await request.read()).decode(), keep_blank_values=True))
        self.token_requests.append(form)
        if not self._client_ok(request, form):
            return web.json_response({"error": "invalid_client"}, status=401)
        kind = form.get("grant_type")
        if kind == "authorization_code":
            found = self.codes.pop(form.get("code", ""), None)
            verifier = form.get("code_verifier", "")
            challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
            if found is None or found[0] != challenge or found[1] != form.get("redirect_uri"):
                return web.json_response({"error": "invalid_grant"}, status=400)
            grant = Grant(user="alice", scope=found[2], refresh_token=None)
            return web.json_response(self._issue(grant, new_refresh=not self.no_refresh))
        if kind == "refresh_token":
            if self.mode == "slow":
                await asyncio.sleep(self.delay_s)
            if self.mode == "down":
                return web.Response(status=500, text="upstream exploded")
            if self.mode == "not_json":
                return web.Response(status=200, text="<html>maintenance</html>", content_type="text/html")
            grant = self.refresh_tokens.get(form.get("refresh_token", ""))
            if self.mode == "invalid_grant" or grant is None:
                return web.json_response({"error": "invalid_grant", "error_description": "revoked"}, status=400)
            return web.json_response(self._issue(grant, new_refresh=self.rotate))
        return web.json_response({"error": "unsupported_grant_type"}, status=400)

    async def _revoke(self, request: web.Request) -> web.Response:
        form = dict(parse_qsl((await request.read()).decode(), keep_blank_values=True))
        if not self._client_ok(request, form):
            return web.json_response({"error": "invalid_client"}, status=401)
        self.revoked.append(form)
        grant = self.refresh_tokens.pop(form.get("token", ""), None)
        self.access.pop(form.get("token", ""), None)
        if grant is not None:
            for token in [t for t, (g, _) in self.access.items() if g is grant]:
                del self.access[token]
        return web.Response(status=200)

    async def _resource(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else ""
        self.resource_calls.append(token)
        found = self.access.get(token)
        if found is None or found[1] < time.time():
            return web.json_response({"error": "invalid_token"}, status=401,
                                     headers={"WWW-Authenticate": 'Bearer error="invalid_token"'})
        return web.json_response({"user": found[0].user, "scope": found[0].scope, "path": request.path})

    def expire_all(self) -> None:
        """Every access token issued so far stops working (the provider's clock moved past them)."""
        for token, (grant, _) in list(self.access.items()):
            self.access[token] = (grant, 0.0)


def provider_row(base: str, *, pid: str = PROVIDER, revoke: bool = True, scopes: tuple[str, ...] = ("items.read",),
                 client_auth: str = "basic") -> dict[str, Any]:
    """The catalog row of a provider served at ``base`` (the fake, or any server with the same paths)."""
    oauth: dict[str, Any] = {"authorize_url": f"{base}/authorize", "token_url": f"{base}/token",
                             "scopes": list(scopes), "client_auth": client_auth}
    if revoke:
        oauth["revoke_url"] = f"{base}/revoke"
    return {
        "id": pid, "name": "Oauthy", "base_url": f"{base}/api",
        "auth": [{"location": "header", "name": "Authorization", "format": "Bearer {secret}"}],
        "oauth": oauth,
        "endpoints": [
            {"id": f"{pid}.items.list", "method": "GET", "path": "/items", "params": [],
             "price": {"per_call_micro": 0}},
            {"id": f"{pid}.me", "method": "GET", "path": "/me", "params": [], "price": {"per_call_micro": 0}},
        ],
    }


def write_plugin(folder: Path, row: dict[str, Any], name: str = "oauth_vendor") -> Path:
    """A plugin file declaring ``row`` (for ``TREG_PLUGINS_DIR`` of ``treg serve`` processes)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text("import json\n\nfrom treg import hookimpl\n\nROW = json.loads(" + repr(json.dumps(row)) + ")\n\n\n"
                    "@hookimpl\ndef treg_register_providers():\n    return [ROW]\n")
    return path


@dataclass
class Consent:
    """What a consent driven over plain HTTP saw (:func:`consent_by_http`)."""

    page: str
    authorize_url: str
    callback_status: int
    callback_body: str
    callback_location: str | None
    cookie: str | None


_TOKEN_FIELD = re.compile(r'name="consent_token" value="([^"]+)"')


async def consent_by_http(connect_url: str, *, origin: str | None = None, follow_authorize: bool = True) -> Consent:
    """A person's browser, as plain HTTP: open ``connect_url``, press the button (the page's token, an
    ``Origin`` of treg's own unless given), follow the provider's redirect back to treg's callback with
    the ``treg_oauth_state`` cookie, as a browser keeps it."""
    import aiohttp
    from urllib.parse import urlsplit

    parts = urlsplit(connect_url)
    own = origin or f"{parts.scheme}://{parts.netloc}"
    jar = aiohttp.CookieJar(unsafe=True)  # cookies for 127.0.0.1, as a browser keeps them
    async with aiohttp.ClientSession(cookie_jar=jar) as http:
        async with http.get(connect_url) as r:
            page = await r.text()
            assert r.status == 200, (r.status, page)
        token = _TOKEN_FIELD.search(page)
        assert token is not None, page
        async with http.post(connect_url, data={"consent_token": html.unescape(token.group(1))},
                             headers={"Origin": own}, allow_redirects=False) as r:
            assert r.status == 302, (r.status, await r.text())
            authorize = r.headers["Location"]
        cookie = next((c.value for c in jar if c.key == "treg_oauth_state"), None)
        if not follow_authorize:
            return Consent(page, authorize, 0, "", None, cookie)
        async with http.get(authorize, allow_redirects=False) as r:
            assert r.status in (302, 303), (r.status, await r.text())
            back = r.headers["Location"]
        async with http.get(back, allow_redirects=False) as r:
            return Consent(page, authorize, r.status, await r.text(), r.headers.get("Location"), cookie)


@contextlib.asynccontextmanager
async def oauth_gateway(aiohttp_client: Any, make_app: Any, row: dict[str, Any], *,
                        client: tuple[str, str] | None = (CLIENT_ID, CLIENT_SECRET), slug: str = "acme",
                        **settings: Any) -> AsyncIterator[Any]:
    """A treg whose catalog holds ``row`` (relaying to 127.0.0.0/8), with org ``slug`` (owner
    ``owner@<slug>.test``) and, unless ``client`` is None, the org's own OAuth app at the row's provider;
    a :class:`treg.testing.gateway.Gateway`, closed on exit."""
    from treg import membership
    from treg.keys import SERVICES
    from treg.testing.gateway import Gateway
    from treg.testing.providers import ProviderPlugin

    app = make_app(extra_plugins=(ProviderPlugin([row]),), **{"ssrf_allow": ("127.0.0.0/8",), **settings})
    test_client = await aiohttp_client(app)
    try:
        org = await membership.create_org(test_client.app[SERVICES], slug=slug, email=f"owner@{slug}.test")
        gw = Gateway(test_client, org)
        if client is not None:
            await gw.api("PUT", f"/api/v1/oauth-apps/{row['id']}",
                         json={"client_id": client[0], "client_secret": client[1]}, expect=200)
        yield gw
    finally:
        await test_client.close()
