"""An org's cached data as calls read it: its tools, its secret rows (and what calls derive from them), its
deny rules, and the credentials per catalog provider the catalog's ladder chooses from.

Each is read once per cache entry (``svc.caches``, keyed by org, dropped by LISTEN/NOTIFY on any change of
the org: ``treg/org_changes.py``; docs/architecture.md "Caches and LISTEN/NOTIFY") and shared by every
reader: the resolve stage (tools by name and by the address they dial), the authorize stage (deny
rules), the relay (secret values), the catalog stage and the listing routes (:func:`load_org_credentials`,
which reads the same tools and secret rows, so a catalog call on a warm cache issues no query and sees a
secret's change as soon as its notification arrived). Below the call pipeline and above the catalog's
pure values (``treg/catalog/tiers.py``), so neither climbs to reach it.
"""

from __future__ import annotations

import json
from dataclasses import field
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from sqlalchemy import and_, select
from yarl import URL

from treg import deny_rules, tool_urls
from treg.bindings import Binding, compile_plan
from treg.catalog.tiers import OrgCredentials, OwnTool
from treg.context import Services
from treg.domain.access import tool_usable
from treg.domain.deny import DenyRule
from treg.errors import GatewayFailed
from treg.frozen import frozen_value
from treg.identity import Identity
from treg.infra.crypto import DecryptError
from treg.infra.schema import secrets, tools
from treg.infra.upstream import DialKey, dial_key
from treg.oauth.store import org_connections
from treg.query import split_query
from treg.redaction import RedactorMemo


# -- tools ----------------------------------------------------------------------------------------------

@frozen_value
class ToolRef:
    """One tool of an org as calls read it (loaded with the org's tools: :func:`org_tools`)."""

    id: str
    org_id: str
    name: str
    base_url: str
    host: str
    bindings: tuple[Binding, ...]
    project_id: str | None
    allowed_member_ids: tuple[str, ...] | None
    #: True when a binding's secret carries a provider (registry-backed; wins a passthrough tie)
    provider_backed: bool = False
    #: the bindings' injection plan (treg.bindings.InjectionPlan), compiled when the tools cache loads the tool
    plan: Any = field(default=None, repr=False, compare=False)
    #: the base URL without its query and trailing slashes, and its query pairs (split once, at load)
    base: str = field(init=False, repr=False, compare=False)
    base_query: tuple[tuple[str, str | None], ...] = field(init=False, repr=False, compare=False)
    #: ``base`` without its trailing slashes, plus one: where a call's path is appended
    base_slash: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        base, _, query = self.base_url.partition("?")
        object.__setattr__(self, "base", base)
        object.__setattr__(self, "base_slash", base.rstrip("/") + "/")
        object.__setattr__(self, "base_query", tuple(split_query(query)))

    def as_mapping(self) -> dict[str, Any]:
        return {"project_id": self.project_id, "allowed_member_ids": self.allowed_member_ids}


class OrgTools(tuple):  # type: ignore[type-arg]
    """An org's tools (a tuple of :class:`ToolRef`), with an index by name built once per load: a named
    call then costs one dict lookup however many tools the org has."""

    by_name: dict[str, ToolRef]
    #: passthrough candidates by the (scheme, host, port) their base URL dials
    by_dial: dict[DialKey, list[tuple[ToolRef, str]]]

    def __new__(cls, items: Iterable[ToolRef]) -> "OrgTools":
        self = super().__new__(cls, items)
        self.by_name = {}
        for tool in self:
            self.by_name.setdefault(tool.name, tool)  # the first of a name, as a scan would find
        self.by_dial = by_dial(self)
        return self


def cached_org_tools(svc: Services, org_id: str) -> OrgTools | None:
    """The org's tools when the cache has them (no coroutine on the hot path), else None."""
    return svc.caches.tools.get(("tools", org_id))


async def org_tools(svc: Services, org_id: str) -> OrgTools:
    """Every tool of an org (cached; invalidated by LISTEN/NOTIFY on any tool or secret change)."""
    cache = svc.caches.tools

    async def load() -> OrgTools:
        async with svc.db.tx() as tx:
            rows = await tx.fetch_all(select(tools).where(tools.c.org_id == org_id))
            provider_secrets = {r["id"] for r in await tx.fetch_all(
                select(secrets.c.id).where(and_(secrets.c.org_id == org_id, secrets.c.provider.isnot(None))))}
        out = []
        for r in rows:
            bindings = tuple(Binding.from_json(b) for b in r["bindings"])
            base_url = tool_urls.unseal(svc, org_id, r["id"], r["base_url"], r["base_url_sealed"])
            out.append(ToolRef(id=r["id"], org_id=org_id, name=r["name"], base_url=base_url, host=r["host"],
                               bindings=bindings, project_id=r["project_id"],
                               allowed_member_ids=tuple(r["allowed_member_ids"])
                               if r["allowed_member_ids"] is not None else None,
                               provider_backed=any(b.secret_id in provider_secrets for b in bindings),
                               plan=compile_plan(svc.injectors, bindings)))
        return OrgTools(out)

    return cache.get(("tools", org_id)) or await cache.get_or_load(("tools", org_id), org_id, load)


def usable(ident: Identity, tool: ToolRef) -> bool:
    return tool_usable(role=ident.role, member_id=ident.member_id, member_projects=ident.project_ids,
                       tool_project_id=tool.project_id, allowed_member_ids=tool.allowed_member_ids)


def by_dial(tools_: Iterable[ToolRef]) -> dict[DialKey, list[tuple[ToolRef, str]]]:
    """The tools by the (scheme, host, port) their base URL dials, each with its path (no trailing
    ``/``): parsed by the same rules as a passthrough target, so both sides of the match are one parse.
    A base URL yarl cannot parse cannot be dialled either: it serves no passthrough."""
    out: dict[DialKey, list[tuple[ToolRef, str]]] = {}
    for tool in tools_:
        try:
            url = URL(tool.base, encoded=True)
            key = dial_key(url)
        except (ValueError, TypeError):
            continue
        out.setdefault(key, []).append((tool, url.raw_path.rstrip("/")))
    return out


# -- secret rows ----------------------------------------------------------------------------------------

class OrgSecrets(RedactorMemo):
    """An org's encrypted secret rows as cached and, beside them, what calls derive from them: the
    decrypted values and the evidence redactors of the values injected together.

    The derived values live exactly as long as the cached rows: a change to any secret of the org
    (LISTEN/NOTIFY) or the cache's TTL drops the whole object, so no plaintext outlives its row in the
    cache; with the caches off (listener down) every call loads a fresh object and nothing is kept.
    Why keep plaintext at all: decrypting on every call and rebuilding a redactor's encoded variants
    cost a tenth of a call's CPU (a speed trick: docs/performance.md); the values sit in this process's memory during
    each call anyway, and this extends that to the cache's lifetime (``TREG_CACHE_TTL_S``). Never
    logged: the object has no repr of its contents. The redactors are kept as the platform settings'
    are (:class:`~treg.redaction.RedactorMemo`)."""

    __slots__ = ("rows", "_values")

    def __init__(self, rows: dict[str, dict[str, Any]]) -> None:
        super().__init__()
        self.rows = rows
        #: (secret id, field) → plaintext: at most one per row (field) of the org
        self._values: dict[tuple[str, str | None], str] = {}

    def __repr__(self) -> str:
        return f"<OrgSecrets {len(self.rows)} rows>"

    def value(self, svc: Services, binding: Binding) -> str:
        key = (binding.secret_id or "", binding.secret_field)
        value = self._values.get(key)
        if value is None:
            value = _decrypt_value(svc, binding, self.rows)  # a failure is not kept: the next call tries again
            self._values[key] = value
        return value


def cached_org_secret_rows(svc: Services, org_id: str) -> OrgSecrets | None:
    """The org's secret rows when the cache has them (None: :func:`org_secret_rows` loads them): a hot
    caller tries this first, so a hit costs no coroutine."""
    return svc.caches.secrets.get(("secrets", org_id))


async def org_secret_rows(svc: Services, org_id: str) -> OrgSecrets:
    """The org's encrypted secret rows by id (cached; decrypted at first injection, see OrgSecrets)."""
    async def load() -> OrgSecrets:
        async with svc.db.tx() as tx:
            rows = await tx.fetch_all(select(secrets.c.id, secrets.c.org_id, secrets.c.blob, secrets.c.is_json,
                                             secrets.c.provider, secrets.c.created_at)
                                      .where(secrets.c.org_id == org_id))
        return OrgSecrets({r["id"]: r for r in rows})

    return cached_org_secret_rows(svc, org_id) or await svc.caches.secrets.get_or_load(("secrets", org_id), org_id,
                                                                                        load)


def secret_missing() -> GatewayFailed:
    return GatewayFailed("a credential this tool binds no longer exists; an admin must fix the tool",
                         code="secret_missing", blame="org_connection")


def _decrypt_value(svc: Services, binding: Binding, rows: dict[str, dict[str, Any]]) -> str:
    row = rows.get(binding.secret_id or "")
    if row is None:
        raise secret_missing()
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


# -- deny rules -----------------------------------------------------------------------------------------

async def org_deny_rules(svc: Services, org_id: str) -> tuple[DenyRule, ...]:
    cache = svc.caches.deny
    hit = cache.get(("deny", org_id))
    if hit is not None:
        return hit  # type: ignore[no-any-return]
    return await cache.get_or_load(("deny", org_id), org_id, lambda: deny_rules.load_rules(svc, org_id))


# -- the catalog's credentials --------------------------------------------------------------------------

async def load_org_credentials(svc: Services, ident: Identity,
                               providers: Iterable[str] | None = None) -> OrgCredentials:
    """The caller's org credentials per provider (all providers, or only ``providers``): provider
    secrets (newest first) and the caller-usable tools bound to one of them, by name. Read from the
    resolver's caches (:func:`org_secret_rows`, :func:`org_tools`):
    one short read each on a miss, none on a hit, and never a second copy that could go stale."""
    wanted = set(providers) if providers is not None else None
    if wanted is not None and not wanted:
        return OrgCredentials(org_id=ident.org_id)
    own_conns, team_conns = await oauth_connections(svc, ident, wanted)
    stored = await org_secret_rows(svc, ident.org_id)
    rows = sorted((r for r in stored.rows.values()
                   if r["provider"] is not None and (wanted is None or r["provider"] in wanted)),
                  key=lambda r: (r["created_at"], r["id"]), reverse=True)
    if not rows:
        return OrgCredentials(org_id=ident.org_id, own_connections=own_conns, team_connections=team_conns)
    provider_of = {r["id"]: r["provider"] for r in rows}
    team: dict[str, str] = {}
    for r in rows:  # newest first: the first seen per provider wins
        team.setdefault(r["provider"], r["id"])
    own: dict[str, list[OwnTool]] = {}
    # provider_backed: bound to some provider secret (decided at load), the only tools that can qualify
    backed = sorted((t for t in await org_tools(svc, ident.org_id) if t.provider_backed), key=lambda t: t.name)
    for t in backed:
        if not usable(ident, t):
            continue
        pids = dict.fromkeys(provider_of[b.secret_id] for b in t.bindings if b.secret_id in provider_of)
        if not pids:
            continue
        tool = OwnTool(id=t.id, name=t.name, bindings=t.bindings)
        for pid in pids:
            own.setdefault(pid, []).append(tool)
    return OrgCredentials(org_id=ident.org_id,
                          own_tools=MappingProxyType({k: tuple(v) for k, v in own.items()}),
                          team_secrets=MappingProxyType(team), own_connections=own_conns,
                          team_connections=team_conns)


async def oauth_connections(svc: Services, ident: Identity,
                            wanted: set[str] | None) -> tuple[Mapping[str, str], Mapping[str, str]]:
    """provider → the caller's own newest active connection, and the org's newest shared one, for the
    providers that declare OAuth (docs/oauth.md), read from the org's cached connection rows."""
    providers = [p for p in (wanted if wanted is not None else svc.catalog.providers)
                 if (prov := svc.catalog.providers.get(p)) is not None and prov.oauth is not None]
    if not providers:
        return _EMPTY, _EMPTY
    cached = await org_connections(svc, ident.org_id)
    own: dict[str, str] = {}
    team: dict[str, str] = {}
    for pid in providers:
        mine, shared = cached.newest(pid, ident)
        if mine:
            own[pid] = mine
        if shared:
            team[pid] = shared
    return MappingProxyType(own), MappingProxyType(team)


_EMPTY: Mapping[str, str] = MappingProxyType({})
