"""Management bodies are read whole however the bytes arrive (api.md, "Bodies of management routes"):
split TCP writes, chunked framing and large bodies are one JSON document; over the limit is
``body_too_large``. Every request here is raw bytes on a real socket."""

from __future__ import annotations

import asyncio
import contextlib
import json

from treg.testing import raw_request_bytes, read_reply
from treg.web.jsonio import MAX_JSON_BYTES


async def _send_in_pieces(port: int, pieces: list[bytes], pause: float = 0.15):
    """Each piece as its own write, with a pause between: the server sees the body arrive in parts."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for i, piece in enumerate(pieces):
            if i:
                await asyncio.sleep(pause)
            writer.write(piece)
            await writer.drain()
        return await asyncio.wait_for(read_reply(reader), 15)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


def _head(gateway, path: str, extra: list[tuple[str, str]]) -> bytes:
    return raw_request_bytes("POST", path, [("X-Treg-Token", gateway.org["token"]),
                                            ("Content-Type", "application/json"), *extra])


def _refused(r, status: int, code: str) -> None:
    assert r.status == status, (r.status, r.body)
    assert r.header("X-Treg-Error") == "1"
    body = r.json()
    assert body["error"] == code and body["detail"] and body["blame"] == "caller"


async def test_json_in_two_writes_is_one_document(gateway):
    body = json.dumps({"name": "split-project"}).encode()
    head = _head(gateway, "/api/v1/projects", [("Content-Length", str(len(body)))])
    r = await _send_in_pieces(gateway.client.port, [head + body[:7], body[7:]])
    assert r.status == 201, r.body
    assert r.json()["name"] == "split-project"


async def test_chunked_json_body_is_one_document(gateway):
    body = json.dumps({"name": "chunked-project"}).encode()
    head = _head(gateway, "/api/v1/projects", [("Transfer-Encoding", "chunked")])
    parts = [body[:5], body[5:11], body[11:]]
    chunks = [f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts] + [b"0\r\n\r\n"]
    r = await _send_in_pieces(gateway.client.port, [head, *chunks], pause=0.05)
    assert r.status == 201, r.body
    assert r.json()["name"] == "chunked-project"


async def test_900_kb_secret_arrives_whole(gateway):
    value = "k" * (900 * 1024)
    body = json.dumps({"name": "big", "value": value}).encode()
    head = _head(gateway, "/api/v1/secrets", [("Content-Length", str(len(body)))])
    # as a plain curl upload arrives: many segments, not one read's worth
    pieces = [head] + [body[i:i + 128 * 1024] for i in range(0, len(body), 128 * 1024)]
    r = await _send_in_pieces(gateway.client.port, pieces, pause=0.02)
    assert r.status == 201, r.body
    assert r.json()["name"] == "big"
    # the value is stored whole: a tool injecting it sends all 900 KB
    secrets = await gateway.api("GET", "/api/v1/secrets", expect=200)
    assert [s["name"] for s in secrets["secrets"]] == ["big"]


async def test_900_kb_chunked_body_arrives_whole(gateway):
    body = json.dumps({"name": "big-chunked", "value": "v" * (900 * 1024)}).encode()
    head = _head(gateway, "/api/v1/secrets", [("Transfer-Encoding", "chunked")])
    step = 100 * 1024
    chunks = [f"{len(body[i:i + step]):x}\r\n".encode() + body[i:i + step] + b"\r\n"
              for i in range(0, len(body), step)] + [b"0\r\n\r\n"]
    r = await _send_in_pieces(gateway.client.port, [head, *chunks], pause=0.01)
    assert r.status == 201, r.body


async def test_declared_length_over_the_limit_is_body_too_large(gateway):
    head = _head(gateway, "/api/v1/projects", [("Content-Length", str(MAX_JSON_BYTES + 1))])
    r = await _send_in_pieces(gateway.client.port, [head + b'{"name": "x'])
    _refused(r, 400, "body_too_large")


async def test_chunked_body_over_the_limit_is_body_too_large(gateway):
    body = json.dumps({"name": "x", "value": "v" * MAX_JSON_BYTES}).encode()
    head = _head(gateway, "/api/v1/secrets", [("Transfer-Encoding", "chunked")])
    step = 256 * 1024
    chunks = [f"{len(body[i:i + step]):x}\r\n".encode() + body[i:i + step] + b"\r\n"
              for i in range(0, len(body), step)] + [b"0\r\n\r\n"]
    r = await _send_in_pieces(gateway.client.port, [head, *chunks], pause=0.01)
    _refused(r, 400, "body_too_large")
    assert (await gateway.api("GET", "/api/v1/secrets", expect=200))["secrets"] == []
