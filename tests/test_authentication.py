"""Who is calling (issue 21, item 3): ``Identity`` importable without the pipeline, and a credential
that is not a token as a plain class the authenticator asks for the caller."""

from __future__ import annotations

import subprocess
import sys

import pytest

from treg import authentication
from treg.errors import Forbidden, Unauthorized
from treg.identity import Credential, Identity
from treg.ui_sessions import SessionCookie


def test_identity_imports_nothing_of_the_pipeline():
    # a fresh process (-I: only what is installed): the catalog's ladder and the call stages take an
    # Identity, so its module must not pull in Services, the pipeline or the database
    code = "import sys, treg.identity; print(' '.join(sorted(m for m in sys.modules if m.startswith('treg'))))"
    done = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["treg", "treg.errors", "treg.identity"]


class Fixed(Credential):
    """A credential kind of a test's own: always the same caller."""

    __slots__ = ("ident", "asked")

    def __init__(self, ident: Identity) -> None:
        self.ident, self.asked = ident, 0

    async def identity(self, svc: object) -> Identity:
        self.asked += 1
        return self.ident


async def test_the_authenticator_asks_a_credential_kind_for_the_caller(gateway):
    svc, org = gateway.services, gateway.org
    ident = await authentication.authenticate(svc, org["token"], None)
    assert authentication.cached_identity(svc, org["token"], "acme") == ident  # a token: the live cache knows it
    cred = Fixed(ident)
    assert not isinstance(cred, str) and repr(cred) == "Fixed('***')"
    # never read as a token: the hot path leaves it to authenticate, which asks the credential itself
    assert authentication.cached_identity(svc, cred, "acme") is None and cred.asked == 0
    assert await authentication.authenticate(svc, cred, "acme") == ident and cred.asked == 1
    # X-Treg-Org is checked against what the credential found, as for a token
    with pytest.raises(Forbidden) as refused:
        await authentication.authenticate(svc, cred, "globex")
    assert refused.value.code == "wrong_org"


async def test_the_session_cookie_is_a_credential_kind_that_keeps_its_values_out_of_a_repr(gateway):
    cookie = SessionCookie("sid-not-for-logs", "csrf-not-for-logs")
    assert isinstance(cookie, Credential) and not isinstance(cookie, str)
    assert "not-for-logs" not in repr(cookie)
    with pytest.raises(Unauthorized) as refused:
        await authentication.authenticate(gateway.services, cookie, None)
    assert refused.value.code == "invalid_session"
    with pytest.raises(Unauthorized) as refused:
        await authentication.authenticate(gateway.services, SessionCookie("sid", None), None)
    assert refused.value.code == "missing_csrf"
