"""The cookies of treg's host never go upstream (treg/cookie_names.py, docs/clients.md "Cookies of treg's
host stay there"): a browser sends every cookie of treg's host with a call made from treg's origin (a
script's call with the dashboard session, a followed ``/redirect/`` or ``/table/`` link), the session of
the login proxy in front of treg among them. Relayed, that session reached every vendor called. The
built-in names (the common login proxies', ``__Host-``) and ``TREG_HOST_COOKIES`` are taken out of the
``Cookie`` a caller sends; every other cookie goes as it came."""

from __future__ import annotations

import pytest

from treg import membership
from treg.call.headers import request_headers, scrub_cookie
from treg.cookie_names import BUILTIN_HOST_COOKIES, HostCookies
from treg.errors import ConfigError
from treg.keys import SERVICES
from treg.settings import load
from treg.testing import Gateway, raw_upstream

PROXIES = ["_oauth2_proxy=s1", "_oauth2_proxy_1=s1b", "CF_Authorization=jwt", "CF_AppSession=a", "_pomerium=p",
           "authelia_session=x", "AWSELBAuthSessionCookie-0=e", "_forward_auth=f", "VouchCookie=v",
           "mod_auth_openidc_session=m", "_shibsession_abc=s", "authentik_proxy_xyz=k", "__Host-sso=h",
           "__host-SSO=h2", "treg_session=t"]


@pytest.mark.parametrize("cookie", PROXIES)
def test_the_built_in_names_are_the_hosts(cookie):
    name = cookie.split("=")[0]
    assert BUILTIN_HOST_COOKIES.owns(name) and BUILTIN_HOST_COOKIES.owns(name.upper())
    assert scrub_cookie(f"vendor=1; {cookie}; other=2") == "vendor=1; other=2"


@pytest.mark.parametrize("name", ["vendor", "session", "sid", "Host-x", "_host_x", "oauth2_proxy", "xCF_Authorization",
                                  "authelia", "_shibsession"])
def test_an_upstreams_own_cookie_is_relayed(name):
    assert not BUILTIN_HOST_COOKIES.owns(name)
    value = f"{name}=1;  b=2"
    assert scrub_cookie(value) is value  # the caller's bytes, spacing and all


def test_an_operators_names_and_prefixes_are_added():
    host = HostCookies.of(("corp_sso", "gw_*"))
    assert host.owns("corp_sso") and host.owns("CORP_SSO") and host.owns("gw_") and host.owns("gw_session")
    assert not host.owns("corp_sso2") and not host.owns("xgw_a")
    assert host.owns("_oauth2_proxy")  # the built-in names stay
    assert request_headers([("Cookie", "corp_sso=1; gw_a=2"), ("Accept", "*/*")], host) == [("Accept", "*/*")]


def test_the_setting_is_read_and_a_name_that_is_not_one_is_refused():
    assert load(environ={"TREG_HOST_COOKIES": " corp_sso , gw_* "}).host_cookies == ("corp_sso", "gw_*")
    for bad in ("a b", "a;b", "a=b", "é", "*", "x,*"):
        with pytest.raises(ConfigError) as refused:
            load(environ={"TREG_HOST_COOKIES": bad})
        assert "TREG_HOST_COOKIES" in str(refused.value)


async def test_a_browsers_cookies_of_treg_s_host_never_reach_the_vendor(make_app, aiohttp_client):
    async with raw_upstream() as up:
        client = await aiohttp_client(make_app(ssrf_allow=("127.0.0.0/8",), host_cookies=("corp_sso",)))
        org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
        gw = Gateway(client, org)
        await gw.tool("t", up.url)
        jar = "; ".join(["vendor_session=v1", *PROXIES, "corp_sso=c", "CORP_SSO=c2", "lb=7"])
        r = await gw.call("GET", "/call/t/x", headers={"Cookie": jar})
        assert r.status == 200
        assert up.last.header("Cookie") == "vendor_session=v1; lb=7"
        # only the host's cookies: no Cookie header at all
        r = await gw.call("GET", "/call/t/y", headers={"Cookie": "; ".join([*PROXIES, "corp_sso=c"])})
        assert r.status == 200 and up.last.header("Cookie") is None
        sent = b"".join(e.raw for e in up.exchanges)
        for secret in (b"s1", b"jwt", b"corp_sso", b"__Host", b"treg_session"):
            assert secret not in sent
