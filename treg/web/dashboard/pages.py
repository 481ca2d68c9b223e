"""The dashboard's pages: each parses its form or query, calls one management function (the same the
API calls) and renders. A refusal re-renders the page with the message beside its field."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import aiohttp_jinja2
from aiohttp import web

from treg import (calls, deny_rules, json_text, member_limits, membership, money, org_data, org_settings,
                  public_demo, secrets_store, tools, ui_sessions)
from treg.catalog import tiers
from treg.catalog.alternatives import alternatives
from treg.errors import BadRequest, TregError
from treg.keys import SERVICES, SETTINGS
from treg.origin import own_origins, sent_from
from treg.ui_sessions import COOKIE
from treg.web.dashboard.base import (NAV, Page, cookie_kwargs, current_session, error_page, field_error, finish,
                                     form_int, page, read_form, see_other)
from treg.web.jsonio import check_text

routes = web.RouteTableDef()

TOOL_FIELDS = {
    "name": ("invalid_name", "tool_exists"),
    "base_url": ("invalid_base_url", "ssrf_refused"),
    "bindings": ("invalid_binding", "invalid_format", "duplicate_binding", "unknown_injector", "unknown_secret",
                 "platform_setting_not_allowed"),
    "project_id": ("invalid_project", "unknown_project"),
}
BINDING_ROWS = 3


def _safe_next(target: str | None) -> str:
    # only a path of the dashboard: a login link must not send anyone to another site
    if target and target.startswith("/ui/") and not target.startswith("//") and "\\" not in target:
        return target
    return "/ui/"


def _login_page(request: web.Request, *, status: int = 200, error: str | None = None, orgs: list[Any] | None = None,
                form: dict[str, str] | None = None) -> web.StreamResponse:
    """The login form, its token bound to the browser's pre-login cookie. Only showing the form (a GET)
    sets that cookie (a new one when the browser has none): an answer to a login post sets none, a
    refusal of one from elsewhere above all (a form shown again there is bound to the cookie the browser
    already has, which a good post carried)."""
    svc = request.app[SERVICES]
    form = form or {}
    issue = request.method == "GET"
    nonce = ui_sessions.login_nonce(request.cookies.get(ui_sessions.LOGIN_COOKIE))
    if nonce is None and issue:
        nonce = ui_sessions.new_login_nonce()
    context = {"error": error, "orgs": orgs or [], "next": _safe_next(form.get("next") or request.query.get("next")),
               "org_value": form.get("org", ""), "ident": None, "nav": NAV, "active": "login", "csrf": "",
               "flash": request.query.get("done"),
               "form_token": ui_sessions.login_form_token(svc, nonce) if nonce else ""}
    resp = finish(aiohttp_jinja2.render_template("login.html", request, context, status=status))
    if issue and nonce:
        # re-set on every showing, so the cookie outlives the form's token; only the login form reads it
        resp.set_cookie(ui_sessions.LOGIN_COOKIE, nonce,
                        **cookie_kwargs(request, ui_sessions.LOGIN_FORM_TTL_S, path="/ui/login"))
    return resp


def _foreign_login(request: web.Request) -> str | None:
    """Why a login post is refused as login CSRF (surfaces.md, Login) by where it comes from, None when it
    is not: it must come from treg's own origin (``Origin``, else ``Referer``; never the Host header)."""
    sockname = request.transport.get_extra_info("sockname") if request.transport is not None else None
    if sent_from(request.headers.get("Origin"), request.headers.get("Referer"),
                 own_origins(request.app[SETTINGS], sockname)):
        return None
    return ("this login was not sent from treg's own login page (its Origin is another site's, or missing); "
            "open the login page at treg's own address and log in there")


def _stale_login_form(request: web.Request, form: dict[str, str]) -> str | None:
    """Why a login post is refused by its form token (the login form's own, for this browser's pre-login
    cookie, not expired), None when it is good."""
    if ui_sessions.login_form_ok(request.app[SERVICES], request.cookies.get(ui_sessions.LOGIN_COOKIE),
                                 form.get("form_token")):
        return None
    return "this login form has expired or did not come from this browser's login page; reload it and log in again"


def _deleting(request: web.Request, path: str) -> dict[str, Any]:
    # with the flags it was set with: a browser replaces a Secure cookie only with a Secure one
    flags = cookie_kwargs(request, None, path=path)
    del flags["max_age"]
    return flags


@routes.get("/ui")
async def ui_root(request: web.Request) -> web.StreamResponse:
    return see_other(request, "/ui/")


@routes.get("/ui/login")
async def login_form(request: web.Request) -> web.StreamResponse:
    return _login_page(request)


@routes.post("/ui/login")
async def login(request: web.Request) -> web.StreamResponse:
    """A login from treg's own login page only (login CSRF: a page elsewhere must not log the browser
    into the attacker's org, where the victim's next secrets would land). Refused: 403, no cookie set."""
    svc = request.app[SERVICES]
    form: dict[str, str] = {}
    try:
        if (refusal := _foreign_login(request)) is not None:  # before reading anything
            return _login_page(request, status=403, error=refusal)
        form = await read_form(request)
        if (refusal := _stale_login_form(request, form)) is not None:
            return _login_page(request, status=403, error=refusal, form=form)
        token = form.get("token", "").strip()
        orgs = await ui_sessions.orgs_of_token(svc, token) if token else []
        if len(orgs) > 1 and not form.get("org"):
            # the user belongs to several orgs: ask which one (the token itself still decides what is allowed)
            return _login_page(request, status=200, orgs=orgs, form=form,
                               error="your user belongs to several orgs: choose one")
        session_id, session = await ui_sessions.login(svc, token, form.get("org"))
    except TregError as exc:
        orgs = []
        return _login_page(request, status=exc.status, error=exc.detail, form=form, orgs=orgs)
    resp = see_other(request, _safe_next(form.get("next")))
    resp.set_cookie(COOKIE, session_id, **cookie_kwargs(request, svc.settings.ui_session_ttl_s))
    # the pre-login cookie has done its work: it is not kept beside the session
    resp.del_cookie(ui_sessions.LOGIN_COOKIE, **_deleting(request, "/ui/login"))
    return resp


@routes.post("/ui/logout")
async def logout(request: web.Request) -> web.StreamResponse:
    svc = request.app[SERVICES]
    try:
        session = await current_session(request)
        if session is not None:
            form = await read_form(request)
            if not ui_sessions.csrf_ok(session, form.get("csrf")):
                return finish(web.Response(status=403, text="this logout was sent without the session's CSRF token"))
            await ui_sessions.logout(svc, request.cookies[COOKIE])
    except TregError as exc:
        return _login_page(request, status=exc.status, error=exc.detail)
    resp = see_other(request, "/ui/login", done="You are logged out.")
    resp.del_cookie(COOKIE, **_deleting(request, "/"))
    return resp


# -- overview ---------------------------------------------------------------------------------------

@routes.get("/ui/")
@page
async def overview(p: Page) -> web.StreamResponse:
    balance = (await money.balance(p.svc, p.ident.org_id)).as_dict()
    recent, _ = await calls.page_calls(p.svc, p.ident, calls.CallFilter(limit=10))
    failing = await calls.failing_upstreams(p.svc, p.ident)
    return p.render("overview.html", "overview", balance=balance, recent=recent, failing=failing)


# -- tools ------------------------------------------------------------------------------------------

def _bindings_of(form: dict[str, str]) -> list[dict[str, Any]]:
    out = []
    for i in range(BINDING_ROWS):
        name = form.get(f"b{i}_name", "").strip()
        if not name:
            continue
        b: dict[str, Any] = {"location": form.get(f"b{i}_location", "header"), "name": name}
        if form.get(f"b{i}_format", "").strip():
            b["format"] = form[f"b{i}_format"]
        source = form.get(f"b{i}_secret", "")
        if source.startswith("platform:"):
            b["platform_setting"] = source.removeprefix("platform:")
        elif source:
            b["secret_id"] = source
        if form.get(f"b{i}_field", "").strip():
            b["secret_field"] = form[f"b{i}_field"].strip()
        out.append(b)
    return out


def _tool_body(form: dict[str, str]) -> dict[str, Any]:
    body: dict[str, Any] = {"name": form.get("name", "").strip(), "base_url": form.get("base_url", "").strip(),
                            "bindings": _bindings_of(form)}
    body["project_id"] = form.get("project_id") or None
    return body


def _tool_form(tool: dict[str, Any]) -> dict[str, str]:
    form = {"name": tool["name"], "base_url": tool["base_url"], "project_id": tool.get("project_id") or ""}
    for i, b in enumerate(tool["bindings"][:BINDING_ROWS]):
        form.update({f"b{i}_location": b.get("location", ""), f"b{i}_name": b.get("name", ""),
                     f"b{i}_format": b.get("format", "") if b.get("format") != "{secret}" else "",
                     f"b{i}_secret": b.get("secret_id") or (f"platform:{b['platform_setting']}"
                                                             if b.get("platform_setting") else ""),
                     f"b{i}_field": b.get("secret_field") or ""})
    return form


async def _tools_page(p: Page, *, status: int = 200, errors: dict[str, str] | None = None,
                      form: dict[str, str] | None = None, editing: dict[str, Any] | None = None) -> web.StreamResponse:
    rows = await tools.list_tools(p.svc, p.ident)
    secrets = await secrets_store.list_secrets(p.svc, p.ident) if p.ident.is_manager else []
    projects = await membership.list_projects(p.svc, p.ident)
    return p.render("tools.html", "tools", status=status, tools=rows, secrets=secrets, projects=projects,
                    errors=errors or {}, form=form if form is not None else {}, editing=editing,
                    locations=sorted(p.svc.injectors), binding_rows=range(BINDING_ROWS),
                    platform_settings=p.svc.settings.tool_platform_settings)


@routes.get("/ui/tools")
@page
async def tools_list(p: Page) -> web.StreamResponse:
    return await _tools_page(p)


@routes.post("/ui/tools")
@page
async def tools_create(p: Page) -> web.StreamResponse:
    try:
        tool = await tools.create_tool(p.svc, p.ident, _tool_body(p.form))
    except TregError as exc:
        return await _tools_page(p, status=exc.status, errors=field_error(exc, TOOL_FIELDS), form=p.form)
    return see_other(p.request, "/ui/tools", done=f"Tool {tool['name']} created.")


@routes.get("/ui/tools/{tool_id}")
@page
async def tools_edit(p: Page) -> web.StreamResponse:
    tool = await tools.get_tool(p.svc, p.ident, p.request.match_info["tool_id"])
    return await _tools_page(p, form=_tool_form(tool), editing=tool)


@routes.post("/ui/tools/{tool_id}")
@page
async def tools_update(p: Page) -> web.StreamResponse:
    tool = await tools.get_tool(p.svc, p.ident, p.request.match_info["tool_id"])
    try:
        tool = await tools.update_tool(p.svc, p.ident, tool["id"], _tool_body(p.form))
    except TregError as exc:
        return await _tools_page(p, status=exc.status, errors=field_error(exc, TOOL_FIELDS), form=p.form,
                                 editing=tool)
    return see_other(p.request, "/ui/tools", done=f"Tool {tool['name']} saved.")


@routes.post("/ui/tools/{tool_id}/delete")
@page
async def tools_delete(p: Page) -> web.StreamResponse:
    await tools.delete_tool(p.svc, p.ident, p.request.match_info["tool_id"])
    return see_other(p.request, "/ui/tools", done="Tool deleted.")


# -- secrets ----------------------------------------------------------------------------------------

async def _secrets_page(p: Page, *, status: int = 200, errors: dict[str, str] | None = None,
                        form: dict[str, str] | None = None) -> web.StreamResponse:
    rows = await secrets_store.list_secrets(p.svc, p.ident) if p.ident.is_manager else []
    # the value is write-only: never put back into the form, not even after a refusal
    kept = {k: v for k, v in (form or {}).items() if k != "value"}
    return p.render("secrets.html", "secrets", status=status, secrets=rows, errors=errors or {}, form=kept)


@routes.get("/ui/secrets")
@page
async def secrets_list(p: Page) -> web.StreamResponse:
    return await _secrets_page(p)


@routes.post("/ui/secrets")
@page
async def secrets_create(p: Page) -> web.StreamResponse:
    value: Any = p.form.get("value", "")
    try:
        if p.form.get("is_json"):
            try:
                value = json_text.parse(value)
            except ValueError as exc:  # not JSON, or nested too deeply (treg/json_text.py)
                raise BadRequest("the value is marked JSON but is not a JSON object", code="invalid_value") from exc
            try:
                check_text(value)  # what the API refuses in a JSON body too: a NUL, a lone surrogate, 64 levels
            except BadRequest as exc:
                raise BadRequest(exc.detail, code="invalid_value") from exc
        body = {"name": p.form.get("name", ""), "value": value}
        if p.form.get("provider", "").strip():
            body["provider"] = p.form["provider"].strip()
        row = await secrets_store.create_secret(p.svc, p.ident, body)
    except TregError as exc:
        return await _secrets_page(p, status=exc.status, form=p.form, errors=field_error(exc, {
            "name": ("invalid_name",), "provider": ("invalid_provider",), "value": ("invalid_value",)}))
    return see_other(p.request, "/ui/secrets", done=f"Secret {row['name']} stored; its value will not be shown again.")


@routes.post("/ui/secrets/{secret_id}/delete")
@page
async def secrets_delete(p: Page) -> web.StreamResponse:
    await secrets_store.delete_secret(p.svc, p.ident, p.request.match_info["secret_id"])
    return see_other(p.request, "/ui/secrets", done="Secret deleted.")


# -- members and tokens -----------------------------------------------------------------------------

async def _members_page(p: Page, *, status: int = 200, errors: dict[str, str] | None = None,
                        new_token: dict[str, Any] | None = None) -> web.StreamResponse:
    members = await membership.list_members(p.svc, p.ident) if p.ident.is_manager else []
    token_rows = await membership.list_tokens(p.svc, p.ident)
    projects = await membership.list_projects(p.svc, p.ident)
    return p.render("members.html", "members", status=status, members=members, tokens=token_rows,
                    projects=projects, errors=errors or {}, new_token=new_token, roles=membership.ROLES,
                    emails={m["member_id"]: m["email"] for m in members} | {p.ident.member_id: p.ident.email})


@routes.get("/ui/members")
@page
async def members_list(p: Page) -> web.StreamResponse:
    return await _members_page(p)


@routes.post("/ui/members")
@page
async def members_add(p: Page) -> web.StreamResponse:
    body: dict[str, Any] = {"email": p.form.get("email", ""), "role": p.form.get("role", "member")}
    if p.form.get("project_id"):
        body["project_ids"] = [p.form["project_id"]]
    try:
        out = await membership.add_member(p.svc, p.ident, body)
    except TregError as exc:
        return await _members_page(p, status=exc.status, errors=field_error(exc, {
            "email": ("invalid_email", "member_exists"), "role": ("invalid_role", "forbidden_role"),
            "project_id": ("unknown_project", "invalid_project_ids")}))
    # shown once, on this answer only (not a redirect: the token must not sit in a URL or a history entry)
    return await _members_page(p, status=201, new_token={"token": out["token"], "for": out["email"]})


@routes.post("/ui/members/{member_id}/limits")
@page
async def members_limits(p: Page) -> web.StreamResponse:
    """A member's call cap (blank: none), through the same function as PUT /api/v1/members/{id}/limits."""
    member_id = p.request.match_info["member_id"]
    try:
        out = await member_limits.set_limits(p.svc, p.ident, member_id,
                                             {"calls_per_day": form_int(p.form.get("calls_per_day", ""))})
    except TregError as exc:
        # under the member's own row of the form (only the code decides where a message is printed)
        errors = field_error(exc, {f"calls_per_day-{member_id}": ("invalid_limit", "forbidden_role")})
        return await _members_page(p, status=exc.status, errors=errors)
    cap = out["calls_per_day"]
    return see_other(p.request, "/ui/members",
                     done="Call cap removed." if cap is None else f"Call cap set to {cap} a day.")


@routes.post("/ui/tokens")
@page
async def tokens_create(p: Page) -> web.StreamResponse:
    out = await membership.create_token(p.svc, p.ident, p.form.get("member_id") or None)
    return await _members_page(p, status=201, new_token={"token": out["token"], "for": out["member_id"]})


@routes.post("/ui/tokens/{token_id}/revoke")
@page
async def tokens_revoke(p: Page) -> web.StreamResponse:
    await membership.revoke_token(p.svc, p.ident, p.request.match_info["token_id"])
    return see_other(p.request, "/ui/members", done="Token revoked.")


# -- deny rules -------------------------------------------------------------------------------------

async def _deny_page(p: Page, *, status: int = 200, errors: dict[str, str] | None = None) -> web.StreamResponse:
    rules = await deny_rules.list_rules(p.svc, p.ident) if p.ident.is_manager else []
    return p.render("deny.html", "deny", status=status, rules=rules, errors=errors or {})


@routes.get("/ui/deny-rules")
@page
async def deny_list(p: Page) -> web.StreamResponse:
    return await _deny_page(p)


@routes.post("/ui/deny-rules")
@page
async def deny_create(p: Page) -> web.StreamResponse:
    body = {k: p.form[k].strip() for k in ("host", "path", "method", "member_id", "reason") if p.form.get(k, "").strip()}
    body.setdefault("host", "")
    try:
        await deny_rules.create_rule(p.svc, p.ident, body)
    except TregError as exc:
        return await _deny_page(p, status=exc.status, errors=field_error(exc, {
            "host": ("invalid_host",), "path": ("invalid_path",), "method": ("invalid_method",),
            "member_id": ("invalid_member", "unknown_member")}))
    return see_other(p.request, "/ui/deny-rules", done="Deny rule added.")


@routes.post("/ui/deny-rules/{rule_id}/delete")
@page
async def deny_delete(p: Page) -> web.StreamResponse:
    await deny_rules.delete_rule(p.svc, p.ident, p.request.match_info["rule_id"])
    return see_other(p.request, "/ui/deny-rules", done="Deny rule deleted.")


# -- activity ---------------------------------------------------------------------------------------

@routes.get("/ui/activity")
@page
async def activity(p: Page) -> web.StreamResponse:
    q = p.request.query
    filters = {k: q.get(k, "").strip() for k in ("outcome", "tool", "member", "before")}
    f = calls.CallFilter(outcome=filters["outcome"] or None, tool=filters["tool"] or None,
                         member_id=filters["member"] or None, before=filters["before"] or None)
    error = None
    try:
        rows, cursor = await calls.page_calls(p.svc, p.ident, f)
    except TregError as exc:
        rows, cursor, error = [], None, exc.detail
    kept = {k: v for k, v in filters.items() if v and k != "before"}
    next_url = "/ui/activity?" + urllib.parse.urlencode({**kept, "before": cursor}) if cursor else None
    first_url = "/ui/activity" + ("?" + urllib.parse.urlencode(kept) if kept else "")
    return p.render("activity.html", "activity", status=400 if error else 200, calls=rows, filters=filters,
                    outcomes=calls.OUTCOMES, next_url=next_url, first_url=first_url if f.before else None,
                    error=error)


@routes.get("/ui/activity/{call_id}")
@page
async def activity_call(p: Page) -> web.StreamResponse:
    row = await calls.get_call(p.svc, p.ident, p.request.match_info["call_id"])
    evidence = {k: row.get(k) for k in ("error_request", "error_response") if row.get(k) is not None}
    return p.render("call.html", "activity", call=row, evidence={k: _evidence_text(v) for k, v in evidence.items()})


def _evidence_text(ev: dict[str, Any]) -> str:
    """A recorded exchange as it looked on the wire: start line, headers, blank line, body (already
    redacted when it was recorded; a binary body stays its ``{"base64": …}`` form)."""
    start = f"{ev.get('method')} {ev.get('url')}" if "method" in ev else f"HTTP {ev.get('status')}"
    lines = [start] + [f"{name}: {value}" for name, value in ev.get("headers") or []]
    body = ev.get("body")
    text = body if isinstance(body, str) or body is None else json.dumps(body, ensure_ascii=False)
    out = "\n".join(lines) + "\n\n" + (text or "")
    return out + ("\n… (truncated)" if ev.get("body_truncated") and body is not None else "")


# -- catalog ----------------------------------------------------------------------------------------

@routes.get("/ui/catalog")
@page
async def catalog(p: Page) -> web.StreamResponse:
    registry = p.svc.catalog
    text = p.request.query.get("q", "").strip()
    found = registry.search(provider=None, capability=None, q=text or None, status=None)
    alt_lists = {ep.id: [a for a in (registry.with_capability(ep.capability) if ep.capability else ()) if a.id != ep.id]
                 for ep in found}
    providers = {ep.provider for ep in found} | {a.provider for alts in alt_lists.values() for a in alts}
    creds = await org_data.load_org_credentials(p.svc, p.ident, providers)
    rows = []
    for ep in found:
        provider = registry.provider_of(ep)
        tier = tiers.offer_tier(provider, ep, creds, p.svc.settings) if ep.is_live else None
        rows.append({**ep.summary_json(), "tier": tier,
                     "needs": None if tier or not ep.is_live else tiers.needed_tier(provider, ep),
                     "alternatives": alternatives(registry, ep, p.svc.settings, creds) if alt_lists[ep.id] else []})
    return p.render("catalog.html", "catalog", endpoints=rows, q=text)


# -- the org ----------------------------------------------------------------------------------------

@routes.get("/ui/org")
@page
async def org_page(p: Page) -> web.StreamResponse:
    # what GET /api/v1/org answers, and the public demo's state: shown only, the operator's CLI changes it
    org = await org_settings.get_org(p.svc, p.ident)
    demo = await public_demo.status(p.svc, p.ident.org_id)
    bal = await money.balance(p.svc, p.ident.org_id)  # the day's spend, held included, as the budget counts it
    demo["used_today_micro"] = bal.spent_today_micro + bal.held_today_micro
    return p.render("org.html", "org", org=org, demo=demo)


@routes.post("/ui/tokens/table")
@page
async def tokens_create_table(p: Page) -> web.StreamResponse:
    out = await membership.create_token(p.svc, p.ident, None, "table")
    return await _members_page(p, status=201, new_token={"token": out["token"], "for": out["member_id"],
                                                         "scope": "table"})


# -- capacity ---------------------------------------------------------------------------------------

@routes.get("/ui/capacity")
@page
async def capacity(p: Page) -> web.StreamResponse:
    # the same locks GET /api/v1/capacity lists, and like it for owners and admins only
    locks = await p.svc.breaker.locks() if p.ident.is_manager else None
    return p.render("capacity.html", "capacity", locks=locks)


@routes.get("/ui/{rest:.*}")
async def not_found(request: web.Request) -> web.StreamResponse:
    """Any other dashboard path: a page saying so (the API's JSON 404 is for scripts)."""
    session = await current_session(request)
    return error_page(request, 404, "not_found", "there is no such dashboard page", session)
