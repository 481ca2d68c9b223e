"""An MCP request is authenticated once, and its answer drained the way the HTTP edge drains one.

``POST /mcp`` identifies its caller at the edge (the 401 with ``WWW-Authenticate`` is the edge's); the
``tools/call`` it runs goes through the pipeline with that identity, not with the token to look up
again: one identity-cache read and at most one tokens-table query per request, cold or warm. The body
of a relayed answer reaches the caller's socket (``/call/``) and the MCP result through one loop,
``treg.call.drain.drain``, which closes and finishes an outcome exactly once however it ends.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from treg.call import drain as drain_mod
from treg.call.drain import Sink, drain
from treg.call.state import CallOutcome
from treg.errors import GatewayFailed
from treg.infra import db as db_mod
from treg.testing import Mcp, example_provider, http_response, raw_upstream, vendor_gateway


class Lookups:
    """Every read of the identity cache and every query of the tokens table by token hash."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, svc: Any) -> None:
        self.cache_reads: list[Any] = []
        self.token_queries = 0
        cache = svc.caches.identity
        read = cache.get

        def counted_get(key: Any) -> Any:
            self.cache_reads.append(key)
            return read(key)

        fetch_one = db_mod.Tx.fetch_one

        async def counted_fetch_one(tx: Any, stmt: Any, params: Any = None) -> Any:
            if "tokens.token_hash" in str(stmt):
                self.token_queries += 1
            return await fetch_one(tx, stmt, params)

        monkeypatch.setattr(cache, "get", counted_get)
        monkeypatch.setattr(db_mod.Tx, "fetch_one", counted_fetch_one)

    def reset(self) -> None:
        self.cache_reads.clear()
        self.token_queries = 0


@pytest.fixture
async def cat(aiohttp_client, make_app):
    """A gateway with the acme test provider (platform key, credits) and an own tool ``t`` on the same
    raw upstream."""
    async with raw_upstream(lambda ex: http_response(200, b'{"id": 7}', [("Content-Type", "application/json")])) as up:
        async with vendor_gateway(aiohttp_client, make_app, [example_provider(up.url + "/v1")],
                                  platform={"TREG_PLATFORM_KEY_ACME": "pk-1"}, credits=100_000) as gw:
            await gw.tool("t", up.url + "/v1")
            yield gw, up


async def _cache_enabled(svc: Any) -> None:
    for _ in range(500):  # the identity cache serves once the change listener is connected (bounded)
        if svc.caches.identity.enabled:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the identity cache never came on")


@pytest.mark.parametrize("tool, arguments", [
    ("t", {"path": "/items/1"}),
    ("catalog_call", {"endpoint": "acme.items.get", "params": {"item_id": "1"}}),
])
async def test_a_tools_call_looks_its_caller_up_once(cat, monkeypatch, tool, arguments):
    gw, up = cat
    await _cache_enabled(gw.services)
    seen = Lookups(monkeypatch, gw.services)
    mcp = Mcp(gw)
    for attempt in ("cold", "warm"):  # the first finds the token in the database, the second in the cache
        if attempt == "cold":
            gw.services.caches.identity.clear()
        seen.reset()
        out = await mcp.call(tool, arguments)
        assert out["isError"] is False and out["structuredContent"]["status"] == 200, out
        assert seen.cache_reads == [gw.org["token"]], attempt
        if attempt == "cold":
            assert seen.token_queries == 1
        else:  # none, unless a late change notification of the fixture's writes dropped the entry again
            assert seen.token_queries <= 1
    assert len(up.exchanges) == 2


async def test_the_one_authentication_still_checks_the_org_and_refuses_a_bad_token(cat):
    gw, up = cat
    mcp = Mcp(gw)
    status, body = await mcp.modern("tools/call", {"name": "t", "arguments": {"path": "/x"}},
                                    headers={"X-Treg-Org": "some-other-org"})
    assert status == 403 and body["error"] == "wrong_org"
    status, _ = await Mcp(gw, token="treg_not_a_token").modern("tools/call", {"name": "t", "arguments": {}})
    assert status == 401
    assert up.exchanges == []


async def test_both_edges_drain_through_the_one_loop(cat, monkeypatch):
    gw, up = cat
    drained: list[str] = []

    async def counted(outcome: CallOutcome, sink: Sink) -> Any:
        drained.append(type(sink).__name__)
        return await drain(outcome, sink)

    monkeypatch.setattr("treg.web.call.drain", counted)
    monkeypatch.setattr("treg.mcp.backend.drain", counted)
    r = await gw.call("GET", "/call/t/items/1")
    assert r.status == 200 and await r.read() == b'{"id": 7}'
    assert (await Mcp(gw).call("t", {"path": "/items/1"}))["structuredContent"]["body"] == {"id": 7}
    assert drained == ["RelayResponse", "_Bounded"]
    assert drain_mod.drain is drain


# -- drain itself, over outcomes made by hand ------------------------------------------------------------

class _Outcome:
    """What drain needs of a CallOutcome: a body (whole or streamed), close and finish, each counted."""

    def __init__(self, *, whole: bytes | None = None, chunks: list[Any] = ()) -> None:
        self.whole, self._chunks, self.closed, self.finished = whole, list(chunks), 0, []

    @property
    def body(self) -> Any:
        async def gen() -> Any:
            for c in self._chunks:
                if isinstance(c, BaseException):
                    raise c
                yield c
        return gen()

    def close(self) -> None:
        self.closed += 1

    def finish(self, taken: int, error: BaseException | None) -> None:
        self.finished.append((taken, error))


class _Collect(Sink):
    __slots__ = ("log", "stop_after")

    def __init__(self, stop_after: int | None = None) -> None:
        self.log: list[Any] = []
        self.stop_after = stop_after

    async def start(self) -> None:
        self.log.append("start")

    async def whole(self, data: bytes) -> None:
        self.log.append(("whole", data))

    async def chunk(self, data: bytes) -> bool:
        self.log.append(("chunk", data))
        return self.stop_after is not None and len(self.log) - 1 >= self.stop_after

    async def end(self) -> None:
        self.log.append("end")

    def broken(self, exc: BaseException) -> None:
        self.log.append(("broken", type(exc).__name__))


async def test_drain_hands_a_body_in_hand_over_at_once():
    out, sink = _Outcome(whole=b"abcdef"), _Collect()
    assert await drain(out, sink) == (6, None)  # type: ignore[arg-type]
    assert sink.log == ["start", ("whole", b"abcdef")]
    assert (out.closed, out.finished) == (1, [(6, None)])


async def test_drain_streams_until_the_end_or_until_the_sink_has_enough():
    out, sink = _Outcome(chunks=[b"ab", b"cd", b"ef"]), _Collect()
    assert await drain(out, sink) == (6, None)  # type: ignore[arg-type]
    assert sink.log == ["start", ("chunk", b"ab"), ("chunk", b"cd"), ("chunk", b"ef"), "end"]
    out, sink = _Outcome(chunks=[b"ab", b"cd", b"ef"]), _Collect(stop_after=2)
    assert await drain(out, sink) == (4, None)  # type: ignore[arg-type]
    assert sink.log == ["start", ("chunk", b"ab"), ("chunk", b"cd")]  # no end: the rest is dropped
    assert (out.closed, out.finished) == (1, [(4, None)])


async def test_drain_returns_an_ending_error_and_raises_anything_else_finishing_once_either_way():
    broke = GatewayFailed("the upstream broke mid-answer")
    out, sink = _Outcome(chunks=[b"ab", broke]), _Collect()
    assert await drain(out, sink) == (2, broke)  # type: ignore[arg-type]
    assert sink.log == ["start", ("chunk", b"ab"), ("broken", "GatewayFailed")]
    assert (out.closed, out.finished) == (1, [(2, broke)])
    for exc in (asyncio.CancelledError(), RuntimeError("a bug"), ConnectionResetError("gone")):
        out, sink = _Outcome(chunks=[b"ab", exc]), _Collect()
        with pytest.raises(type(exc)):
            await drain(out, sink)  # type: ignore[arg-type]
        assert sink.log == ["start", ("chunk", b"ab")]
        assert (out.closed, out.finished) == (1, [(2, exc)])
