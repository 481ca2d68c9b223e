"""A usage-priced platform answer that arrives compressed settles from its real usage, and the caller
gets the upstream's compressed bytes as they were sent (over real HTTP hops)."""

import gzip
import json
import zlib

import pytest

from treg import money
from treg.call import encodings, metered
from treg.testing import answering_acme, hold_row, http_response

CREDITS = 1_000_000
TOKENS = 1234
CHAT_PRICE = TOKENS * 3  # acme.chat: usage.total_tokens x 3 micro (estimate 9000)
GEM_PRICE = TOKENS * 2


def _compress(coding, data):
    if coding == "gzip":
        return gzip.compress(data)
    if coding == "deflate":
        return zlib.compress(data)
    if coding == "deflate-raw":
        c = zlib.compressobj(wbits=-15)
        return c.compress(data) + c.flush()
    raise AssertionError(coding)


@pytest.fixture
async def vendor(aiohttp_client, make_app):
    """(gateway, upstream, answers): the upstream answers whatever ``answers["reply"]`` holds."""
    async with answering_acme(aiohttp_client, make_app, credits=CREDITS) as world:
        yield world


async def _assert_settled(gw, call_id, price, hold_closes):
    hold = await hold_row(gw.services, call_id)
    assert hold["state"] == "settled" and hold["settled_micro"] == price
    assert hold_closes == [("settle", call_id)]  # closed exactly once
    bal = await money.balance(gw.services, gw.org["org_id"])
    assert bal.balance_micro == CREDITS - price and bal.held_micro == 0


@pytest.mark.parametrize("coding", ["gzip", "deflate", "deflate-raw"])
async def test_compressed_usage_answer_settles_from_usage_and_relays_the_compressed_bytes(vendor, hold_closes, coding):
    gw, up, answers = vendor
    plain = json.dumps({"choices": [{"text": "hi"}], "usage": {"total_tokens": TOKENS}}).encode()
    packed = _compress(coding, plain)
    wire_coding = "deflate" if coding.startswith("deflate") else coding
    answers["reply"] = http_response(200, packed, [("Content-Type", "application/json"),
                                                   ("Content-Encoding", wire_coding)])
    r = await gw.raw("POST", "/catalog/call/acme.chat", [("Accept-Encoding", "gzip, deflate"),
                                                        ("Content-Type", "application/json")], b"{}")
    assert r.status == 200, r.body
    assert up.last.header("Accept-Encoding") == "gzip, deflate"  # the caller's own choice went upstream
    assert r.body == packed and r.header("Content-Encoding") == wire_coding  # exactly what the upstream sent
    assert r.header("Content-Length") == str(len(packed))
    assert r.header("X-Treg-Cost-Micro") == str(CHAT_PRICE)
    await _assert_settled(gw, r.header("X-Treg-Call-Id"), CHAT_PRICE, hold_closes)


async def test_a_caller_without_accept_encoding_sends_none_and_a_compressed_answer_still_settles(vendor, hold_closes):
    """treg adds no Accept-Encoding (none said "any coding" to the upstream, as it would directly); an
    upstream that compresses anyway is relayed as it came and settles from the decoded usage."""
    gw, up, answers = vendor
    packed = gzip.compress(json.dumps({"choices": [], "usage": {"total_tokens": TOKENS}}).encode())
    answers["reply"] = http_response(200, packed, [("Content-Type", "application/json"), ("Content-Encoding", "gzip")])
    r = await gw.raw("POST", "/catalog/call/acme.chat", [("Content-Type", "application/json")], b"{}")
    assert r.status == 200, r.body
    assert up.last.header_all("Accept-Encoding") == [] and b"ccept-encoding" not in up.last.raw.lower()
    assert r.body == packed and r.header("Content-Encoding") == "gzip"
    assert r.header("X-Treg-Cost-Micro") == str(CHAT_PRICE)
    await _assert_settled(gw, r.header("X-Treg-Call-Id"), CHAT_PRICE, hold_closes)


async def test_a_metered_answer_keeps_a_latin1_header_byte(vendor, hold_closes):
    """The metered path builds its own outcome: an upstream header that is not UTF-8 still reaches the
    caller as its bytes (caf\\xe9, not caf\\xc3\\xa9)."""
    gw, up, answers = vendor
    plain = json.dumps({"choices": [], "usage": {"total_tokens": TOKENS}}).encode()
    answers["reply"] = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Foo: caf\xe9\r\n"
                        b"Content-Length: " + str(len(plain)).encode() + b"\r\n\r\n" + plain)
    r = await gw.raw("POST", "/catalog/call/acme.chat", [("Content-Type", "application/json")], b"{}")
    assert r.status == 200 and r.body == plain
    assert b"\r\nX-Foo: caf\xe9\r\n" in r.head and r.header("X-Treg-Cost-Micro") == str(CHAT_PRICE)
    await _assert_settled(gw, r.header("X-Treg-Call-Id"), CHAT_PRICE, hold_closes)


async def test_compressed_spooled_answer_settles_from_usage(vendor, hold_closes):
    gw, up, answers = vendor
    image = "A" * (3 * 1024 * 1024)
    plain = json.dumps({"candidates": [{"content": {"parts": [{"inlineData": {"data": image}}]},
                                        "finishReason": "STOP"}],
                        "usageMetadata": {"totalTokenCount": TOKENS}}).encode()
    packed = gzip.compress(plain)
    answers["reply"] = http_response(200, packed, [("Content-Type", "application/json"),
                                                   ("Content-Encoding", "gzip")])
    r = await gw.raw("POST", "/catalog/call/gem.generate", [("Accept-Encoding", "gzip")], b"{}")
    assert r.status == 200 and r.body == packed and r.header("Content-Encoding") == "gzip"
    assert r.header("X-Treg-Cost-Micro") == str(GEM_PRICE)
    await _assert_settled(gw, r.header("X-Treg-Call-Id"), GEM_PRICE, hold_closes)


async def test_decompression_bomb_settles_at_the_estimate_and_relays_unchanged(vendor, hold_closes, monkeypatch):
    gw, up, answers = vendor
    monkeypatch.setattr(metered, "EVIDENCE_DECODED_MAX", 1024 * 1024)
    # 32 MiB of JSON whitespace before the usage: ~32 KiB compressed, far over the decode cap
    plain = b" " * (32 * 1024 * 1024) + json.dumps({"usage": {"total_tokens": TOKENS}}).encode()
    packed = gzip.compress(plain)
    answers["reply"] = http_response(200, packed, [("Content-Encoding", "gzip")])
    r = await gw.raw("POST", "/catalog/call/acme.chat", [("Accept-Encoding", "gzip")], b"{}")
    assert r.status == 200 and r.body == packed
    assert r.header("X-Treg-Cost-Micro") == "9000"  # no readable usage: the reserve, never more
    await _assert_settled(gw, r.header("X-Treg-Call-Id"), 9000, hold_closes)


def test_decoders_are_bounded_and_refuse_what_they_cannot_read():
    data = b"x" * 100_000
    assert encodings.decode(gzip.compress(data), ["gzip"], 100_000) == data
    assert encodings.decode(gzip.compress(data), ["gzip"], 99_999) is None  # the cap is on decoded bytes
    assert encodings.decode(gzip.compress(data)[:-8], ["gzip"], 10 ** 6) is None  # truncated
    assert encodings.decode(b"not gzip", ["gzip"], 10 ** 6) is None
    assert encodings.decode(data, ["compress"], 10 ** 6) is None  # an unknown coding
    # codings applied in order are undone in reverse
    assert encodings.decode(zlib.compress(gzip.compress(data)), ["gzip", "deflate"], 10 ** 6) == data
    assert encodings.codings([("Content-Encoding", "gzip, identity"), ("X", "y")]) == ["gzip"]


@pytest.mark.parametrize("coding", ["br", "zstd"])
async def test_optional_codings_settle_from_usage_when_their_library_is_installed(vendor, hold_closes, coding):
    if coding == "br":
        lib = pytest.importorskip("brotli")
        pack = lib.compress
    else:
        lib = pytest.importorskip("zstandard")
        pack = lib.ZstdCompressor().compress
    gw, up, answers = vendor
    plain = json.dumps({"usage": {"total_tokens": TOKENS}}).encode()
    packed = pack(plain)
    answers["reply"] = http_response(200, packed, [("Content-Encoding", coding)])
    r = await gw.raw("POST", "/catalog/call/acme.chat", [("Accept-Encoding", coding)], b"{}")
    assert r.status == 200 and r.body == packed and r.header("X-Treg-Cost-Micro") == str(CHAT_PRICE)
    await _assert_settled(gw, r.header("X-Treg-Call-Id"), CHAT_PRICE, hold_closes)
    bomb = pack(b"\0" * (64 * 1024 * 1024))
    assert encodings.decode(bomb, [coding], 1024 * 1024) is None  # bounded by the decoded size
