"""Failed-call evidence: what the caller sent and what came back, redacted and truncated.

Successes keep no content. For a failed call (treg refusal after resolution, upstream ≥ 400, or a
treg-side 502) the audit row keeps ``error_request`` and ``error_response`` in the contract's shapes.
Redaction runs before anything is stored, in this order: every injected secret value is masked
wherever it appears (an upstream may echo the key in its error), then credential headers and cookies,
then key-like query parameters.
"""

from __future__ import annotations

import base64
import re
from typing import Any, AsyncIterator, Iterable, Sequence
from urllib.parse import unquote_plus

from treg.call import encodings
from treg.redaction import MASK, Redactor, mask_userinfo

REQUEST_BODY_MAX = 64 * 1024  # a declared-length caller body up to this is kept
RESPONSE_HEAD_MAX = 8 * 1024  # the head of a failed response that is peeked and replayed

_CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key",
                                 "api-key", "apikey", "x-auth-token", "x-access-token", "x-csrf-token"})
_CREDENTIAL_WORDS = ("token", "secret", "password", "passwd", "api-key", "apikey", "api_key", "auth", "signature",
                     "session", "credential", "private")
_KEYLIKE_PARAM = re.compile(r"(key|token|secret|password|passwd|pwd|sig|signature|auth|credential|session|code)",
                            re.I)


def is_credential_header(name: str) -> bool:
    n = name.lower()
    return n in _CREDENTIAL_HEADERS or any(w in n for w in _CREDENTIAL_WORDS)


def redact_headers(headers: Iterable[tuple[str, str]], r: Redactor) -> list[list[str]]:
    return [[k, MASK if is_credential_header(k) else r.text(v)] for k, v in headers]


def redact_url(url: str, r: Redactor) -> str:
    url = mask_userinfo(r.text(url), MASK)  # a base URL's user:pw@ is a credential too
    base, sep, query = url.partition("?")
    if not sep:
        return url
    parts = []
    for seg in query.split("&"):
        k, eq, _v = seg.partition("=")
        if eq and _KEYLIKE_PARAM.search(unquote_plus(k)):
            parts.append(f"{k}={MASK}")
        else:
            parts.append(seg)
    return base + "?" + "&".join(parts)


def body_evidence(data: bytes | None, r: Redactor, limit: int) -> tuple[Any, bool]:
    """(body, truncated): text when it decodes as UTF-8, else ``{"base64": …}``; None when absent."""
    if data is None:
        return None, False
    truncated = len(data) > limit
    data = r.data(data[:limit])
    try:
        return r.text(data.decode("utf-8")), truncated
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode()}, truncated


def request_evidence(method: str, url: str, headers: Sequence[tuple[str, str]], body: bytes | None,
                     body_kept: bool, r: Redactor) -> dict[str, Any]:
    """``body_kept`` False: a large or chunked upload streamed through; only its query half is kept."""
    if body_kept:
        text, truncated = body_evidence(body, r, REQUEST_BODY_MAX)
    else:
        text, truncated = None, True
    return {"method": method, "url": redact_url(url, r), "headers": redact_headers(headers, r), "body": text,
            "body_truncated": truncated}


def response_evidence(status: int, headers: Sequence[tuple[str, str]], head: bytes | None, truncated: bool,
                      r: Redactor) -> dict[str, Any]:
    """A compressed head is kept decoded (an echoed key inside gzip is no less readable, and redaction
    can only see it decoded); one treg cannot decode is not kept at all."""
    applied = encodings.codings(headers)
    if applied and head:
        decoded = encodings.decode_head(head, applied, RESPONSE_HEAD_MAX)
        if decoded is None:
            return {"status": status, "headers": redact_headers(headers, r), "body": None, "body_truncated": True}
        head, complete = decoded
        truncated = truncated or not complete
    text, cut = body_evidence(head, r, RESPONSE_HEAD_MAX)
    return {"status": status, "headers": redact_headers(headers, r), "body": text,
            "body_truncated": truncated or cut}


async def peek_head(body: AsyncIterator[bytes], limit: int = RESPONSE_HEAD_MAX) -> tuple[bytes, bool, AsyncIterator[bytes]]:
    """Read up to ``limit`` bytes of a stream; return (head, more_follows, a stream that replays every
    consumed byte before the rest of the original)."""
    consumed: list[bytes] = []
    size = 0
    exhausted = False
    while size < limit:
        try:
            chunk = await body.__anext__()
        except StopAsyncIteration:
            exhausted = True
            break
        consumed.append(chunk)
        size += len(chunk)
    head = b"".join(consumed)

    async def replay() -> AsyncIterator[bytes]:
        for chunk in consumed:
            yield chunk
        if not exhausted:
            async for chunk in body:
                yield chunk

    return head[:limit], (not exhausted) or size > limit, replay()
