"""Authorize stage: the tool ACL, then the org's deny rules on the resolved upstream.

Deny rules apply to every role (a guardrail, not a permission) and to both call shapes, because they
are matched against where the call actually goes. The path is matched raw and percent-decoded, so
``/v1/%63harges`` cannot dodge a rule on ``/v1/charges``, and with dot segments removed, so neither can
``/v1/x/../charges``.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from treg import deny_rules
from treg.call.resolve import usable
from treg.call.types import ResolvedTarget
from treg.context import Services
from treg.domain.deny import DenyRule, first_match
from treg.errors import Forbidden
from treg.tenancy import Identity


async def org_deny_rules(svc: Services, org_id: str) -> tuple[DenyRule, ...]:
    cache = svc.extras.get("deny_cache")
    if cache is None:
        return await deny_rules.load_rules(svc, org_id)
    hit = cache.get(("deny", org_id))
    if hit is not None:
        return hit  # type: ignore[no-any-return]
    return await cache.get_or_load(("deny", org_id), org_id, lambda: deny_rules.load_rules(svc, org_id))


def remove_dot_segments(path: str) -> str:
    """RFC 3986 §5.2.4: ``/v1/../admin`` → ``/admin`` (what an ordinary server does with the path)."""
    out: list[str] = []
    segments = path.split("/")
    for i, seg in enumerate(segments):
        if seg == "..":
            if len(out) > 1:
                out.pop()
            if i == len(segments) - 1:
                out.append("")
        elif seg == ".":
            if i == len(segments) - 1:
                out.append("")
        else:
            out.append(seg)
    result = "/".join(out)
    return result if result.startswith("/") else "/" + result


async def authorize(svc: Services, ident: Identity, method: str, target: ResolvedTarget) -> None:
    if target.tool is not None and not usable(ident, target.tool):
        raise Forbidden(f"you may not use the tool {target.tool.name!r} (project scope or allowed members)",
                        code="tool_forbidden", refused_by="acl")
    rules = await org_deny_rules(svc, ident.org_id)
    if not rules:
        return
    parts = urlsplit(target.upstream_url)
    host = parts.netloc.rpartition("@")[2]
    raw_path = parts.path or "/"
    decoded = unquote(raw_path)
    # every spelling a server may resolve the path to: raw, decoded, and with dot segments removed
    spellings = (raw_path, decoded, remove_dot_segments(raw_path), remove_dot_segments(decoded))
    for path in dict.fromkeys(spellings):
        rule = first_match(rules, scheme=parts.scheme.lower(), host=host, path=path, method=method,
                           member_id=ident.member_id, project_id=target.project_id)
        if rule is not None:
            reason = f": {rule.reason}" if rule.reason else ""
            raise Forbidden(f"deny rule {rule.id} blocks {method} {host}{rule.path or ''}{reason}",
                            code="denied_by_rule", refused_by="deny",
                            rule={"id": rule.id, "host": rule.host, "path": rule.path, "method": rule.method,
                                  "reason": rule.reason})
