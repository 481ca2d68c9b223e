"""Intake stage, its plain-Python half: the control headers read in the pass that decodes every header,
the caller identified, and only then the body the edge left pending.

The aiohttp half (turning a request into a :class:`CallInput`, reading its body) is the edge's,
``treg/web/call.py``. **Identity comes before work** (api.md): the edge reads no body bytes and decodes
nothing; what must be read whole (a small declared body, an encoded one) or refused is a
:class:`PendingBody` that :func:`load_body` runs right after :func:`identify`, so a caller without a
valid token gets its 401 before treg reads anything, and an identified caller's refusal is audited.
"""

from __future__ import annotations

import base64
import binascii
import logging
import zlib
from dataclasses import replace
from typing import NamedTuple

from treg import authentication
from treg.call.state import CallState
from treg.call.types import CallInput, PendingBody
from treg.context import Services
from treg.errors import BadRequest, DbPoolExhausted, TregError
from treg.events import Event
from treg.authentication import ANY_SCOPE
from treg.identity import DEMO, FULL, TABLE, Identity
from treg.infra.upstream import header_text
from treg.money.limits import check_tag as _check_tag, valid_tag
from treg.plugins import call_hook

log = logging.getLogger(__name__)

__all__ = ["Controls", "PendingBody", "check_scope", "decode_body", "identify", "load_body", "read_headers"]


class Controls(NamedTuple):
    """The request headers intake reads (the first of each name counts, as aiohttp's lookups), None when
    absent. A NamedTuple, filled by position in :func:`read_headers`' one pass over the headers."""

    token: str | None
    org_hint: str | None
    tag: str | None
    idempotency_key: str | None
    user_agent: str | None
    content_length: str | None
    transfer_encoding: str | None
    body_encoding: str | None
    #: the dashboard's session cookie and its CSRF header: a call's identity without a token (Try-it)
    cookie: str | None
    csrf: str | None


#: lower-case header name → its slot in :class:`Controls`
_SLOTS = {name: i for i, name in enumerate(("x-treg-token", "x-treg-org", "x-treg-tag", "idempotency-key",
                                              "user-agent", "content-length", "transfer-encoding",
                                              "x-treg-body-encoding", "cookie", "x-treg-csrf"))}


def read_headers(raw: tuple[tuple[bytes, bytes], ...]) -> tuple[tuple[tuple[str, str], ...], Controls, str | None]:
    """Every header as text (:func:`~treg.infra.upstream.header_text`: UTF-8, else latin-1, never dropped),
    the :class:`Controls` read in the same pass, and the name of the first header whose bytes are not
    UTF-8 (None: all are). One loop instead of decoding all then looking each control header up in
    aiohttp's index (a speed trick: docs/performance.md). Taken from the decoded text, not aiohttp's
    index: its surrogate-escaped text of non-UTF-8 bytes cannot be hashed, stored or re-encoded."""
    headers = []
    found: list[str | None] = [None] * len(_SLOTS)
    slot = _SLOTS.get
    not_utf8 = None
    for k, v in raw:
        try:
            name, value = k.decode(), v.decode()
        except UnicodeDecodeError:
            name, value = header_text(k), header_text(v)
            not_utf8 = not_utf8 or name
        headers.append((name, value))
        i = slot(name.lower())
        if i is not None and found[i] is None:
            found[i] = value
    return tuple(headers), Controls._make(found), not_utf8


def decode_body(encoding: str, raw: bytes, limit: int) -> bytes:
    """The body as ``X-Treg-Body-Encoding`` (base64 or gzip) says to decode it, at most ``limit`` bytes."""
    enc = encoding.strip().lower()
    if enc == "base64":
        try:
            out = base64.b64decode(b"".join(raw.split()), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise BadRequest("X-Treg-Body-Encoding: base64, but the body is not valid base64",
                             code="invalid_body_encoding") from exc
        if len(out) > limit:
            raise BadRequest(f"the decoded body is larger than {limit} bytes", code="body_too_large")
        return out
    if enc == "gzip":
        d = zlib.decompressobj(wbits=31)
        try:
            out = d.decompress(raw, limit + 1)
        except zlib.error as exc:
            raise BadRequest("X-Treg-Body-Encoding: gzip, but the body is not valid gzip",
                             code="invalid_body_encoding") from exc
        if len(out) > limit or d.unconsumed_tail:
            raise BadRequest(f"the decoded body is larger than {limit} bytes", code="body_too_large")
        if not d.eof:
            raise BadRequest("X-Treg-Body-Encoding: gzip, but the gzip stream is truncated",
                             code="invalid_body_encoding")
        return out
    raise BadRequest("X-Treg-Body-Encoding must be base64 or gzip", code="invalid_body_encoding")


async def identify(svc: Services, state: CallState) -> Identity:
    """Who calls. A 401 is answered and logged, not recorded: there is no org to record it under."""
    inp = state.inp
    try:
        # every scope: which surface a scoped token reaches is checked once it is known (audited)
        state.ident = ident = (authentication.cached_identity(svc, inp.token, inp.org_hint, ANY_SCOPE)
                               or await authentication.authenticate(svc, inp.token, inp.org_hint, ANY_SCOPE))
    except DbPoolExhausted as exc:
        _intake_failed(svc, inp, exc)
        raise
    return ident


#: the surfaces each token scope reaches (a ``table`` token: GETs of /table/ only, below)
_SCOPE_SURFACES = {TABLE: ("table",), DEMO: ("call", "catalog", "table")}


def check_scope(state: CallState) -> None:
    """A scoped token only where its scope reaches (docs/sharing.md): a ``table`` token on ``GET /table/…``,
    a ``demo`` token on the call surfaces (what it may call there is the demo gate's, treg/call/demo.py)."""
    ident, inp = state.ident, state.inp
    assert ident is not None
    if ident.scope == FULL:
        return
    if inp.surface not in _SCOPE_SURFACES.get(ident.scope, ()) or (ident.scope == TABLE and inp.method != "GET"):
        raise authentication.scope_refusal(ident)


def check_tag(state: CallState) -> None:
    """``X-Treg-Tag`` as the limits read it (1-200 visible ASCII characters), on every identified call,
    not only where a hold is placed: an own tool's call once relayed any tag, and its audit row, unable
    to store it, failed the batch of every org's rows it rode in. The refusal's own row goes without it
    (:func:`drop_invalid_tag`)."""
    tag = state.inp.tag
    if tag is not None and not valid_tag(tag):
        state.inp = replace(state.inp, tag=None)
        _check_tag(tag)  # raises invalid_tag, worded as every limit words it


def drop_invalid_tag(state: CallState) -> None:
    """A refused call's row without a tag no limit could read (a refusal raised before the tag's check,
    a header that is not UTF-8, carries it still)."""
    if state.inp.tag is not None and not valid_tag(state.inp.tag):
        state.inp = replace(state.inp, tag=None)


async def load_body(state: CallState) -> None:
    """The edge's reading that waited for identity (a refusal raised here is recorded: the caller is known)."""
    if isinstance(state.inp.body, PendingBody):
        state.inp = await state.inp.body.load(state.inp)


def _intake_failed(svc: Services, inp: CallInput, exc: TregError) -> None:
    """A call that failed before its caller was known (the database pool timed out on the identity
    lookup): no org to record it under, so only an event, naming the surface and nothing of the target."""
    log.warning("call %s failed before identity: %s", inp.call_id, exc.code)
    call_hook(svc.pm, "treg_event", event=Event("call_intake_failed", {
        "call_id": inp.call_id, "surface": inp.surface, "failure_kind": exc.code, "status": exc.status}))
