"""What a hub call's caller is shown and recorded, and the publishing org's row beside it
(docs/sharing.md "Hub").

A call of another org's published tool is audited twice under the caller's call id (the calls table's
key is ``(id, org_id)``, migration 0019):

* **the caller's row** (its org, its member): ``surface: hub``, ``hub_ref``, ``credential_tier: hub``,
  what the caller was charged; of the publisher's setup nothing: no upstream URL, no tool id or host,
  no credential kind or connection, and evidence of what the caller itself sent (``/call/<ref>/…`` and
  its own headers, never the request the relay built with the publisher's credential in it) and of
  the answer as the caller got it (no ``Location`` into the publisher's API, no cookie);
* **the publisher's row** (its org, no member): the call as the relay made it, evidence redacted as
  for any own-tool call (the body of a refusal treg answered the caller with is left out: the caller's
  own deny rule or balance is not the publisher's to read), ``hub_caller_org`` = the caller's org slug
  (never its member), cost 0 (its earning is the ledger's ``earning`` grant, docs/money.md "Hub calls").

An org calling its own ref writes one row, its own, with both ``hub_ref`` and ``hub_caller_org``.

A refusal treg itself answers a hub caller (:func:`scrub_error`) names neither the publisher's upstream
host nor its base URL (the ref stands in for them) nor an injected value; one the publisher must fix
(blame ``org_connection``: a missing secret, an injector gone; its OAuth connection needing a person's
consent, whose link is the publisher's) says only that.
"""

from __future__ import annotations

from typing import Any, Callable

from treg.call import evidence, headers as hdr
from treg.call.types import CallInput, ResolvedTarget
from treg.call_record import CallRecord
from treg.errors import TregError
from treg.identity import Identity
from treg.oauth.errors import ConnectionNeedsReauth, OAuthRefreshFailed
from treg.redaction import Redactor

#: refusals about the publisher's credential the caller cannot act on, whatever their blame: a connection
#: needing a person to consent again carries the publisher's consent link, never a stranger's to open
_PUBLISHERS_TO_FIX = (ConnectionNeedsReauth, OAuthRefreshFailed)
#: answer headers the caller's evidence leaves out: where the publisher's API points, its cookies
_PUBLISHERS = frozenset({"location", "content-location", "set-cookie", "set-cookie2"})


def audit_rows(rec: CallRecord, ident: Identity, target: ResolvedTarget, sent: Callable[[], dict[str, Any]], *,
               answered: bool) -> CallRecord:
    """The caller's row of a hub call, with the publishing org's row as its ``hub_twin`` (built from the
    call's parts, not its state: ``CallState.record`` calls this). ``sent``: the evidence of what the caller
    sent (:func:`sent`), built only for a row that keeps evidence; ``answered``: the publisher's upstream
    answered (its answer is the publisher's to read, a refusal of treg's is not)."""
    hub = target.hub_for(ident.org_id)
    if hub is None:  # the org's own ref: one row, its own
        return rec._replace(surface="hub", hub_ref=target.hub.ref, hub_caller_org=ident.org_slug)
    # a refusal's body is treg's answer to the caller (its own deny rule, its balance): not the publisher's
    # to read; the upstream's answer is
    publisher = rec._replace(org_id=hub.org_id, member_id=None, surface="hub", cost_micro=0, hold_state=None,
                             tag=None, hub_ref=hub.ref, hub_caller_org=ident.org_slug,
                             error_response=rec.error_response if answered else None)
    return rec._replace(surface="hub", upstream_url=None, tool_id=hub.id, tool_name=hub.ref, provider=None,
                        credential_kind=None, connection_id=None, hub_ref=hub.ref,
                        error_request=sent() if rec.error_request is not None else None,
                        error_response=_got(rec.error_response), hub_twin=publisher)


def sent(inp: CallInput, redactor: Redactor) -> dict[str, Any]:
    """The request as the caller sent it (to treg), redacted."""
    body = inp.body if isinstance(inp.body, bytes) else None
    url = "/call/" + inp.rest + ("?" + inp.raw_query if inp.raw_query else "")
    return evidence.request_evidence(inp.method, url, hdr.request_headers(inp.headers), body, body is not None,
                                     redactor)


def _got(answer: dict[str, Any] | None) -> dict[str, Any] | None:
    if not answer or not answer.get("headers"):
        return answer
    return {**answer, "headers": [h for h in answer["headers"] if h[0].lower() not in _PUBLISHERS]}


def scrub_error(exc: TregError, ident: Identity | None, target: ResolvedTarget | None,
                masked: Callable[[str], str]) -> None:
    """``exc`` as a hub caller may read it: the publisher's host and base URL replaced by the ref, injected
    values masked; a failure of the publisher's own setup (blame ``org_connection``, or its OAuth connection
    needing consent or a refresh) named by its code only, its ``connect_url`` and every other extra dropped."""
    hub = target.hub_for(ident.org_id) if ident is not None and target is not None else None
    if hub is None:
        return
    assert target is not None and target.tool is not None
    tool = target.tool
    if exc.blame == "org_connection" or isinstance(exc, _PUBLISHERS_TO_FIX):
        exc.detail = (f"{hub.ref} cannot run: its publisher's setup failed ({exc.code}); the publishing org "
                      "sees the details in its audit")
        exc.args = (exc.detail,)
        exc.extra = {}
        return
    hostname = tool.host.rpartition("@")[2]
    if hostname.startswith("["):
        hostname = hostname.partition("]")[0] + "]"
    else:
        hostname = hostname.partition(":")[0]
    spellings = sorted({tool.base_url, tool.base, tool.base.rstrip("/"), tool.host, hostname} - {""}, key=len,
                       reverse=True)

    def clean(text: str) -> str:
        text = masked(text)
        for s in spellings:
            text = text.replace(s, hub.ref)
        return text

    exc.detail = clean(exc.detail)
    exc.args = (exc.detail,)
    for key, value in list(exc.extra.items()):
        if isinstance(value, str):
            exc.extra[key] = clean(value)
        elif isinstance(value, list) and all(isinstance(v, str) for v in value):
            exc.extra[key] = [clean(v) for v in value]
