"""Authorize stage: the tool ACL, then the org's deny rules on the resolved upstream.

Deny rules apply to every role (a guardrail, not a permission) and to both call shapes, because they
are matched against where the call actually goes. The path and method are compared as the upstream
will understand them (``treg/domain/deny.py``): ``/v1/%63harges``, ``/V1//x/../charges;p`` and an
``X-HTTP-Method-Override: post`` cannot dodge a rule on ``POST /v1/charges``.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from treg import deny_rules
from treg.call.org_tools import usable
from treg.call.types import ResolvedTarget
from treg.context import Services
from treg.domain.deny import DenyRule, first_match
from treg.errors import Forbidden
from treg.tenancy import Identity


async def org_deny_rules(svc: Services, org_id: str) -> tuple[DenyRule, ...]:
    cache = svc.caches.deny
    hit = cache.get(("deny", org_id))
    if hit is not None:
        return hit  # type: ignore[no-any-return]
    return await cache.get_or_load(("deny", org_id), org_id, lambda: deny_rules.load_rules(svc, org_id))


async def authorize(svc: Services, ident: Identity, method: str, target: ResolvedTarget,
                    headers: tuple[tuple[str, str], ...]) -> None:
    """``headers`` are the caller's: a method-override header among them counts as the method."""
    if target.tool is not None and not usable(ident, target.tool):
        raise Forbidden(f"you may not use the tool {target.tool.name!r} (project scope or allowed members)",
                        code="tool_forbidden", refused_by="acl")
    rules = await org_deny_rules(svc, ident.org_id)
    if not rules:
        return
    parts = urlsplit(target.upstream_url)
    host = parts.netloc.rpartition("@")[2]
    # the raw path: first_match canonicalises it (and the rule's) every way the upstream may read it
    rule = first_match(rules, scheme=parts.scheme.lower(), host=host, path=parts.path or "/", method=method,
                       member_id=ident.member_id, project_id=target.project_id, headers=headers,
                       query=target.query)
    if rule is not None:
        reason = f": {rule.reason}" if rule.reason else ""
        raise Forbidden(f"deny rule {rule.id} blocks {rule.method or method} {host}{rule.path or ''}{reason}",
                        code="denied_by_rule", refused_by="deny",
                        rule={"id": rule.id, "host": rule.host, "path": rule.path, "method": rule.method,
                              "reason": rule.reason})
