"""Relay stage: turn a resolved target into the exact upstream request, injecting credentials
(:func:`prepare`), then vet where it goes and send it (:func:`send`).

relay alters only three things (the seed's faithful-relay contract): hop-by-hop headers (re-derived
per hop; the caller's Content-Length is carried), treg's control headers and cookies (dropped), and
the injected credentials (each binding overwrites only its own target). Everything else is verbatim:
method, raw path, every query pair in order with duplicates, headers with duplicates, body bytes.
A JSON binding is the one exception that buffers and reserializes the body.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from multidict import CIMultiDict

from treg import json_text
from treg.bindings import Binding, OutgoingRequest, compile_plan
from treg.call import headers as hdr
from treg.call.bodies import buffer_body
from treg.call.target import ensure_dials
from treg.call.types import CallInput, PreparedRequest, ResolvedTarget
from treg.context import Services
from treg.domain.deny import may_act_on
from treg.errors import BadRequest, GatewayFailed
from treg.infra import upstream
from treg.infra.schema import INT_MAX
from treg.infra.upstream import UpstreamRequest, UpstreamResponse
from treg.oauth import credentials as oauth
from treg.org_data import OrgSecrets, cached_org_secret_rows, org_secret_rows, secret_missing

if TYPE_CHECKING:
    from treg.call.state import CallState


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
        raise secret_missing()
    return stored.value(svc, binding)


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for k, v in pairs:
        if k in seen:
            raise BadRequest(f"the JSON body repeats the key {k!r}; a JSON binding refuses ambiguous bodies",
                             code="duplicate_json_key")
        seen[k] = v
    return seen


def _trace_refused() -> BadRequest:
    # TRACE's answer is the request as the upstream received it, so it would hand the caller the very
    # credential treg keeps from it; RFC 9110 9.3.8: a client MUST NOT send credentials in a TRACE request
    return BadRequest("TRACE is answered with the request the upstream received, and this call injects a "
                      "credential; treg never sends a credential in a TRACE request (RFC 9110, 9.3.8)",
                      code="trace_not_relayed")


def _too_deep() -> BadRequest:
    # Python's parser and writer recurse: a body nested deeper than they can go from here is refused,
    # not a 500 (treg/json_text.py)
    return BadRequest("this tool injects into a JSON body, and the body is nested too deeply to read and rewrite",
                      code="invalid_json_body")


async def prepare(svc: Services, org_id: str, inp: CallInput, target: ResolvedTarget) -> PreparedRequest:
    # the caller's headers as sent: no Accept-Encoding is added (one the caller did not send says "any
    # coding" to the upstream, as it would have directly; the relay passes the coded bytes through, and
    # the metered and archive paths decode or skip them: treg/call/encodings.py). Where treg reads an
    # answer itself (a routed call's children, an MCP tool result) its input asks for identity
    headers = CIMultiDict(hdr.request_headers(inp.headers, svc.host_cookies))
    for k, v in target.extra_headers:
        headers[k] = v
    out = OutgoingRequest(headers=headers, query=list(target.query))
    body = inp.body
    stored: OrgSecrets | None = None
    bindings = target.bindings
    own_tool = target.catalog is None
    for binding in bindings:
        if binding.secret_id:
            stored = cached_org_secret_rows(svc, org_id) or await org_secret_rows(svc, org_id)
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
    # TRACE on the request line, or asked by a method override the upstream may honour: the same echo
    if values and may_act_on("TRACE", inp.method, headers, out.query):
        raise _trace_refused()
    if plan.needs_json:
        raw = await buffer_body(body, svc.settings.json_body_max_bytes)
        if raw.strip():
            try:
                parsed = json_text.parse(raw, object_pairs_hook=_reject_duplicates)
            except BadRequest:
                raise
            except json_text.TooDeep as exc:
                raise _too_deep() from exc
            except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
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
        try:
            body = json_text.dumps(out.json_body, ensure_ascii=False, separators=(",", ":")).encode()
        except json_text.TooDeep as exc:
            raise _too_deep() from exc
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
    state.ttfb_ms = min(int((time.monotonic() - sent_at) * 1000), INT_MAX)  # calls.ttfb_ms is an integer
    if resp.status == 401 and prepared.connections and state.ident is not None:
        # the token was refused: the next call refreshes first; this 401 is relayed as it is, never re-sent
        await oauth.mark_stale(svc, prepared.org_id or state.ident.org_id, prepared.connections)
    return resp
