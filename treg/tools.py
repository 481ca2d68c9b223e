"""Tools: a name, a base URL and the credential bindings treg injects when relaying to it.

Registration validates everything that would otherwise fail at call time: the base URL (http(s), not
internal: the SSRF registration check), each binding's injector location, its secret (same org,
exists), its format (only ``{secret}``), non-empty names, and no two bindings aimed at one target.
"""

from __future__ import annotations

import re
import string
from typing import Any
from urllib.parse import unquote, urlsplit

from sqlalchemy import and_, delete, func, insert, select, update

from treg import tool_urls
from treg.bindings import Binding, format_fields
from treg.context import Services
from treg.domain.access import identity_may_use
from treg.errors import BadRequest, Conflict, IntegrityError, NotFound, Unprocessable
from treg.identity import Identity, require_manager
from treg.ids import new_id
from treg.infra import ssrf
from treg.infra.db import Tx
from treg.infra.schema import members, oauth_connections, projects, secrets, tools
from treg.management import missing_ids, refuse_unknown_fields
from treg.names import TOOL_NAME
from treg.org_changes import changes
from treg.redaction import MASK, mask_userinfo

_BINDING_KEYS = {"location", "name", "format", "secret_id", "connection_id", "platform_setting", "secret_field"}
_SOURCES = ("secret_id", "connection_id", "platform_setting")
_SETTING_NAME = re.compile(r"\A[A-Za-z][A-Za-z0-9_]{0,127}\Z")
TOOL_FIELDS = ("name", "base_url", "bindings", "project_id", "allowed_member_ids")
TOOL_COLUMNS = (tools.c.id, tools.c.name, tools.c.base_url, tools.c.host, tools.c.bindings, tools.c.project_id,
                tools.c.allowed_member_ids, tools.c.created_at, tools.c.updated_at)


def host_of(url: str) -> str:
    """The contract's tool host: the netloc without user-info, lower-cased, port kept when present."""
    netloc = urlsplit(url).netloc
    return netloc.rpartition("@")[2].lower()


def parse_base_url(raw: Any) -> tuple[str, str, str]:
    """(base_url, host, hostname) of a well-formed http(s) base URL, else 400."""
    if not isinstance(raw, str) or not raw.strip():
        raise BadRequest("base_url is required: an http(s) URL such as https://api.example.com/v1",
                         code="invalid_base_url")
    url = raw.strip()
    if any(c in url for c in "\r\n\t ") or any(ord(c) < 0x20 for c in url):
        raise BadRequest("base_url contains whitespace or control characters", code="invalid_base_url")
    try:
        parts = urlsplit(url)
        port = parts.port  # raises on a bad port
    except ValueError as exc:
        raise BadRequest(f"base_url is not a valid URL: {exc}", code="invalid_base_url") from exc
    if parts.scheme not in ("http", "https"):
        raise BadRequest("base_url must start with http:// or https://", code="invalid_base_url")
    if not parts.hostname:
        raise BadRequest("base_url has no host", code="invalid_base_url")
    if len(parts.hostname) > 253:  # the longest DNS name; the host column is sized for it
        raise BadRequest("base_url's host is longer than 253 characters", code="invalid_base_url")
    _check_host_text(parts.netloc, parts.hostname)
    if parts.fragment:
        raise BadRequest("base_url cannot carry a #fragment", code="invalid_base_url")
    del port
    return url, host_of(url), parts.hostname


#: WHATWG URL's forbidden domain code points (C0 controls, space, DEL and ``# % / : < > ? @ [ \\ ] ^ |``):
#: a host holding one, even percent-encoded, names no host any client can dial, and some parsers read
#: another host or a path out of it (``%40`` as user-info, ``%2F`` as the path, ``\\`` as ``/``)
_NOT_IN_HOST = frozenset("\x00\t\n\r #%/:<>?@[\\]^|\x7f") | frozenset(map(chr, range(0x20)))


def _check_host_text(netloc: str, hostname: str) -> None:
    """400 for a base URL whose host no call could use: a ``\\`` anywhere in the authority (WHATWG
    parsers read it as ``/``: ``http://a.example\\@b.example/`` is ``a.example`` to a browser and
    ``b.example`` to Python), or a host that, percent-decoded (repeatedly, as the SSRF check reads it),
    holds a forbidden domain code point. An IPv6 literal is the URL parser's to check."""
    if "\\" in netloc:
        raise BadRequest("base_url's authority holds a backslash, which URL parsers disagree on (a browser "
                         "reads it as '/')", code="invalid_base_url")
    if netloc.rpartition("@")[2].startswith("["):
        return
    host = hostname
    for _ in range(4):
        decoded = unquote(host, errors="surrogateescape")
        if decoded == host:
            break
        host = decoded
    # a surrogate escape: a byte that is not UTF-8 (``%ff``), no name either
    bad = sorted({c for c in host if c in _NOT_IN_HOST or 0xDC80 <= ord(c) <= 0xDCFF})
    if bad:
        shown = ", ".join(repr(c) if c.isprintable() and c != " " else f"U+{ord(c):04X}" for c in bad)
        raise BadRequest(f"base_url's host holds {shown} (as written or percent-encoded), which no host "
                         "name can hold; no call to it could work", code="invalid_base_url")


async def check_ssrf(svc: Services, hostname: str) -> None:
    """The registration-time SSRF check, by the rules the call-time guard applies (api.md "Registration
    hosts"): the host normalised first (percent-encoded octets, IDNA/UTS-46, full-width and enclosed
    digits), then a numeric or resolved internal address, or a special-use name, is refused (422)."""
    if not svc.ssrf.enabled:
        return
    name = ssrf.normalize_host(hostname)
    addr = ssrf.parse_numeric_host(name)
    if addr is not None:
        refused = svc.ssrf.refused([addr])
    elif ssrf.loopback_name(name):
        # like the call-time resolver: the loopback addresses TREG_SSRF_ALLOW permits are dialled
        loop = svc.ssrf.refused(ssrf.LOOPBACK)
        refused = loop if len(loop) == len(ssrf.LOOPBACK) else []
    else:
        try:  # a process that dials nothing has the null resolver: no address, as for an unresolvable name
            addrs = await svc.resolver.addresses(name)
        except Exception:  # unresolvable now: the call-time guard decides later
            addrs = []
        if ssrf.site_local_name(name):
            if not addrs or not all(svc.ssrf.exempt(a) for a in addrs):
                raise Unprocessable(f"base_url's host {name} is a special-use name (*.local, *.internal) that "
                                    "only ever names a network's inside; treg only relays to public hosts "
                                    "(TREG_SSRF_ALLOW exempts CIDRs for local development)",
                                    code="ssrf_refused", refused_by="ssrf")
            return
        refused = svc.ssrf.refused(addrs)
    if refused:
        raise Unprocessable(f"base_url points at an internal address ({refused[0]}); treg only relays to "
                            "public hosts (TREG_SSRF_ALLOW exempts CIDRs for local development)",
                            code="ssrf_refused", refused_by="ssrf")


def _check_format(where: str, fmt: str) -> None:
    """Only ``{secret}`` itself: no other name, no index/attribute, no ``!r`` conversion, no ``:spec``
    (Binding.render substitutes the literal text ``{secret}``; anything else would be sent verbatim)."""
    if not fmt:
        raise BadRequest(f"{where}.format is empty; omit it for the bare secret, or give a constant",
                         code="invalid_format")
    try:
        parts = list(string.Formatter().parse(fmt))
        format_fields(fmt)
    except ValueError as exc:
        raise BadRequest(f"{where}.format is malformed: {exc} (write {{{{ and }}}} for literal braces)",
                         code="invalid_format") from exc
    bad = sorted({"{" + name + ("!" + conv if conv else "") + (":" + spec if spec else "") + "}"
                  for _, name, spec, conv in parts if name is not None and (name, spec, conv) != ("secret", "", None)})
    if bad:
        raise BadRequest(f"{where}.format may use only the {{secret}} placeholder, not {', '.join(bad)}",
                         code="invalid_format")


async def validate_bindings(svc: Services, tx: Tx, org_id: str, raw: Any, member_id: str | None = None,
                            kept: frozenset[str] = frozenset()) -> list[Binding]:
    """The bindings of a tool, checked (``member_id``: who registers it, whose own connections it may bind;
    ``kept``: connections the tool bound already, which an edit may keep)."""
    if not isinstance(raw, list):
        raise BadRequest("bindings must be a list of binding objects", code="invalid_binding")
    out: list[Binding] = []
    targets: set[tuple[str, str]] = set()
    secret_ids = set()
    for i, item in enumerate(raw):
        where = f"bindings[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"{where} must be an object", code="invalid_binding")
        unknown = set(item) - _BINDING_KEYS
        if unknown:
            raise BadRequest(f"{where} has unknown keys {sorted(unknown)}", code="invalid_binding")
        for key in ("location", "name", "format", "secret_id", "connection_id", "platform_setting", "secret_field"):
            if key in item and item[key] is not None and not isinstance(item[key], str):
                raise BadRequest(f"{where}.{key} must be a string", code="invalid_binding")
        location, name = item.get("location"), item.get("name")
        if not location:
            raise BadRequest(f"{where}.location is required (header, query, json, …)", code="invalid_binding")
        if not name or not name.strip():
            raise BadRequest(f"{where}.name must be a non-empty string", code="invalid_binding")
        if "secret_field" in item and (item["secret_field"] is None or not item["secret_field"].strip()):
            raise BadRequest(f"{where}.secret_field must be a non-empty string when given", code="invalid_binding")
        fmt = item.get("format") if item.get("format") is not None else "{secret}"
        _check_format(where, fmt)
        if sum(bool(item.get(k)) for k in _SOURCES) != 1:
            raise BadRequest(f"{where} needs exactly one of secret_id, connection_id and platform_setting",
                             code="invalid_binding")
        if item.get("connection_id") and item.get("secret_field"):
            raise BadRequest(f"{where}.secret_field picks a field of a JSON secret; a connection's value is its "
                             "access token", code="invalid_binding")
        if item.get("platform_setting") and not _SETTING_NAME.fullmatch(item["platform_setting"]):
            raise BadRequest(f"{where}.platform_setting must be a setting name such as TREG_PLATFORM_ADS_TOKEN",
                             code="invalid_binding")
        if item.get("platform_setting") and not platform_setting_allowed(svc, item["platform_setting"]):
            # treg's own credential would go to whatever host this tool targets: only the operator may
            # open that door, per setting (the billed catalog keys are never among them by default)
            raise Unprocessable(f"{where}.platform_setting {item['platform_setting']!r} is not one the operator "
                                "lets org tools inject (TREG_TOOL_PLATFORM_SETTINGS)", code="platform_setting_not_allowed")
        binding = Binding(location=location, name=name, format=fmt, secret_id=item.get("secret_id"),
                          platform_setting=item.get("platform_setting"), secret_field=item.get("secret_field"),
                          connection_id=item.get("connection_id"))
        injector = svc.injectors.get(location)
        if injector is None:
            raise Unprocessable(f"{where}.location {location!r} has no injector; known: {sorted(svc.injectors)}",
                                code="unknown_injector")
        try:
            injector.validate(binding)
        except ValueError as exc:
            raise BadRequest(f"{where}: {exc}", code="invalid_binding") from exc
        target = (location, name.lower() if location == "header" else name)
        if target in targets:
            raise BadRequest(f"{where} targets {location} {name!r}, which another binding already sets",
                             code="duplicate_binding")
        targets.add(target)
        if binding.secret_id:
            secret_ids.add(binding.secret_id)
        out.append(binding)
    if secret_ids:
        rows = await tx.fetch_all(select(secrets.c.id, secrets.c.is_json).where(and_(
            secrets.c.org_id == org_id, secrets.c.id.in_(sorted(secret_ids)))))
        found = {r["id"]: r["is_json"] for r in rows}
        for i, b in enumerate(out):
            if b.secret_id and b.secret_id not in found:
                # the id is not echoed: a caller who pasted the secret itself here must not see it come back
                raise Unprocessable(f"bindings[{i}].secret_id is not a secret of this org (GET /api/v1/secrets "
                                    "lists their ids)", code="unknown_secret")
            if b.secret_id and b.secret_field and not found[b.secret_id]:
                raise Unprocessable(f"bindings[{i}].secret_field needs a JSON-object secret", code="invalid_binding")
    await check_connection_bindings(tx, org_id, out, member_id, kept)
    return out


async def check_connection_bindings(tx: Tx, org_id: str, bindings: list[Binding], member_id: str | None,
                                    kept: frozenset[str] = frozenset()) -> None:
    """A binding may name a connection of this org that is shared (the team's), or the registering
    member's own: a tool others may use must not lend them a person's grant that person did not make
    (docs/oauth.md "Using a connection")."""
    wanted = sorted({b.connection_id for b in bindings if b.connection_id})
    if not wanted:
        return
    rows = await tx.fetch_all(select(oauth_connections.c.id, oauth_connections.c.shared,
                                     oauth_connections.c.created_by)
                              .where(and_(oauth_connections.c.org_id == org_id, oauth_connections.c.id.in_(wanted))))
    found = {r["id"]: r for r in rows}
    for i, b in enumerate(bindings):
        if not b.connection_id:
            continue
        row = found.get(b.connection_id)
        if row is None:
            raise Unprocessable(f"bindings[{i}].connection_id is not a connection of this org (GET "
                                "/api/v1/connections lists them)", code="unknown_connection")
        if not row["shared"] and row["created_by"] != member_id and b.connection_id not in kept:
            raise Unprocessable(f"bindings[{i}].connection_id is another member's own connection; bind a shared one "
                                "(POST /api/v1/connections with \"shared\": true) or one you made",
                                code="connection_not_shared")


def platform_setting_allowed(svc: Services, name: str) -> bool:
    return name.upper() in {n.upper() for n in svc.settings.tool_platform_settings}


async def _check_scope(tx: Tx, org_id: str, project_id: Any, allowed: Any) -> None:
    if project_id is not None:
        if not isinstance(project_id, str):
            raise BadRequest("project_id must be a project id (a string) or null", code="invalid_project")
        if await tx.scalar(select(projects.c.id).where(and_(
                projects.c.id == project_id, projects.c.org_id == org_id))) is None:
            raise Unprocessable("project_id is not a project of this org", code="unknown_project")
    if allowed is not None:
        if not isinstance(allowed, list) or not all(isinstance(m, str) for m in allowed):
            raise BadRequest("allowed_member_ids must be a list of member ids or null", code="invalid_members")
        missing = await missing_ids(tx, members, org_id, allowed)
        if missing:
            raise Unprocessable(f"unknown member ids in this org: {sorted(missing)}", code="unknown_member")


def _check_name(name: Any) -> str:
    if not isinstance(name, str) or not name.strip():
        raise BadRequest("a tool needs a non-empty name", code="invalid_name")
    if not TOOL_NAME.fullmatch(name):
        raise BadRequest("a tool name is up to 200 characters of letters, digits, '.', '_', '~' and '-' "
                         "(it is the first path segment of /call/<name>/…)", code="invalid_name")
    return name


def tool_json(row: dict[str, Any]) -> dict[str, Any]:
    out = {k: row[k] for k in ("id", "name", "base_url", "host", "bindings", "project_id", "allowed_member_ids",
                               "created_at")}
    # user:password@ in a base URL is a credential: like a secret's value it is written, never read back
    # (every member who may use the tool lists it); the relay still sends it
    out["base_url"] = mask_userinfo(row["base_url"], MASK)
    out["updated_at"] = row.get("updated_at")
    return out


async def create_tool(svc: Services, ident: Identity, body: dict[str, Any]) -> dict[str, Any]:
    require_manager(ident)
    refuse_unknown_fields(body, TOOL_FIELDS, "a tool")
    name = _check_name(body.get("name"))
    base_url, host, hostname = parse_base_url(body.get("base_url"))
    await check_ssrf(svc, hostname)
    allowed = body.get("allowed_member_ids")
    tool_id = new_id("tool")
    stored_url, sealed = tool_urls.seal(svc, ident.org_id, tool_id, base_url)
    try:
        async with changes(svc, "tools", ident.org_id) as tx:
            bindings = await validate_bindings(svc, tx, ident.org_id, body.get("bindings", []), ident.member_id)
            await _check_scope(tx, ident.org_id, body.get("project_id"), allowed)
            row = await tx.fetch_one(insert(tools).values(
                id=tool_id, org_id=ident.org_id, name=name, base_url=stored_url, base_url_sealed=sealed, host=host,
                bindings=[b.to_json() for b in bindings], project_id=body.get("project_id"),
                allowed_member_ids=list(dict.fromkeys(allowed)) if allowed is not None else None,
            ).returning(*TOOL_COLUMNS))
    except IntegrityError as exc:
        raise Conflict(f"a tool named {name!r} already exists in this org", code="tool_exists") from exc
    assert row is not None
    return tool_json(row)


async def _load(tx: Tx, org_id: str, tool_id: str) -> dict[str, Any]:
    row = await tx.fetch_one(select(*TOOL_COLUMNS).where(and_(tools.c.id == tool_id, tools.c.org_id == org_id)))
    if row is None:
        raise NotFound("no such tool in this org", code="tool_not_found")
    return row


async def _masked_echo(svc: Services, org_id: str, tool_id: str, base_url: Any) -> bool:
    if not isinstance(base_url, str) or MASK not in base_url:
        return False
    async with svc.db.tx() as tx:
        row = await tx.fetch_one(select(tools.c.base_url, tools.c.base_url_sealed)
                                 .where(and_(tools.c.id == tool_id, tools.c.org_id == org_id)))
    return row is not None and row["base_url_sealed"] is not None and row["base_url"] == base_url


async def list_tools(svc: Services, ident: Identity) -> list[dict[str, Any]]:
    async with svc.db.tx() as tx:
        rows = await tx.fetch_all(select(*TOOL_COLUMNS).where(tools.c.org_id == ident.org_id)
                                  .order_by(tools.c.name))
    return [tool_json(r) for r in rows if identity_may_use(ident, r)]


async def get_tool(svc: Services, ident: Identity, tool_id: str) -> dict[str, Any]:
    async with svc.db.tx() as tx:
        row = await _load(tx, ident.org_id, tool_id)
    if not identity_may_use(ident, row):
        raise NotFound("no such tool in this org", code="tool_not_found")
    return tool_json(row)


async def update_tool(svc: Services, ident: Identity, tool_id: str, body: dict[str, Any]) -> dict[str, Any]:
    require_manager(ident)
    refuse_unknown_fields(body, TOOL_FIELDS, "a tool")
    values: dict[str, Any] = {}
    if "name" in body:
        values["name"] = _check_name(body["name"])
    if "base_url" in body and await _masked_echo(svc, ident.org_id, tool_id, body["base_url"]):
        # the masked URL the listing showed, sent back unchanged (an edit form): the sealed credential
        # stays (sealing "[REDACTED]" as the user-info would lose it)
        body = {k: v for k, v in body.items() if k != "base_url"}
    if "base_url" in body:
        base_url, host, hostname = parse_base_url(body["base_url"])
        await check_ssrf(svc, hostname)
        stored_url, sealed = tool_urls.seal(svc, ident.org_id, tool_id, base_url)
        values.update(base_url=stored_url, base_url_sealed=sealed, host=host)
    try:
        async with changes(svc, "tools", ident.org_id) as tx:
            current = await _load(tx, ident.org_id, tool_id)
            if "bindings" in body:
                kept = frozenset(b.get("connection_id") for b in current["bindings"] if b.get("connection_id"))
                values["bindings"] = [b.to_json() for b in await validate_bindings(
                    svc, tx, ident.org_id, body["bindings"], ident.member_id, kept)]
            if "project_id" in body or "allowed_member_ids" in body:
                await _check_scope(tx, ident.org_id, body.get("project_id"), body.get("allowed_member_ids"))
            if "project_id" in body:
                values["project_id"] = body["project_id"]
            if "allowed_member_ids" in body:
                allowed = body["allowed_member_ids"]
                values["allowed_member_ids"] = list(dict.fromkeys(allowed)) if allowed is not None else None
            values["updated_at"] = func.now()
            row = await tx.fetch_one(update(tools).where(and_(tools.c.id == tool_id, tools.c.org_id == ident.org_id))
                                     .values(**values).returning(*TOOL_COLUMNS))
    except IntegrityError as exc:
        raise Conflict(f"a tool named {values.get('name')!r} already exists in this org", code="tool_exists") from exc
    assert row is not None
    return tool_json(row)


async def delete_tool(svc: Services, ident: Identity, tool_id: str) -> None:
    require_manager(ident)
    async with changes(svc, "tools", ident.org_id) as tx:
        n = await tx.execute(delete(tools).where(and_(tools.c.id == tool_id, tools.c.org_id == ident.org_id)))
        if not n:
            raise NotFound("no such tool in this org", code="tool_not_found")
