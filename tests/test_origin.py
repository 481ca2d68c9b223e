"""treg's own origin and path prefix from the settings alone (treg/origin.py): what the login, the
cookie and MCP compare with — never the request's Host header."""

from __future__ import annotations

import pytest

from treg.errors import ConfigError
from treg.origin import own_origins, path_prefix, public_https, public_origin, sent_from
from treg.settings import load


def settings(url: str | None = None):
    return load(environ={"TREG_PUBLIC_URL": url} if url is not None else {})


@pytest.mark.parametrize("url, origin, prefix, https", [
    ("https://gw.example.com/treg", "https://gw.example.com", "/treg", True),
    ("https://gw.example.com/treg/", "https://gw.example.com", "/treg", True),
    ("https://GW.example.com:443/a/b", "https://gw.example.com", "/a/b", True),
    ("http://127.0.0.1:8443/", "http://127.0.0.1:8443", "", False),
    ("https://[::1]:9000", "https://[::1]:9000", "", True),
])
def test_the_public_url_names_origin_prefix_and_scheme(url, origin, prefix, https):
    s = settings(url)
    assert public_origin(s) == origin and path_prefix(s) == prefix and public_https(s) is https
    assert own_origins(s, ("127.0.0.1", 8080)) == {origin}  # the listen address is not it then


def test_without_a_public_url_the_listen_address_is_the_origin():
    s = settings()
    assert path_prefix(s) == "" and not public_https(s) and public_origin(s) is None
    assert own_origins(s, ("127.0.0.1", 8080)) == {"http://127.0.0.1:8080", "http://localhost:8080",
                                                   "http://[::1]:8080"}
    assert own_origins(s, ("10.0.0.5", 8080)) == {"http://10.0.0.5:8080"}
    assert own_origins(s, None) == set()


@pytest.mark.parametrize("url", ["gw.example.com", "ftp://gw.example.com", "https://gw.example.com/?x=1",
                                 "https://gw.example.com/#top", "https://user@gw.example.com/", "https://gw:99999/",
                                 "https://gw.example.com//evil", "https://gw.example.com/a b", "https:///treg"])
def test_a_public_url_treg_could_not_build_an_origin_from_stops_startup(url):
    with pytest.raises(ConfigError):
        settings(url)


def test_sent_from():
    own = {"https://gw.example.com"}
    assert sent_from("https://gw.example.com", None, own)
    assert sent_from("https://GW.example.com:443", None, own)
    assert sent_from(None, "https://gw.example.com/treg/ui/login?next=x", own)
    for origin, referer in ((None, None), ("null", None), ("null", "https://gw.example.com/"),
                            ("https://evil.test", "https://gw.example.com/"), ("http://gw.example.com", None),
                            (None, "https://gw.example.com.evil.test/"), (None, "https://x@gw.example.com/"),
                            (None, "/treg/ui/login"), (None, "null"), ("https://gw.example.com/path", None)):
        assert not sent_from(origin, referer, own), (origin, referer)
