"""One copy of the HTTP grammar (treg/http_grammar.py): the token and CTL patterns match exactly what
the RFCs define, the hop-by-hop names are RFC 9110's, and every module that checks or drops headers
uses these objects instead of a copy of its own."""

from __future__ import annotations

import string
from pathlib import Path

import pytest

from treg import http_grammar
from treg.call import headers
from treg.catalog import load
from treg_plugins import injectors

CHECKOUT = Path(__file__).resolve().parent.parent
TCHAR = set(string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~")  # RFC 9110 §5.6.2


def test_token_is_one_or_more_tchar_and_nothing_else():
    for code in range(256):
        ch = chr(code)
        assert bool(http_grammar.TOKEN.match(ch)) == (ch in TCHAR), repr(ch)
    assert http_grammar.TOKEN.match("X-Api-Key") and not http_grammar.TOKEN.match("")
    for bad in ("X Key", "X:Key", "X-Key\r\nInjected: 1", "Ключ", "X-Key\n"):
        assert not http_grammar.TOKEN.match(bad), bad


def test_ctl_is_exactly_the_control_characters():
    for code in range(256):
        assert bool(http_grammar.CTL.search(chr(code))) == (code < 0x20 or code == 0x7F), code


def test_hop_by_hop_names():
    rfc = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
           "transfer-encoding", "upgrade"}
    assert rfc <= http_grammar.HOP_BY_HOP
    assert http_grammar.PER_HOP == http_grammar.HOP_BY_HOP | {"host", "content-length"}
    assert all(n == n.lower() for n in http_grammar.PER_HOP)  # callers compare lower-cased names


def test_the_relay_the_loader_and_the_injectors_share_one_copy():
    assert headers.HOP_BY_HOP is http_grammar.PER_HOP
    assert load._HOP_BY_HOP is http_grammar.PER_HOP
    assert load._HEADER_TOKEN is http_grammar.TOKEN and injectors._TOKEN is http_grammar.TOKEN
    assert load._CTL is http_grammar.CTL and injectors._CTL is http_grammar.CTL


@pytest.mark.parametrize("literal", [r"[\x00-\x1f\x7f]", r"!#$%&'*+", '"proxy-authenticate"'])
def test_no_other_copy_in_the_source(literal: str):
    copies = [str(f.relative_to(CHECKOUT)) for folder in ("treg", "plugins", "bench")
              for f in (CHECKOUT / folder).rglob("*.py")
              if f.name != "http_grammar.py" and literal in f.read_text()]
    assert copies == [], f"{literal} is copied in {copies}: import it from treg/http_grammar.py"


@pytest.mark.parametrize("name", ["X-Key\n", "X Key", "X-Key\r\nX-Injected: 1"])
async def test_a_binding_header_name_that_is_no_token_is_refused(gateway, up, name: str):
    # "X-Key\n" passed the old pattern (``$`` matches before a final newline): the tool was stored and
    # every call through it failed with a 502 blamed on the upstream, aiohttp refusing to write it
    sid = await gateway.secret("sk_live_grammar")
    resp = await gateway.client.post("/api/v1/tools", headers=gateway.owner, json={
        "name": "t", "base_url": up.url,
        "bindings": [{"location": "header", "name": name, "format": "{secret}", "secret_id": sid}]})
    assert 400 <= resp.status < 500 and resp.headers.get("X-Treg-Error") == "1", await resp.text()
    body = await resp.json()
    assert body["blame"] == "caller" and {"error", "detail", "blame"} <= set(body)
    assert "sk_live_grammar" not in await resp.text()
    assert (await gateway.call("GET", "/call/t/x")).status == 404 and up.exchanges == []
