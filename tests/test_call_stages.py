"""The pipeline's shape (treg/call/): one exit records every failure, whatever stage it came from;
injection plans are compiled when tools (and catalog providers) load, not per call; the one bounded
memo helper stays bounded and keeps no failure."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from treg.call import redirects
from treg.memo import BoundedMemo, memoized
from treg.testing import audit_row, http_response


async def test_a_failure_building_a_streamed_answer_is_recorded_once_and_closes_the_upstream(env, closes,
                                                                                           monkeypatch):
    """The Location rewrite runs after the send, while the answer is made streamable: a bug there is
    the same recorded exit as in any stage (it once escaped unrecorded, the upstream left open)."""
    gw, up, events = env
    up.responder = lambda ex: http_response(302, b"", [("Location", "https://elsewhere.example/x")])

    def broken(*a, **kw):
        raise RuntimeError("a bug while rewriting Location")

    monkeypatch.setattr(redirects, "rewrite_locations", broken)
    r = await gw.call("GET", "/call/t/x", allow_redirects=False)
    body = await r.json()
    assert r.status == 500 and body["error"] == "internal_error" and r.headers["X-Treg-Error"] == "1"
    row = await audit_row(gw, r.headers["X-Treg-Call-Id"])
    assert row["outcome"] == "gateway_failed" and row["failure_kind"] == "unexpected_exception"
    [closer] = await closes.wait_closed(1)
    assert len(closes.effective(closer)) == 1
    assert [e["outcome"] for e in events.named("tool_called")] == ["gateway_failed"]


class CountingInjectors(Mapping):
    """The injector registry, counting every lookup (a plan is compiled from these lookups)."""

    def __init__(self, real):
        self.real, self.lookups = real, 0

    def __getitem__(self, key):
        self.lookups += 1
        return self.real[key]

    def __iter__(self):
        return iter(self.real)

    def __len__(self):
        return len(self.real)


@pytest.mark.parametrize("path", ["/call/k/x", "/catalog/call/files.get?name=a.png",
                                  "/catalog/call/acme.items.get?item_id=1"])
async def test_repeated_calls_reuse_the_compiled_injection_plan(env, path):
    """A tool's plan is compiled when the tools cache loads it, a catalog provider's once: later calls
    look no injector up (catalog calls once did on every call: their memo, keyed by the bindings
    tuple's id(), never hit, since the ladder builds new bindings per call)."""
    gw, up, events = env
    await gw.tool("k", up.url + "/v1", [{"location": "header", "name": "X-Key", "secret_id": await gw.secret("sk-k")}])
    svc = gw.services
    svc.injectors = counting = CountingInjectors(svc.injectors)
    for _ in range(2):  # warm: caches loaded, plans compiled
        assert (await gw.call("GET", path)).status == 200
    before = counting.lookups
    for _ in range(3):
        r = await gw.call("GET", path)
        assert r.status == 200
    assert counting.lookups == before
    assert len(up.exchanges) == 5


def test_bounded_memo_stays_bounded_and_keeps_no_failure():
    memo: BoundedMemo[int, str] = BoundedMemo(3)
    for i in range(10):
        memo.put(i, str(i))
        assert len(memo) <= 3
    assert memo.get(9) == "9" and "9" not in repr(memo)
    made = []

    @memoized(2)
    def parse(text: str) -> int:
        made.append(text)
        return int(text)

    assert parse("1") == 1 and parse("1") == 1 and made == ["1"]
    with pytest.raises(ValueError):
        parse("x")
    with pytest.raises(ValueError):
        parse("x")
    assert made == ["1", "x", "x"] and parse.cache_info().currsize == 1
    parse("2"), parse("3")
    assert parse.cache_info().currsize <= 2


@pytest.mark.parametrize(("headers", "has_type", "has_server"), [
    ([], False, False),
    ([("Content-TYPE", "text/plain"), ("SERVER", "up")], True, True),
    ([("X-Content-Type", "a"), ("Server-Timing", "b"), ("x-server", "c")], False, False),
    ([("content-type-options", "a"), ("a", "content-type"), ("Cache-Control", "private")], False, False),
    ([("Date", "d"), ("server", "up"), ("Content-Length", "3")], False, True),
])
def test_an_answer_in_hand_knows_which_defaults_its_headers_already_have(headers, has_type, has_server):
    """A relayed answer in hand gets no Content-Type or Server header from the edge unless the upstream
    sent none: the names are read exactly, a name that only contains one is another name."""
    from treg.call.state import CallOutcome

    out = CallOutcome.whole_answer(200, headers, b"abc", lambda sent, exc: None)
    assert (out.has_content_type, out.has_server) == (has_type, has_server)
    mine = CallOutcome.whole_answer(200, headers, b"abc", lambda sent, exc: None, relayed=False)
    assert (mine.has_content_type, mine.has_server) == (True, True)
