"""A real OAuth 2.0 authorization server that nobody on this project wrote, for the OAuth tests: Django OAuth
Toolkit (``django`` and ``django-oauth-toolkit``, the ``test`` extra) over SQLite, PKCE required, refresh
tokens rotated, RFC 7009 revocation, a login form of its own; run as a subprocess on 127.0.0.1 and
stopped by its PID.

:class:`DotServer` writes a small Django project into a folder (settings, URLs, a login template, the
resource views and a middleware counting token requests), migrates it, creates the user ``alice`` and a
confidential application whose redirect URI is treg's callback, then runs Django's development server on
a free port. Nothing here imports Django: treg never depends on it, only this subprocess does.

* ``/o/authorize/``, ``/o/token/``, ``/o/revoke_token/``: DOT's own views;
* ``/accounts/login/``: Django's login view (fields labelled ``Username`` and ``Password``);
* ``/api/items``, ``/api/me``: the resource, 200 with the token's user and scope, 401 for a token DOT does
  not take (unknown, expired, revoked);
* ``/count``: how many token requests DOT answered, by grant type (counted from its own log of them).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from treg.testing.processes import free_port

CLIENT_ID = "treg-dot-client"
CLIENT_SECRET = "dot-client-secret-7c2b41a9"
USERNAME = "alice"
PASSWORD = "alice-password-5f3e"
SCOPES = {"items.read": "Read your items", "items.write": "Change your items"}

_SETTINGS = '''
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "dot-test-only-not-secret-0123456789abcdefghijklmnopqrstuvwxyz"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
INSTALLED_APPS = ["django.contrib.auth", "django.contrib.contenttypes", "django.contrib.sessions",
                  "django.contrib.messages", "oauth2_provider", "dotsite"]
MIDDLEWARE = ["dotsite.counting.CountTokenRequests", "django.contrib.sessions.middleware.SessionMiddleware",
              "django.middleware.common.CommonMiddleware", "django.middleware.csrf.CsrfViewMiddleware",
              "django.contrib.auth.middleware.AuthenticationMiddleware",
              "django.contrib.messages.middleware.MessageMiddleware"]
ROOT_URLCONF = "dotsite.urls"
TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates", "DIRS": [BASE_DIR / "templates"],
              "APP_DIRS": True, "OPTIONS": {"context_processors": [
                  "django.template.context_processors.request", "django.contrib.auth.context_processors.auth",
                  "django.contrib.messages.context_processors.messages"]}}]
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": BASE_DIR / "db.sqlite3",
                         "OPTIONS": {"timeout": 20}}}
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGIN_URL = "/accounts/login/"
SESSION_COOKIE_NAME = "dot_session"
CSRF_COOKIE_NAME = "dot_csrftoken"
OAUTH2_PROVIDER = {
    "PKCE_REQUIRED": True,
    "ROTATE_REFRESH_TOKEN": True,
    "REFRESH_TOKEN_GRACE_PERIOD_SECONDS": 0,
    "ACCESS_TOKEN_EXPIRE_SECONDS": %(expires)d,
    "SCOPES": %(scopes)r,
    "DEFAULT_SCOPES": ["items.read"],
}
LOGGING = {"version": 1, "disable_existing_loggers": False}
COUNT_FILE = BASE_DIR / "token_requests.log"
'''

_COUNTING = '''
import json

from django.conf import settings


class CountTokenRequests:
    """Appends the grant type of every request to the token endpoint (never a value of it) to a file."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        kind = None
        if request.path == "/o/token/" and request.method == "POST":
            kind = request.POST.get("grant_type", "")
        response = self.get_response(request)
        if kind is not None:
            with open(settings.COUNT_FILE, "a") as fh:
                fh.write(json.dumps({"grant_type": kind, "status": response.status_code}) + "\\n")
        return response
'''

_VIEWS = '''
import json
from pathlib import Path

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from oauth2_provider.oauth2_backends import get_oauthlib_core


def _resource(request):
    valid, r = get_oauthlib_core().verify_request(request, scopes=[])
    if not valid:
        resp = JsonResponse({"error": "invalid_token"}, status=401)
        resp["WWW-Authenticate"] = 'Bearer error="invalid_token"'
        return resp
    return JsonResponse({"user": r.user.username, "scope": r.access_token.scope, "path": request.path})


def items(request):
    return _resource(request)


def me(request):
    return _resource(request)


def count(request):
    lines = Path(settings.COUNT_FILE).read_text().splitlines() if Path(settings.COUNT_FILE).exists() else []
    out = {}
    for line in lines:
        kind = json.loads(line)["grant_type"]
        out[kind] = out.get(kind, 0) + 1
    return JsonResponse(out)
'''

_URLS = '''
from django.contrib.auth import views as auth_views
from django.urls import include, path

from dotsite import views

urlpatterns = [
    path("o/", include("oauth2_provider.urls", namespace="oauth2_provider")),
    path("accounts/login/", auth_views.LoginView.as_view(template_name="login.html")),
    path("api/items", views.items),
    path("api/me", views.me),
    path("count", views.count),
]
'''

_LOGIN = '''<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Sign in to Dot</title></head>
<body><h1>Sign in to Dot</h1>
<form method="post">{% csrf_token %}
<label for="id_username">Username</label> <input id="id_username" name="username" autocomplete="username">
<label for="id_password">Password</label> <input id="id_password" name="password" type="password">
<input type="hidden" name="next" value="{{ next }}">
<button type="submit">Sign in</button>
</form>{% if form.errors %}<p>Wrong username or password.</p>{% endif %}</body></html>
'''

_SETUP = '''
from django.contrib.auth import get_user_model
from oauth2_provider.models import Application

User = get_user_model()
User.objects.create_user(%(user)r, password=%(password)r)
Application.objects.create(name="treg", client_id=%(client_id)r, client_secret=%(client_secret)r,
                           client_type=Application.CLIENT_CONFIDENTIAL,
                           authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
                           redirect_uris=%(redirect_uris)r, skip_authorization=False, algorithm="")
'''


class DotServer:
    """Django OAuth Toolkit on 127.0.0.1 (``url``), with the user ``alice`` and treg's application."""

    def __init__(self, folder: Path, redirect_uris: list[str], *, expires_s: int = 3600) -> None:
        self.folder = folder
        self.redirect_uris = redirect_uris
        self.expires_s = expires_s
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = folder / "server.log"

    # -- the project ----------------------------------------------------------------------------------
    def _write(self) -> None:
        site = self.folder / "dotsite"
        (site).mkdir(parents=True, exist_ok=True)
        (self.folder / "templates").mkdir(exist_ok=True)
        (site / "__init__.py").write_text("")
        (site / "settings.py").write_text(_SETTINGS % {"expires": self.expires_s, "scopes": SCOPES})
        (site / "counting.py").write_text(_COUNTING)
        (site / "views.py").write_text(_VIEWS)
        (site / "urls.py").write_text(_URLS)
        (self.folder / "templates" / "login.html").write_text(_LOGIN)
        (self.folder / "manage.py").write_text(textwrap.dedent('''
            import os, sys
            os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dotsite.settings")
            from django.core.management import execute_from_command_line
            execute_from_command_line(sys.argv)
        '''))

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "TREG_"))}
        env["DJANGO_SETTINGS_MODULE"] = "dotsite.settings"
        env["PYTHONPATH"] = str(self.folder)
        return env

    def _manage(self, *args: str) -> None:
        done = subprocess.run([sys.executable, "manage.py", *args], cwd=self.folder, env=self._env(),
                              capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)} failed: {done.stderr[-4000:]}")

    def start(self, wait_s: float = 60) -> "DotServer":
        self._write()
        self._manage("migrate", "--noinput")
        self._manage("shell", "-c", _SETUP % {"user": USERNAME, "password": PASSWORD, "client_id": CLIENT_ID,
                                              "client_secret": CLIENT_SECRET,
                                              "redirect_uris": " ".join(self.redirect_uris)})
        fh = open(self.log, "ab")  # noqa: SIM115 (closed in stop)
        self._fh = fh
        self.proc = subprocess.Popen([sys.executable, "manage.py", "runserver", f"127.0.0.1:{self.port}",
                                      "--noreload"], cwd=self.folder, env=self._env(), stdout=fh, stderr=fh)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the DOT server exited {self.proc.returncode}: {self.log.read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(self.url + "/count", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"the DOT server never answered: {self.log.read_text()[-4000:]}")

    def stop(self) -> None:
        """SIGTERM by PID, SIGKILL if it does not go."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        fh = getattr(self, "_fh", None)
        if fh is not None and not fh.closed:
            fh.close()

    def __enter__(self) -> "DotServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- what the tests read --------------------------------------------------------------------------
    def token_requests(self) -> dict[str, int]:
        """Token requests DOT answered so far, by grant type (``refresh_token``, ``authorization_code``)."""
        with urllib.request.urlopen(self.url + "/count", timeout=10) as resp:
            return json.loads(resp.read())

    def refreshes(self) -> int:
        return self.token_requests().get("refresh_token", 0)

    def provider_row(self, pid: str = "dot", *, scopes: tuple[str, ...] = ("items.read",)) -> dict[str, Any]:
        """The catalog row of this server as a treg provider (its URLs are http on 127.0.0.1: a treg with
        ``TREG_SSRF_ALLOW`` set takes them)."""
        return {
            "id": pid, "name": "Dot", "base_url": f"{self.url}/api",
            "auth": [{"location": "header", "name": "Authorization", "format": "Bearer {secret}"}],
            "oauth": {"authorize_url": f"{self.url}/o/authorize/", "token_url": f"{self.url}/o/token/",
                      "revoke_url": f"{self.url}/o/revoke_token/", "scopes": list(scopes), "client_auth": "basic"},
            "endpoints": [
                {"id": f"{pid}.items.list", "method": "GET", "path": "/items", "params": [],
                 "price": {"per_call_micro": 0}},
                {"id": f"{pid}.me", "method": "GET", "path": "/me", "params": [], "price": {"per_call_micro": 0}},
            ],
        }


async def consent_in_browser(browser: Any, connect_url: str, *, deny: bool = False,
                             username: str = USERNAME, password: str = PASSWORD) -> Any:
    """A person in Chromium (a Playwright ``Browser``): opens ``connect_url``, presses the consent page's
    button, signs in at DOT's own login form, and authorizes (``deny``: cancels) on DOT's page; returns the
    page treg's callback answered with (its ``response``: the callback's answer)."""
    ctx = await browser.new_context()
    page = await ctx.new_page()
    await page.goto(connect_url)
    await page.get_by_role("button", name="Continue to Dot").click()
    await page.wait_for_url("**/accounts/login/**")
    await page.get_by_label("Username").fill(username)
    await page.get_by_label("Password").fill(password)
    await page.get_by_role("button", name="Sign in").click()
    await page.wait_for_url("**/o/authorize/**")
    async with page.expect_response(lambda r: "/oauth/callback" in r.url) as answer:
        await page.get_by_role("button", name="Cancel" if deny else "Authorize").click()
    response = await answer.value
    await page.wait_for_load_state()
    page.callback_status = response.status  # type: ignore[attr-defined]
    return page
