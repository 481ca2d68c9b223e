"""treg's own vendor key never reaches a platform-tier caller through the vendor's answer (treg/call/answer_mask.py):
an upstream echoing the Authorization it got — in the body, a header, the status line's reason phrase, compressed
or not — has it masked before any byte leaves; a replay of the call and an archive hit serve the masked answer;
an org's own (team) key echoed is relayed as it came (the org's to see). Over real sockets, raw bytes read."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import random
import zlib
from typing import Any, AsyncIterator

import pytest

from treg import membership, money
from treg.call import answer_mask, metered
from treg.keys import SERVICES
from treg.redaction import Redactor
from treg.settings import SecretStr
from treg.testing import Gateway, ProviderPlugin, example_provider, http_response, raw_upstream

KEY = "pk-live-OPERATOR-9a8b7c6d5e"
PATH = "/catalog/call/acme.items.get?item_id=7"
SPELLINGS = (KEY, KEY.encode().hex(), "cGstbGl2ZS1PUEVSQVRPUi05YThiN2M2ZDVl")  # raw, hex, base64 of the key


def _echo(*, coding: str | None = None, status: int = 200):
    def answer(ex):
        auth = ex.header("authorization") or ""
        body = json.dumps({"auth": auth, "hex": auth[7:].encode().hex(),
                           "b64": "cGstbGl2ZS1PUEVSQVRPUi05YThiN2M2ZDVl" if KEY in auth else ""}).encode()
        headers = [("Content-Type", "application/json"), ("X-Echo", auth)]
        if coding == "gzip":
            body, headers = gzip.compress(body), headers + [("Content-Encoding", "gzip")]
        elif coding is not None:
            headers.append(("Content-Encoding", coding))
        return http_response(status, body, headers, reason=f"OK {auth}")
    return answer


async def _raw_get(client, path: str, token: str, extra: str = "") -> bytes:
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nX-Treg-Token: {token}\r\n{extra}Connection: close\r\n\r\n"
                 .encode())
    raw = await asyncio.wait_for(reader.read(), 30)
    writer.close()
    return raw


def _leaks(raw: bytes) -> list[str]:
    text = gzip.decompress(raw.partition(b"\r\n\r\n")[2]).decode() if b"Content-Encoding: gzip" in raw else ""
    return [s for s in SPELLINGS if s in raw.decode("latin-1") or s in text]


@pytest.mark.parametrize("coding", [None, "gzip"])
async def test_an_echoed_platform_key_is_masked_everywhere_in_the_answer(make_app, aiohttp_client, coding):
    async with _platform(aiohttp_client, make_app, _echo(coding=coding)) as (gw, up):
        raw = await _raw_get(gw.client, PATH, gw.org["token"], "Accept-Encoding: gzip\r\n")
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n"), head  # the reason phrase: the standard one
        assert up.exchanges[-1].header("authorization") == f"Bearer {KEY}"  # the key was injected
        assert _leaks(raw) == [], raw
        assert b"X-Echo: [REDACTED]" in head and b"X-Treg-Cost-Micro: 2000" in head
        if coding == "gzip":  # masked: sent decoded, its coding dropped, its length the new one
            assert b"Content-Encoding" not in head
        assert json.loads(body)["auth"] == "[REDACTED]"
        assert int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]) == len(body)


async def test_a_replay_serves_the_masked_answer(make_app, aiohttp_client):
    async with _platform(aiohttp_client, make_app, _echo()) as (gw, up):
        label = "Idempotency-Key: k-1\r\n"
        first = await _raw_get(gw.client, PATH, gw.org["token"], label)
        again = await _raw_get(gw.client, PATH, gw.org["token"], label)
        assert b"X-Treg-Idempotent-Replay: true" in again.partition(b"\r\n\r\n")[0]
        assert len(up.exchanges) == 1 and _leaks(first) == [] and _leaks(again) == []
        assert b"[REDACTED]" in again


async def test_an_undecodable_coding_is_withheld_and_costs_nothing(make_app, aiohttp_client):
    async with _platform(aiohttp_client, make_app, _echo(coding="x-unknown")) as (gw, up):
        r = await gw.client.get(PATH, headers=gw.owner)
        body = await r.json()
        assert r.status == 502 and body["error"] == "platform_answer_unreadable", body
        assert KEY not in json.dumps(body) and r.headers["X-Treg-Cost-Micro"] == "0"
        bal = await money.balance(gw.services, gw.org["org_id"])
        assert (bal.balance_micro, bal.held_micro) == (10**9, 0)


async def test_the_orgs_own_key_echoed_is_relayed_as_it_came(make_app, aiohttp_client):
    async with _platform(aiohttp_client, make_app, _echo()) as (gw, up):
        await gw.secret("team-key-of-the-org", provider="acme")
        r = await gw.client.get(PATH, headers=gw.owner)
        assert r.status == 200 and r.headers["X-Treg-Credential-Tier"] == "team"
        assert (await r.json())["auth"] == "Bearer team-key-of-the-org"


def _session(ex):
    """A vendor that opens a session of the account whose key it got, as web-facing APIs do."""
    return http_response(200, b'{"ok":true}', [("Content-Type", "application/json"),
                                               ("Set-Cookie", "sid=acct-session-77; Path=/; HttpOnly"),
                                               ("set-cookie2", "legacy=1"), ("X-Kept", "yes")])


@pytest.mark.parametrize("path", [PATH, "/catalog/call/acme.status"], ids=["metered", "free-streamed"])
async def test_the_vendors_session_on_treg_s_key_never_reaches_the_caller(make_app, aiohttp_client, path):
    """A session cookie of treg's vendor account is a credential like its key: a platform-tier caller
    (metered or streamed) gets the answer without it, every other header kept; an org's own key's
    answer keeps its cookies (the session is the org's account)."""
    async with _platform(aiohttp_client, make_app, _session) as (gw, up):
        raw = await _raw_get(gw.client, path, gw.org["token"])
        head = raw.partition(b"\r\n\r\n")[0].lower()
        assert head.startswith(b"http/1.1 200") and b"x-treg-credential-tier: platform" in head
        assert b"acct-session-77" not in raw and b"set-cookie" not in head and b"x-kept: yes" in head
        await gw.secret("team-key-of-the-org", provider="acme")
        r = await gw.client.get(path, headers=gw.owner)
        assert r.status == 200 and r.headers["X-Treg-Credential-Tier"] == "team"
        endpoint = path.split("/")[-1].partition("?")[0]  # the cookie is scoped to the endpoint called
        assert r.headers.getall("Set-Cookie") == [f"sid=acct-session-77; HttpOnly; Path=/catalog/call/{endpoint}"]


@contextlib.asynccontextmanager
async def _platform(aiohttp_client, make_app, responder) -> AsyncIterator[tuple[Gateway, Any]]:
    """A treg whose platform key for the example provider is KEY, relaying to ``responder``; credits."""
    async with raw_upstream(responder) as up:
        gw = await _gateway(aiohttp_client, make_app, up)
        try:
            yield gw, up
        finally:
            await gw.services.settler.drain()
    

async def _gateway(aiohttp_client, make_app, up) -> Gateway:
    app = make_app(extra_plugins=(ProviderPlugin([example_provider(up.url + "/v1")]),),
                   ssrf_allow=("127.0.0.0/8",), platform={"TREG_PLATFORM_KEY_ACME": SecretStr(KEY)})
    client = await aiohttp_client(app)
    org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
    await money.grant(client.app[SERVICES], org_id=org["org_id"], amount_micro=10**9, actor="test")
    return Gateway(client, org)


def _packed_with_key_at(offset: int, total: int) -> bytes:
    plain = bytearray(b" " * total)
    plain[offset:offset + len(KEY)] = KEY.encode()
    return gzip.compress(bytes(plain))


@pytest.mark.parametrize("offset", [3 * 1024 * 1024, answer_mask.SCAN_STEP * 6 - 7],
                         ids=["past-the-cap", "across-a-scan-step"])
async def test_an_answer_too_large_to_mask_that_holds_the_key_is_withheld(make_app, aiohttp_client, monkeypatch,
                                                                          offset):
    """Over the decoded bound the answer is scanned in steps, never whole: the key found there (also split
    between two steps) cannot be masked without sending it all decoded, so it is withheld, nothing charged."""
    monkeypatch.setattr(metered, "EVIDENCE_DECODED_MAX", 1024 * 1024)
    packed = _packed_with_key_at(offset, 4 * 1024 * 1024)

    def answer(ex):
        return http_response(200, packed, [("Content-Type", "application/json"), ("Content-Encoding", "gzip")])

    async with _platform(aiohttp_client, make_app, answer) as (gw, up):
        raw = await _raw_get(gw.client, PATH, gw.org["token"], "Accept-Encoding: gzip\r\n")
        assert raw.startswith(b"HTTP/1.1 502 "), raw[:200]
        assert b"platform_answer_unreadable" in raw and KEY.encode() not in raw
        bal = await money.balance(gw.services, gw.org["org_id"])
        assert (bal.balance_micro, bal.held_micro) == (10**9, 0)


def test_the_scan_finds_a_value_wherever_it_is_and_only_there():
    r = Redactor.for_values([KEY])
    for offset in (0, answer_mask.SCAN_STEP - 3, answer_mask.SCAN_STEP * 2 - len(KEY) + 1, 5 * 1024 * 1024):
        assert answer_mask.clean_in_steps(r, _packed_with_key_at(offset, 6 * 1024 * 1024), ["gzip"]) is False
    assert answer_mask.clean_in_steps(r, gzip.compress(b" " * 6 * 1024 * 1024), ["gzip"]) is True
    assert answer_mask.clean_in_steps(r, gzip.compress(b" " * 1024)[:-9], ["gzip"]) is False  # truncated
    assert answer_mask.clean_in_steps(r, b"\x1f\x8bnot gzip", ["gzip"]) is False
    assert answer_mask.clean_in_steps(r, gzip.compress(b"x"), ["br"]) is False  # a coding it does not scan


def _media_provider(base_url: str) -> dict[str, Any]:
    return {"id": "gem", "base_url": base_url, "auth": [{"location": "header", "name": "X-Goog-Api-Key"}],
            "endpoints": [{"id": "gem.generate", "method": "POST", "path": "/generate", "params": [],
                           "price": {"per_call_micro": 100}, "spooled_response": True}]}


@pytest.mark.parametrize("echo", [False, True], ids=["clean", "echoing"])
@pytest.mark.parametrize("coding", [None, "gzip"])
async def test_a_spooled_answer_is_scanned_on_disk(make_app, aiohttp_client, echo, coding):
    """A ``spooled_response`` answer (written to disk as it arrives, never whole in memory) is scanned for the
    key there: clean, every byte relayed as it came; holding it (here 2 MiB in), withheld, nothing charged."""
    def answer(ex):
        got = ex.header("x-goog-api-key") or ""
        image = bytearray(b"A" * (3 * 1024 * 1024))
        if echo:
            image[2 * 1024 * 1024:2 * 1024 * 1024 + len(got)] = got.encode()
        body = b'{"data": "' + bytes(image) + b'"}'
        headers = [("Content-Type", "application/json")]
        if coding == "gzip":
            body, headers = gzip.compress(body), headers + [("Content-Encoding", "gzip")]
        return http_response(200, body, headers)

    async with raw_upstream(answer) as up:
        app = make_app(extra_plugins=(ProviderPlugin([_media_provider(up.url)]),), ssrf_allow=("127.0.0.0/8",),
                       platform={"TREG_PLATFORM_KEY_GEM": SecretStr(KEY)})
        client = await aiohttp_client(app)
        try:
            org = await membership.create_org(client.app[SERVICES], slug="g", email="g@g.test")
            gw = Gateway(client, org)
            await money.grant(gw.services, org_id=org["org_id"], amount_micro=10**6, actor="t")
            r = await gw.call("POST", "/catalog/call/gem.generate", json={"contents": []},
                              headers={"Accept-Encoding": "gzip"} if coding else {})
            body = await r.read()
            assert up.exchanges[-1].header("x-goog-api-key") == KEY
            assert KEY.encode() not in body and KEY not in json.dumps(dict(r.headers))
            if echo:
                assert r.status == 502 and json.loads(body)["error"] == "platform_answer_unreadable"
            else:
                assert r.status == 200 and r.headers["X-Treg-Cost-Micro"] == "100" and len(body) > 3 * 1024 * 1024
            bal = await money.balance(gw.services, org["org_id"])
            assert (bal.balance_micro, bal.held_micro) == (10**6 - (0 if echo else 100), 0)
        finally:
            await client.close()


# -- a free platform endpoint's answer: no hold, so it streams, checked as it streams -------------------

FREE = "/catalog/call/acme.status"  # per_call_micro 0 on treg's key: no hold, the answer streams


def _big(*, echo: bool, coding: str | None = None, at: int = 1024 * 1024, size: int = 3 * 1024 * 1024):
    def answer(ex):
        got = (ex.header("authorization") or "")[7:]
        # compressed, random bytes (which stay ~their size) so that the answer streams rather than arriving
        # whole with its head
        plain = bytearray(b"x" * size if coding is None else random.Random(7).randbytes(size))
        if echo:
            plain[at:at + len(got)] = got.encode()
        body, headers = bytes(plain), [("Content-Type", "application/octet-stream")]
        if coding == "gzip":  # (no time in the gzip header: the test makes the same bytes again)
            body, headers = gzip.compress(body, mtime=0), headers + [("Content-Encoding", "gzip")]
        return http_response(200, body, headers)
    return answer


async def _read_all(client, token: str, extra: str = "") -> bytes:
    """The raw answer as a socket reads it until treg closes the connection (a cut one included)."""
    return await _raw_get(client, FREE, token, extra)


@pytest.mark.parametrize("coding", [None, "gzip"])
async def test_a_free_platform_answer_streams_unchanged_when_clean(aiohttp_client, make_app, coding):
    async with _platform(aiohttp_client, make_app, _big(echo=False, coding=coding)) as (gw, up):
        raw = await _read_all(gw.client, gw.org["token"], "Accept-Encoding: gzip\r\n")
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ") and b"X-Treg-Cost-Micro: 0" in head
        expected = _big(echo=False, coding=coding)(up.exchanges[-1]).partition(b"\r\n\r\n")[2]
        assert body == expected  # every byte, as it came (compressed stays compressed)


@pytest.mark.parametrize("coding", [None, "gzip"])
async def test_a_free_platform_answer_holding_the_key_is_cut_before_it(aiohttp_client, make_app, coding):
    async with _platform(aiohttp_client, make_app, _big(echo=True, coding=coding)) as (gw, up):
        raw = await _read_all(gw.client, gw.org["token"], "Accept-Encoding: gzip\r\n")
        head, _, body = raw.partition(b"\r\n\r\n")
        declared = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
        assert len(body) < declared  # cut: a truncated answer, never a complete one
        got = zlib.decompressobj(wbits=31).decompress(body) if coding else body
        assert KEY.encode()[:4] not in got[1024 * 1024 - 64:] and len(got) < 1024 * 1024  # cut before the key
        rows = await gw.calls()
        assert rows[0]["outcome"] == "stream_error"


def test_the_streaming_check_lets_nothing_of_a_value_out():
    """Fed in chunks of every size, the value anywhere (also split over chunks): what was let out before
    the cut never holds any of it; a clean stream comes out whole."""
    r = Redactor.for_values([KEY])

    async def run(data: bytes, size: int, applied: list[str]) -> tuple[bytes, bool]:
        async def chunks():
            for i in range(0, len(data), size):
                yield data[i:i + size]
        out = b""
        try:
            async for part in answer_mask.guarded(r, chunks(), applied):
                out += part
        except answer_mask.ValueInAnswer:
            return out, True
        return out, False

    plain = b"y" * 5000
    for at in (0, 1, 999, 4990 - len(KEY)):
        dirty = plain[:at] + KEY.encode() + plain[at:]
        for size in (1, 7, 64, 1000, 10_000):
            out, cut = asyncio.run(run(dirty, size, []))
            assert cut and KEY.encode()[:4] not in out and dirty.startswith(out)
            packed = gzip.compress(dirty)
            out, cut = asyncio.run(run(packed, size, ["gzip"]))
            assert cut and KEY.encode()[:4] not in zlib.decompressobj(wbits=31).decompress(out)
    for size in (1, 100, 10_000):
        assert asyncio.run(run(plain, size, [])) == (plain, False)
        packed = gzip.compress(plain)
        assert asyncio.run(run(packed, size, ["gzip"])) == (packed, False)


async def test_a_free_platform_answer_that_came_whole_is_masked_whole(aiohttp_client, make_app):
    """A small answer arrives with its head (``whole``): checked whole, masked, its length the new one."""
    async with _platform(aiohttp_client, make_app, _echo()) as (gw, up):
        raw = await _read_all(gw.client, gw.org["token"])
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and _leaks(raw) == []
        assert json.loads(body)["auth"] == "[REDACTED]" and b"X-Echo: [REDACTED]" in head
        assert int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]) == len(body)


def test_both_deflate_formats_are_scanned():
    """``deflate`` is the zlib format (RFC 9110), or the raw stream some servers send: both are read as they
    stream and as a whole, like gzip, clean or not."""
    r = Redactor.for_values([KEY])
    plain = b"z" * 300_000

    def raw_deflate(data: bytes) -> bytes:
        c = zlib.compressobj(wbits=-15)
        return c.compress(data) + c.flush()

    async def through(data: bytes) -> bytes:
        async def chunks():
            for i in range(0, len(data), 333):
                yield data[i:i + 333]
        return b"".join([part async for part in answer_mask.guarded(r, chunks(), ["deflate"])])

    for pack in (zlib.compress, raw_deflate):
        assert answer_mask.clean_in_steps(r, pack(plain), ["deflate"]) is True
        assert answer_mask.clean_in_steps(r, pack(plain + KEY.encode()), ["deflate"]) is False
        assert asyncio.run(through(pack(plain))) == pack(plain)
        with pytest.raises(answer_mask.ValueInAnswer):
            asyncio.run(through(pack(plain + KEY.encode())))
