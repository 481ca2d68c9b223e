"""Who may use a tool (pure rules, unit-testable without a database)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence


def tool_usable(*, role: str, member_id: str, member_projects: Sequence[str] | None,
                tool_project_id: str | None, allowed_member_ids: Sequence[str] | None) -> bool:
    """Owners/admins use every tool; a member needs the tool's project in scope and to be allowed."""
    if role in ("owner", "admin"):
        return True
    if tool_project_id is not None and member_projects is not None and tool_project_id not in member_projects:
        return False
    return allowed_member_ids is None or member_id in allowed_member_ids


def identity_may_use(ident: Any, tool: Mapping[str, Any]) -> bool:
    return tool_usable(role=ident.role, member_id=ident.member_id, member_projects=ident.project_ids,
                       tool_project_id=tool.get("project_id"), allowed_member_ids=tool.get("allowed_member_ids"))
