"""Authorize stage: the tool ACL, then the org's deny rules on the resolved upstream.

Deny rules apply to every role (a guardrail, not a permission) and to both call shapes, because they
are matched against where the call actually goes. The path and method are compared as the upstream
will understand them (``treg/domain/deny.py``): ``/v1/%63harges``, ``/V1//x/../charges;p`` and an
``X-HTTP-Method-Override: post`` cannot dodge a rule on ``POST /v1/charges``.

A ``_method`` field in the body (``treg/domain/body_methods.py``: a form, multipart or JSON body) counts
as the method too, but the body is read only when it could change the answer: some rule with a method
holds on every other axis, and the body is of a kind frameworks read a method from. Every other body
keeps streaming untouched. A body to read that is still a stream (over the edge's buffering size, or
chunked) is read here, at most ``TREG_DENY_BODY_MAX_BYTES``, and relayed from memory; a larger one (or
one whose ``_method`` cannot be told) is refused, 403 ``deny_body_uninspectable``, naming the rule.
"""

from __future__ import annotations

from dataclasses import replace
from urllib.parse import urlsplit

from treg.call.bodies import read_bounded
from treg.call.types import CallInput, ResolvedTarget
from treg.context import Services
from treg.domain import body_methods
from treg.domain.deny import DenyRule, first_match, rule_needing_the_body
from treg.errors import Forbidden
from treg.identity import Identity
from treg.org_data import org_deny_rules, usable


async def authorize(svc: Services, ident: Identity, inp: CallInput, target: ResolvedTarget) -> CallInput:
    """The call's input, its body read into memory when a deny rule needed to see it. ``inp.headers``
    are the caller's: a method-override header among them counts as the method."""
    if target.tool is not None and not usable(ident, target.tool):
        raise Forbidden(f"you may not use the tool {target.tool.name!r} (project scope or allowed members)",
                        code="tool_forbidden", refused_by="acl")
    rules = await org_deny_rules(svc, ident.org_id)
    if not rules:
        return inp
    parts = urlsplit(target.upstream_url)
    host = parts.netloc.rpartition("@")[2]
    scheme, path, project_id = parts.scheme.lower(), parts.path or "/", target.project_id
    # the raw path: first_match canonicalises it (and the rule's) every way the upstream may read it
    rule = first_match(rules, scheme=scheme, host=host, path=path, method=inp.method, member_id=ident.member_id,
                       project_id=project_id, headers=inp.headers, query=target.query)
    if rule is None and inp.body is not None and body_methods.kinds(inp.headers):
        pending = rule_needing_the_body(rules, scheme=scheme, host=host, path=path, method=inp.method,
                                        member_id=ident.member_id, project_id=project_id, headers=inp.headers,
                                        query=target.query)
        if pending is not None:
            inp, found = await _body_methods(svc, inp, host, pending)
            rule = first_match(rules, scheme=scheme, host=host, path=path, method=inp.method,
                               member_id=ident.member_id, project_id=project_id, headers=inp.headers,
                               query=target.query, body_methods=found)
    if rule is not None:
        raise _denied(rule, inp.method, host)
    return inp


def _denied(rule: DenyRule, method: str, host: str) -> Forbidden:
    reason = f": {rule.reason}" if rule.reason else ""
    return Forbidden(f"deny rule {rule.id} blocks {rule.method or method} {host}{rule.path or ''}{reason}",
                     code="denied_by_rule", refused_by="deny", rule=_rule_json(rule))


def _rule_json(rule: DenyRule) -> dict[str, str | None]:
    return {"id": rule.id, "host": rule.host, "path": rule.path, "method": rule.method, "reason": rule.reason}


async def _body_methods(svc: Services, inp: CallInput, host: str, rule: DenyRule) -> tuple[CallInput, list[str]]:
    """The body's ``_method`` values, the body read whole first when it is still a stream (bounded)."""
    limit = svc.settings.deny_body_max_bytes
    body = inp.body
    if not isinstance(body, bytes):
        if inp.content_length is not None and inp.content_length > limit:
            raise _uninspectable(rule, host, f"is larger than {limit} bytes")
        body = await read_bounded(body, limit,  # type: ignore[arg-type]
                                  lambda: _uninspectable(rule, host, f"is larger than {limit} bytes"))
        # relayed from memory from here on (with its Content-Length, as a JSON binding's body is)
        inp = replace(inp, body=body, content_length=len(body))
    found = body_methods.body_methods(inp.headers, body)
    if found is None:
        raise _uninspectable(rule, host, "names _method in a way treg cannot read as one field")
    return inp, found


def _uninspectable(rule: DenyRule, host: str, why: str) -> Forbidden:
    return Forbidden(f"deny rule {rule.id} blocks {rule.method} {host}{rule.path or ''}, and this request's "
                     f"body, which may carry a _method override, {why}; so treg cannot tell whether the "
                     "upstream would act on it as that method", code="deny_body_uninspectable", refused_by="deny",
                     rule=_rule_json(rule),
                     hint="send the method in the request line, or a smaller body (TREG_DENY_BODY_MAX_BYTES)")
