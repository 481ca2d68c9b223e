"""Relay stage: turn a resolved target into the exact upstream request, injecting credentials
(:func:`prepare`), then vet where it goes and send it (:func:`send`).

relay alters only three things (the seed's faithful-relay contract): hop-by-hop headers (re-derived
per hop; the caller's Content-Length is carried), treg's control headers and cookies (dropped), and
the injected credentials (each binding overwrites only its own target). Everything else is verbatim:
method, raw path, every query pair in order with duplicates, headers with duplicates, body bytes.
A JSON binding is the one exception that buffers and reserializes the body.
"""

from __future__ import annotations

import json
import time
from dataclasses import field
from typing import TYPE_CHECKING, Any, AsyncIterable

from multidict import CIMultiDict
from sqlalchemy import select

from treg.bindings import Binding, OutgoingRequest
from treg.call import headers as hdr
from treg.call.evidence import Redactor
from treg.call.injection import compile_plan
from treg.call.target import ensure_dials
from treg.call.types import CallInput, ResolvedTarget
from treg.context import Services
from treg.errors import BadRequest, GatewayFailed
from treg.frozen import frozen_value
from treg.infra import upstream
from treg.infra.crypto import DecryptError
from treg.infra.schema import secrets
from treg.infra.upstream import UpstreamRequest, UpstreamResponse
from treg.memo import BoundedMemo
from treg.oauth import credentials as oauth

if TYPE_CHECKING:
    from treg.call.state import CallState


class OrgSecrets:
    """An org's encrypted secret rows as cached and, beside them, what calls derive from them: the
    decrypted values and the evidence redactors of the values injected together.

    The derived values live exactly as long as the cached rows: a change to any secret of the org
    (LISTEN/NOTIFY) or the cache's TTL drops the whole object, so no plaintext outlives its row in the
    cache; with the caches off (listener down) every call loads a fresh object and nothing is kept.
    Why keep plaintext at all: decrypting on every call and rebuilding a redactor's encoded variants
    cost a tenth of a call's CPU (a speed trick: docs/performance.md); the values sit in this process's memory during
    each call anyway, and this extends that to the cache's lifetime (``TREG_CACHE_TTL_S``). Never
    logged: the object has no repr of its contents."""

    __slots__ = ("rows", "_values", "_redactors")

    def __init__(self, rows: dict[str, dict[str, Any]]) -> None:
        self.rows = rows
        #: (secret id, field) → plaintext: at most one per row (field) of the org
        self._values: dict[tuple[str, str | None], str] = {}
        #: the values injected together → their redactor; bounded: tools x platform keys of one org
        self._redactors: BoundedMemo[tuple[str, ...], Redactor] = BoundedMemo(64)

    def __repr__(self) -> str:
        return f"<OrgSecrets {len(self.rows)} rows>"

    def value(self, svc: Services, binding: Binding) -> str:
        key = (binding.secret_id or "", binding.secret_field)
        value = self._values.get(key)
        if value is None:
            value = _decrypt_value(svc, binding, self.rows)  # a failure is not kept: the next call tries again
            self._values[key] = value
        return value

    def redactor(self, values: tuple[str, ...]) -> Redactor:
        found = self._redactors.get(values)
        return found if found is not None else self._redactors.put(values, Redactor.for_values(values))


@frozen_value
class PreparedRequest:
    request: UpstreamRequest
    #: every credential value injected (for evidence redaction), never logged nor in a repr
    secret_values: tuple[str, ...] = field(repr=False)
    body_kept: bool  # the body is buffered bytes (evidence may keep it)
    #: memoizes the values' redactor: the org's secrets they came from, or the platform settings' memo
    #: (None: nothing injected)
    secrets: OrgSecrets | None = None
    #: the OAuth connections whose tokens were injected, as (id, token version): an upstream 401 marks
    #: exactly those tokens stale (docs/oauth.md)
    connections: tuple[tuple[str, int], ...] = ()
    #: the org whose credentials were injected (a hub call's: the publisher's; None: the caller's)
    org_id: str | None = None

    def redactor(self) -> Redactor:
        if self.secrets is not None:
            return self.secrets.redactor(self.secret_values)
        return Redactor.for_values(self.secret_values)


async def org_secret_rows(svc: Services, org_id: str) -> OrgSecrets:
    """The org's encrypted secret rows by id (cached; decrypted at first injection, see OrgSecrets)."""
    async def load() -> OrgSecrets:
        async with svc.db.tx() as tx:
            rows = await tx.fetch_all(select(secrets.c.id, secrets.c.org_id, secrets.c.blob, secrets.c.is_json,
                                             secrets.c.provider, secrets.c.created_at)
                                      .where(secrets.c.org_id == org_id))
        return OrgSecrets({r["id"]: r for r in rows})

    cache = svc.caches.secrets
    return cache.get(("secrets", org_id)) or await cache.get_or_load(("secrets", org_id), org_id, load)


def _secret_value(svc: Services, binding: Binding, stored: OrgSecrets | None, *, own_tool: bool) -> str:
    if binding.platform_setting:
        if own_tool and binding.platform_setting.upper() not in {n.upper() for n in svc.settings.tool_platform_settings}:
            # the operator withdrew the opt-in since the tool was registered: fail closed
            raise GatewayFailed(f"this server no longer lets tools inject {binding.platform_setting.upper()}",
                                code="platform_setting_not_allowed", blame="org_connection")
        value = svc.settings.platform_value(binding.platform_setting)
        if value is None:
            raise GatewayFailed(f"this server has no {binding.platform_setting.upper()} configured",
                                code="platform_setting_missing", blame="treg")
        return value.reveal()
    if binding.is_literal:
        return ""
    if stored is None:  # a binding naming no secret at all: as missing as a deleted one
        raise _secret_missing()
    return stored.value(svc, binding)


def _secret_missing() -> GatewayFailed:
    return GatewayFailed("a credential this tool binds no longer exists; an admin must fix the tool",
                         code="secret_missing", blame="org_connection")


def _decrypt_value(svc: Services, binding: Binding, rows: dict[str, dict[str, Any]]) -> str:
    row = rows.get(binding.secret_id or "")
    if row is None:
        raise _secret_missing()
    try:
        raw = svc.box.decrypt(row["blob"], org_id=row["org_id"], secret_id=row["id"])
    except DecryptError as exc:
        raise GatewayFailed(exc.detail, code="secret_undecryptable", blame="treg") from exc
    if row["is_json"]:
        data = json.loads(raw)
        if not binding.secret_field:
            raise GatewayFailed("the tool binds a JSON secret without secret_field", code="secret_field_missing",
                                blame="org_connection")
        value = data.get(binding.secret_field)
        if not isinstance(value, str):
            # a non-string field would inject garbage: refuse (fail closed)
            raise GatewayFailed(f"secret field {binding.secret_field!r} is missing or not a string",
                                code="secret_field_invalid", blame="org_connection")
        return value
    return raw.decode()


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for k, v in pairs:
        if k in seen:
            raise BadRequest(f"the JSON body repeats the key {k!r}; a JSON binding refuses ambiguous bodies",
                             code="duplicate_json_key")
        seen[k] = v
    return seen


async def buffer_body(body: bytes | AsyncIterable[bytes] | None, limit: int) -> bytes:
    if body is None:
        return b""
    if isinstance(body, bytes):
        if len(body) > limit:
            raise BadRequest(f"the body is larger than {limit} bytes", code="body_too_large")
        return body
    parts, size = [], 0
    async for chunk in body:
        size += len(chunk)
        if size > limit:
            raise BadRequest(f"the body is larger than {limit} bytes, the most a JSON binding buffers",
                             code="body_too_large")
        parts.append(chunk)
    return b"".join(parts)


async def prepare(svc: Services, org_id: str, inp: CallInput, target: ResolvedTarget) -> PreparedRequest:
    # the caller's headers as sent: no Accept-Encoding is added (one the caller did not send says "any
    # coding" to the upstream, as it would have directly; the relay passes the coded bytes through, and
    # the metered and archive paths decode or skip them: treg/call/encodings.py). Where treg reads an
    # answer itself (a routed call's children, an MCP tool result) its input asks for identity
    headers = CIMultiDict(hdr.request_headers(inp.headers))
    for k, v in target.extra_headers:
        headers[k] = v
    out = OutgoingRequest(headers=headers, query=list(target.query))
    body = inp.body
    stored: OrgSecrets | None = None
    bindings = target.bindings
    own_tool = target.catalog is None
    for binding in bindings:
        if binding.secret_id:
            stored = await org_secret_rows(svc, org_id)
            break
    # compiled when the tool (or the catalog provider) loaded; a target built without one compiles here
    plan = target.plan or compile_plan(svc.injectors, bindings)
    # OAuth connections: their access tokens, refreshed first when due (no DB connection held meanwhile)
    tokens = await oauth.connection_tokens(svc, org_id, bindings) if plan.connections else None
    steps = []
    values: list[str] = []
    for injector, binding in zip(plan.injectors, bindings, strict=True):
        if injector is None:  # a plugin was removed since registration: fail closed
            raise GatewayFailed(f"no injector for binding location {binding.location!r} is loaded",
                                code="injector_missing", blame="treg")
        if tokens is not None and binding.connection_id:
            value = tokens[binding.connection_id][0].access_token
        else:
            value = _secret_value(svc, binding, stored, own_tool=own_tool)
        steps.append((injector, binding, value))
        if value:  # every value to mask in evidence, raw and rendered
            values.append(value)
            values.append(binding.render(value))
    if plan.needs_json:
        raw = await buffer_body(body, svc.settings.json_body_max_bytes)
        if raw.strip():
            try:
                parsed = json.loads(raw, object_pairs_hook=_reject_duplicates)
            except BadRequest:
                raise
            except RecursionError as exc:  # nested deeper than Python's parser recurses: not a 500
                raise BadRequest("this tool injects into a JSON body, and the body is nested too deeply to parse",
                                 code="invalid_json_body") from exc
            except (ValueError, UnicodeDecodeError) as exc:
                raise BadRequest(f"this tool injects into a JSON body, and the body is not JSON: {exc}",
                                 code="invalid_json_body") from exc
            if not isinstance(parsed, dict):
                raise BadRequest("this tool injects into a JSON body, which must be a JSON object",
                                 code="invalid_json_body")
            out.json_body = parsed
        else:
            out.json_body = {}
    for injector, binding, value in steps:
        try:
            injector.inject(out, binding, value)
        except ValueError as exc:
            raise GatewayFailed(f"the credential could not be injected: {exc}", code="injection_failed",
                                blame="org_connection") from exc
    body_kept = isinstance(body, bytes)
    if out.json_body is not None:
        body = json.dumps(out.json_body, ensure_ascii=False, separators=(",", ":")).encode()
        headers["Content-Length"] = str(len(body))
        if "content-type" not in headers:
            headers["Content-Type"] = "application/json"
        body_kept = True
    elif body is not None:
        if isinstance(body, bytes):
            headers["Content-Length"] = str(len(body))
        elif inp.content_length is not None:
            # carried, not re-derived: without it the stream would be re-framed chunked
            headers["Content-Length"] = str(inp.content_length)
    url = target.upstream_url
    if out.query:
        url += "?" + "&".join(k if v is None else f"{k}={v}" for k, v in out.query)
    used: tuple[tuple[str, int], ...] = ()
    if tokens:  # the refresh tokens are masked too, should an upstream ever echo one
        values += [t.refresh_token for t, _ in tokens.values() if t.refresh_token]
        used = tuple((cid, version) for cid, (_, version) in tokens.items())
    if stored is None and values:
        # platform settings' values live as long as the process: their redactors (whose encoded forms
        # cost more than the rest of a call's bookkeeping) are memoized once, bounded, not built per call
        stored = svc.platform_redactors
    return PreparedRequest(UpstreamRequest(inp.method, url, tuple(headers.items()), body),
                           tuple(values), body_kept, stored, used, org_id)


async def send(svc: Services, state: "CallState") -> UpstreamResponse:
    """The prepared request sent, once the URL it dials is vetted: a passthrough's credential goes only
    where its tool was chosen by, and the host's current resolution is checked before every send,
    kept-alive connection or not (DNS rebinding)."""
    prepared, target = state.prepared, state.target
    assert prepared is not None and target is not None
    state.secret_values = prepared.secret_values
    req = prepared.request
    url = upstream.parse_url(req.url)
    if target.dial is not None:
        ensure_dials(url, target.dial)
    await svc.resolver.vet(url.raw_host or "")  # the null resolver of a process serving no calls refuses
    sent_at = time.monotonic()
    resp = await upstream.send(svc.client, req, url=url)
    state.ttfb_ms = int((time.monotonic() - sent_at) * 1000)
    if resp.status == 401 and prepared.connections and state.ident is not None:
        # the token was refused: the next call refreshes first; this 401 is relayed as it is, never re-sent
        await oauth.mark_stale(svc, prepared.org_id or state.ident.org_id, prepared.connections)
    return resp
