"""Decoding a compressed metered answer for settlement evidence only, never for the caller.

A caller that sends ``Accept-Encoding: gzip`` (requests, httpx, ``curl --compressed`` all do) gets the
upstream's compressed bytes relayed as they came, with their ``Content-Encoding``. Settlement must still
read the usage inside, so the evidence copy is decoded here: gzip and deflate always, br and zstd when
their library is installed (optional: without it the answer is not readable and a usage price settles at
its reserve, as for any answer without evidence).

Every decoder is bounded by the decoded size (``limit``): a few kilobytes of compressed zeros must not
become gigabytes in treg's memory. Over the limit, malformed, truncated or an unknown coding: ``None``.
"""

from __future__ import annotations

import io
import zlib
from typing import Any, Callable

from treg.infra.upstream import UpstreamResponse

try:  # optional: br is decoded only when a Brotli library is installed
    import brotli as _brotli  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the environment
    try:
        import brotlicffi as _brotli  # type: ignore[import-not-found,no-redef]
    except ImportError:
        _brotli = None

try:  # optional: zstd from the stdlib (3.14+) or the zstandard package
    from compression import zstd as _stdlib_zstd  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the environment
    _stdlib_zstd = None
try:
    import zstandard as _zstandard  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - depends on the environment
    _zstandard = None

#: input fed to a decoder that cannot bound its output itself, per step (its output is checked between)
_STEP = 1024


def _zlib(data: bytes, limit: int, wbits: int) -> bytes | None:
    d = zlib.decompressobj(wbits=wbits)
    try:
        out = d.decompress(data, limit + 1)
    except zlib.error:
        return None
    if len(out) > limit or d.unconsumed_tail or not d.eof:
        return None  # over the limit, or a truncated stream (its JSON would be cut anyway)
    return out


def _gzip(data: bytes, limit: int) -> bytes | None:
    return _zlib(data, limit, 31)


def _deflate(data: bytes, limit: int) -> bytes | None:
    # RFC 9110 "deflate" is the zlib format; some servers send a raw deflate stream instead
    out = _zlib(data, limit, 15)
    return out if out is not None else _zlib(data, limit, -15)


def _br(data: bytes, limit: int) -> bytes | None:
    assert _brotli is not None
    d = _brotli.Decompressor()
    parts: list[bytes] = []
    size = 0
    try:
        for i in range(0, len(data), _STEP):
            try:
                chunk = d.process(data[i:i + _STEP], output_buffer_limit=limit + 1 - size)
            except TypeError:  # an older Brotli without an output limit: small steps bound each output
                chunk = d.process(data[i:i + _STEP])
            size += len(chunk)
            if size > limit:
                return None
            parts.append(chunk)
        if not d.is_finished():
            return None
    except Exception:  # noqa: BLE001 (brotli.error, brotlicffi.error: both mean "not readable")
        return None
    return b"".join(parts)


def _zstd(data: bytes, limit: int) -> bytes | None:
    try:
        if _stdlib_zstd is not None:
            d = _stdlib_zstd.ZstdDecompressor()
            out = d.decompress(data, max_length=limit + 1)
            return out if len(out) <= limit and d.eof else None
        assert _zstandard is not None
        with _zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) as reader:
            out = reader.read(limit + 1)
        return out if len(out) <= limit else None
    except Exception:  # noqa: BLE001 (each library has its own error type; all mean "not readable")
        return None


_DECODERS: dict[str, Callable[[bytes, int], bytes | None]] = {"gzip": _gzip, "x-gzip": _gzip, "deflate": _deflate}
if _brotli is not None:
    _DECODERS["br"] = _br
if _stdlib_zstd is not None or _zstandard is not None:
    _DECODERS["zstd"] = _zstd


def codings(headers: Any) -> list[str]:
    """The content codings of an answer, in the order they were applied (``identity`` dropped)."""
    out: list[str] = []
    for k, v in headers:
        if k.lower() == "content-encoding":
            out += [c.strip().lower() for c in v.split(",") if c.strip() and c.strip().lower() != "identity"]
    return out


def answer_codings(resp: UpstreamResponse) -> list[str]:
    """:func:`codings` of an upstream's answer, told from its index at once when it has no
    ``Content-Encoding`` (most answers): the index holds every name its ``headers`` hold."""
    return codings(resp.headers) if "content-encoding" in resp.index else []


def decode(data: bytes, applied: list[str], limit: int) -> bytes | None:
    """``data`` with ``applied`` codings undone (last applied, first undone), at most ``limit`` bytes
    at every step; ``None`` when that is not possible."""
    for coding in reversed(applied):
        decoder = _DECODERS.get(coding)
        if decoder is None:
            return None
        out = decoder(data, limit)
        if out is None:
            return None
        data = out
    return data


def decode_head(head: bytes, applied: list[str], limit: int) -> tuple[bytes, bool] | None:
    """The decoded start of an answer of which only ``head`` was read (failed-call evidence): at most
    ``limit`` bytes and whether that is the whole body. gzip and deflate only, one coding; else None."""
    if len(applied) != 1 or applied[0] not in ("gzip", "x-gzip", "deflate"):
        return None
    for wbits in ((31,) if applied[0] != "deflate" else (15, -15)):
        d = zlib.decompressobj(wbits=wbits)
        try:
            out = d.decompress(head, limit)
        except zlib.error:
            continue
        return out, d.eof and not d.unconsumed_tail
    return None
