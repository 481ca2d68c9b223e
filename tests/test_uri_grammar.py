"""The strict grammar a Location must pass to be rewritten (treg/uri_grammar.py): a table of what it
accepts and what it refuses. tests/test_malformed_locations.py follows the refused spellings with real
clients; this pins the grammar itself, clause by clause."""

from __future__ import annotations

import pytest

from treg.uri_grammar import resolve

BASE = "https://up.example/a/b?q=1"


@pytest.mark.parametrize("value,expected", [
    ("/x/y?z=1#f", "https://up.example/x/y?z=1#f"),
    ("?page=2", "https://up.example/a/b?page=2"),
    ("#frag", "https://up.example/a/b?q=1#frag"),
    ("", BASE),  # an empty Content-Location is the request's own URL
    ("../c/./d", "https://up.example/c/d"),
    ("c", "https://up.example/a/c"),
    ("//other.example/p", "https://other.example/p"),  # scheme-relative: the upstream's scheme
    ("HTTP://Other.Example:8080/p", "http://Other.Example:8080/p"),
    ("http://[2001:db8::1]:8443/p", "http://[2001:db8::1]:8443/p"),
    ("http://10.0.0.1/p", "http://10.0.0.1/p"),
    ("http://xn--bcher-kva.example/", "http://xn--bcher-kva.example/"),
    ("http://a.example./p", "http://a.example./p"),
    ("http://a_b.example/p%2Fq%00", "http://a_b.example/p%2Fq%00"),
    ("http://a.example/p#@b.example", "http://a.example/p#@b.example"),
    ("/p?a=b&c=d;e!$'()*+,=:@/?", "https://up.example/p?a=b&c=d;e!$'()*+,=:@/?"),
])
def test_accepted_and_resolved(value, expected):
    assert resolve(BASE, value) == expected


@pytest.mark.parametrize("value", [
    "http://x[@evil.example/", "http://a]b@evil.example/", "http://[::1/x", "http://[::1]x/", "http://[v1.a]/",
    "http://[fe80::1%25eth0]/", "/p?a[b]=1", "/p#[x]",
    "http:////evil.example/", "http:///evil.example/", "http:/evil.example/", "http:evil.example/", "////evil/",
    "ftp://evil.example/", "javascript:alert(1)", "myapp://done", "data:text/html,x", "urn:isbn:1",
    "http://u:p@evil.example/", "http://@evil.example/", "http://[::1]@evil.example/",
    "\\\\evil.example/", "/\\evil.example/", "http:\\\\evil.example/", "http://evil.example\\@a/",
    "/\t/evil.example/", "http://evil.example\t/", "/a b", "/a\x00b", "/a\x7fb", "/\u00e9",
    "http://\u00e9vil.example/", "http://\uff11\uff12\uff17.0.0.1/", "http://evil%2eexample/",
    "http://127.1/", "http://0x7f.0.0.1/", "http://2130706433/", "http://1.2.3.4.5/", "http://01.2.3.4/",
    "http://a..example/", "http://.example/", "http://a.example:/", "http://a.example:080/",
    "http://a.example:65536/", "http://a.example:0/", "http://a.example:1:2/", "http://a!b.example/",
    "/p%zz", "/p%4", "http://a.example/\"x\"", "/<x>", "/{x}", "/|", "/^", "/`",
])
def test_refused(value):
    assert resolve(BASE, value) is None
