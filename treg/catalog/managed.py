"""An endpoint row's ``managed_resource`` descriptor: the endpoint creates, updates, deletes or uses a
durable object on the vendor's account (a webhook, a campaign), and on treg's own key (the platform
tier, one account shared by every org) treg must know which org owns it (docs/lifecycle.md "Owned
resources"; the pipeline half is ``treg/call/resources.py``).

Two checks at startup, both collected like every catalog problem (plugin, row, field):

* per row (:func:`check_descriptor`): the dict's shape; ``id_path`` on a create (where the answer names
  the new object), ``id_param`` otherwise (a declared, required parameter of the row);
* per catalog (:func:`check_kinds`): a kind that has a create has exactly one delete, which treg can
  call with the id alone (the cleanup of a create whose ownership could not be recorded), and no kind
  is updated, used or deleted that nothing creates (every such call would be refused).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

Role = Literal["create", "update", "delete", "use"]
ROLES: tuple[Role, ...] = ("create", "update", "delete", "use")
KEYS = frozenset({"kind", "role", "id_path", "id_param"})
_KIND = re.compile(r"\A[a-z0-9][a-z0-9_.-]{0,63}\Z")
_PATH_PART = re.compile(r"\A[A-Za-z0-9_-]+\Z")

#: ``add(plugin, row, field, message)``: the loader's problem collector
Add = Callable[[str, str, str, str], None]


@dataclass(frozen=True)
class ManagedResource:
    kind: str
    role: Role
    #: create: the dotted path of the new object's id in the JSON answer (``id``, ``data.id``)
    id_path: str | None = None
    #: update/delete/use: the declared parameter that carries the object's id
    id_param: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "role": self.role}
        if self.id_path is not None:
            out["id_path"] = self.id_path
        if self.id_param is not None:
            out["id_param"] = self.id_param
        return out


def check_descriptor(add: Add, plugin: str, row: str, raw: Any, *, params: Sequence[Any],
                     spooled: bool) -> ManagedResource | None:
    """The row's descriptor (None: none declared, or a problem was added)."""
    if raw is None:
        return None
    field = "managed_resource"
    if not isinstance(raw, Mapping):
        add(plugin, row, field, 'must be a dict {"kind", "role", "id_path" | "id_param"}')
        return None
    found: list[str] = []

    def problem(sub: str, message: str) -> None:
        found.append(sub)
        add(plugin, row, f"{field}.{sub}" if sub else field, message)

    for key in sorted(set(raw) - KEYS):
        problem(key, f"unknown field; known: {sorted(KEYS)}")
    kind, role = raw.get("kind"), raw.get("role")
    if not isinstance(kind, str) or not _KIND.fullmatch(kind):
        problem("kind", f"{kind!r} must be a lower-case name such as 'webhook' (letters, digits, '_', '.', '-')")
    if role not in ROLES:
        problem("role", f"{role!r} is not one of {', '.join(ROLES)}")
    id_path, id_param = raw.get("id_path"), raw.get("id_param")
    if role == "create":
        if not isinstance(id_path, str) or not all(_PATH_PART.fullmatch(p) for p in id_path.split(".")):
            problem("id_path", f"{id_path!r} must name where the answer carries the new id, a dotted path "
                    "such as 'id' or 'data.id'")
        if id_param is not None:
            problem("id_param", "a create names its new id with id_path; id_param is for update, delete and use")
        if spooled:
            problem("", "a create's answer is read whole for its id; it cannot be a spooled_response")
    elif role in ROLES:
        if id_path is not None:
            problem("id_path", "only a create reads the id from the answer; name the parameter with id_param")
        declared = next((p for p in params if getattr(p, "name", None) == id_param), None)
        if not isinstance(id_param, str) or declared is None:
            names = [getattr(p, "name", "?") for p in params]
            problem("id_param", f"{id_param!r} must be one of the endpoint's declared params {names}")
        elif declared.location != "path" and not declared.required:
            problem("id_param", f"param {id_param!r} carries the object's id: declare it \"required\": true")
    if found:
        return None
    return ManagedResource(kind=kind, role=role, id_path=id_path, id_param=id_param)


def check_kinds(add: Add, endpoints: Iterable[Any]) -> None:
    """The catalog-wide rules: per (provider, kind), one delete when anything creates it, and that delete
    callable with the id alone; nothing acts on a kind no endpoint creates."""
    by_kind: dict[tuple[str, str], dict[str, list[Any]]] = {}
    for ep in endpoints:
        m = getattr(ep, "managed_resource", None)
        if m is not None:
            by_kind.setdefault((ep.provider, m.kind), {}).setdefault(m.role, []).append(ep)
    for (provider, kind), roles in sorted(by_kind.items()):
        deletes, creates = roles.get("delete", []), roles.get("create", [])
        if creates and not deletes:
            for ep in creates:
                add(ep.plugin, f"endpoint {ep.id!r}", "managed_resource.kind",
                    f"kind {kind!r} of provider {provider!r} has a create but no delete endpoint: treg deletes "
                    "an object whose ownership it could not record (declare a role \"delete\" row)")
        if len(deletes) > 1:
            for ep in deletes[1:]:
                add(ep.plugin, f"endpoint {ep.id!r}", "managed_resource.role",
                    f"kind {kind!r} of provider {provider!r} already has the delete endpoint {deletes[0].id!r}")
        if creates and deletes:
            ep = deletes[0]
            m = ep.managed_resource
            others = [p.name for p in ep.params if p.required and p.name != m.id_param]
            others += [s for s in ep.slots if s != m.id_param and s not in others]
            if others:
                add(ep.plugin, f"endpoint {ep.id!r}", "managed_resource.id_param",
                    f"treg calls the delete of kind {kind!r} with the id alone to clean up, but it also "
                    f"requires {others}")
        if not creates:
            for role in ("update", "delete", "use"):
                for ep in roles.get(role, []):
                    add(ep.plugin, f"endpoint {ep.id!r}", "managed_resource.kind",
                        f"no endpoint of provider {provider!r} creates kind {kind!r}: on treg's key every "
                        f"{role} would be refused (declare its role \"create\" row)")


def delete_endpoint(endpoints: Iterable[Any], provider: str, kind: str) -> Any:
    """The kind's delete endpoint (the catalog has at most one per kind), or None."""
    for ep in endpoints:
        m = getattr(ep, "managed_resource", None)
        if m is not None and m.role == "delete" and m.kind == kind and ep.provider == provider:
            return ep
    return None
