"""``GET /api/v1/openapi.json``: the OpenAPI 3.1 document of the management API.

One table (:data:`OPERATIONS`), kept beside the route tables it describes (treg/web/api.py,
catalog_api.py, money_api.py): each row is one ``(method, path)`` a route table registers, with its
request body and answers. ``tests/test_openapi.py`` compares the table with the routes the app
registers, both ways, so a route added without a row (or a row left after its route went) fails CI;
``tests/test_openapi_fuzz.py`` sends what this document allows (schemathesis) and checks the answers
against it. The request schemas say what the domain modules accept (treg/membership.py, tools.py,
secrets_store.py, deny_rules.py, treg/money/limits.py): a body the schema allows may still be refused
for a reason no schema can express (an unknown project id, a duplicate name), always with the error body.

``HEAD`` is not listed: aiohttp answers it for every ``GET`` route, as HTTP requires (docs/operations.md).
"""

from __future__ import annotations

import copy
from typing import Any

from aiohttp import web

from treg.names import TOOL_NAME_PATTERN
from treg.web.jsonio import json_response

routes = web.RouteTableDef()

PATH = "/api/v1/openapi.json"

_ID = {"type": "string", "minLength": 1}
_NULLABLE_ID = {"type": ["string", "null"]}
_TIME = {"type": "string", "format": "date-time"}
_NULLABLE_TIME = {"type": ["string", "null"], "format": "date-time"}
_IDS = {"type": ["array", "null"], "items": {"type": "string"}}
_MICRO = {"type": "integer", "minimum": 0}
_LIMIT = {"type": ["integer", "null"], "minimum": 0, "maximum": 10 ** 15}
_CALLS_PER_DAY = {"type": ["integer", "null"], "minimum": 0, "maximum": 10 ** 9,
                  "description": "calls a UTC day, any tier, billed or not (docs/money.md); null: no cap"}


def _obj(props: dict[str, Any], required: tuple[str, ...] = (), *, closed: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = list(required)
    if closed:
        out["additionalProperties"] = False  # the domain modules refuse unknown fields (invalid_field)
    return out


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _list_of(key: str, item: str) -> dict[str, Any]:
    return _obj({key: {"type": "array", "items": _ref(item)}}, (key,))


SCHEMAS: dict[str, Any] = {
    "Error": {
        "description": "Every refusal: also sent with the header `X-Treg-Error: 1`. Extra keys (hint, "
                       "did_you_mean, limit, …) may follow; `error` is stable (docs/errors.md).",
        **_obj({"error": {"type": "string", "pattern": "^[a-z0-9_]+$"}, "detail": {"type": "string"},
                "blame": {"enum": ["caller", "treg", "upstream", "org_connection"]}},
               ("error", "detail", "blame")),
    },
    "Me": _obj({"org_id": _ID, "org_slug": _ID, "member_id": _ID, "role": {"enum": ["owner", "admin", "member"]},
                "email": {"type": "string"}, "project_ids": _IDS},
               ("org_id", "org_slug", "member_id", "role", "email", "project_ids")),
    "NewMember": _obj({"email": {"type": "string", "format": "email", "maxLength": 320},
                       "role": {"enum": ["owner", "admin", "member"], "default": "member"},
                       "project_ids": _IDS}, ("email",), closed=True),
    "MemberCreated": _obj({"member_id": _ID, "token": {"type": "string"}, "email": {"type": "string"},
                           "role": {"type": "string"}, "project_ids": _IDS, "org_id": _ID},
                          ("member_id", "token", "email", "role", "project_ids", "org_id")),
    "Member": _obj({"member_id": _ID, "email": {"type": "string"}, "role": {"type": "string"},
                    "project_ids": _IDS, "created_at": _TIME, "calls_per_day": _CALLS_PER_DAY},
                   ("member_id", "email", "role")),
    "MemberLimitsSet": _obj({"calls_per_day": _CALLS_PER_DAY}, ("calls_per_day",), closed=True),
    "MemberLimits": _obj({"member_id": _ID, "calls_per_day": _CALLS_PER_DAY,
                          "calls_today": {"type": "integer", "minimum": 0,
                                          "description": "calls counted against the cap this UTC day"},
                          "resets_at": {"type": "string", "format": "date-time",
                                        "description": "the next UTC midnight"},
                          "daily_cap_micro": _LIMIT},
                         ("member_id", "calls_per_day", "calls_today", "resets_at", "daily_cap_micro")),
    "NewToken": _obj({"member_id": {"type": ["string", "null"],
                                    "description": "another member's id (owner/admin); omitted: your own"},
                      "scope": {"enum": ["full", "table", None], "description": "`table`: a read-only token, "
                                "valid only on GET /table/<endpoint-id> (docs/sharing.md); any member, for "
                                "themselves only. Omitted or null: `full`"}},
                     closed=True),
    "TokenCreated": _obj({"member_id": _ID, "token": {"type": "string", "description": "shown once"},
                          "scope": {"enum": ["full", "table"]}}, ("member_id", "token", "scope")),
    "Token": _obj({"id": _ID, "member_id": _ID, "prefix": {"type": "string"},
                   "scope": {"enum": ["full", "table", "demo"], "description": "`demo`: a public demo's token "
                             "(treg demo token, docs/sharing.md)"},
                   "created_at": _TIME, "last_used_at": _NULLABLE_TIME, "revoked_at": _NULLABLE_TIME},
                  ("id", "member_id", "prefix", "scope")),
    "NewProject": _obj({"name": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": r"\S"}},
                       ("name",), closed=True),
    "Project": _obj({"id": _ID, "name": {"type": "string"}, "created_at": _TIME}, ("id", "name")),
    "NewSecret": _obj({"name": {"type": "string", "minLength": 1, "maxLength": 200, "pattern": r"\S"},
                       "value": {"oneOf": [{"type": "string", "minLength": 1},
                                           {"type": "object", "minProperties": 1}],
                                 "description": "write-only: never returned"},
                       "provider": {"type": ["string", "null"], "pattern": "^[a-z0-9][a-z0-9-]{0,63}$"}},
                      ("name", "value"), closed=True),
    "Secret": _obj({"id": _ID, "name": {"type": "string"}, "provider": {"type": ["string", "null"]},
                    "created_at": _TIME, "updated_at": _TIME}, ("id", "name")),
    "Binding": _obj({"location": {"type": "string", "description": "an injector's location: header, query, json, …"},
                     "name": {"type": "string", "minLength": 1},
                     "format": {"type": ["string", "null"], "description": "constant text with `{secret}`"},
                     "secret_id": {"type": ["string", "null"]},
                     "platform_setting": {"type": ["string", "null"]},
                     "secret_field": {"type": ["string", "null"]}},
                    ("location", "name"), closed=True),
    "NewTool": _obj({"name": {"type": "string", "pattern": f"^{TOOL_NAME_PATTERN}$"},
                     "base_url": {"type": "string", "format": "uri", "description": "http(s) URL, no fragment"},
                     "bindings": {"type": "array", "items": _ref("Binding")},
                     "project_id": _NULLABLE_ID, "allowed_member_ids": _IDS},
                    ("name", "base_url"), closed=True),
    "ToolChange": _obj({"name": {"type": "string", "pattern": f"^{TOOL_NAME_PATTERN}$"},
                        "base_url": {"type": "string", "format": "uri"},
                        "bindings": {"type": "array", "items": _ref("Binding")},
                        "project_id": _NULLABLE_ID, "allowed_member_ids": _IDS}, closed=True),
    "Tool": _obj({"id": _ID, "name": {"type": "string"}, "base_url": {"type": "string"}, "host": {"type": "string"},
                  "bindings": {"type": "array", "items": {"type": "object"}}, "project_id": _NULLABLE_ID,
                  "allowed_member_ids": _IDS, "created_at": _TIME, "updated_at": _NULLABLE_TIME},
                 ("id", "name", "base_url", "host", "bindings")),
    "NewDenyRule": _obj({"host": {"type": "string", "maxLength": 300,
                                  "pattern": r"^(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+)(:\d{1,5})?$"},
                         "path": {"type": ["string", "null"], "pattern": "^/[^?#\\x00-\\x1f\\x7f]*$", "maxLength": 2000},
                         "method": {"type": ["string", "null"], "pattern": "^[A-Za-z]{1,16}$"},
                         "member_id": _NULLABLE_ID, "project_id": _NULLABLE_ID,
                         "reason": {"type": ["string", "null"]}}, ("host",), closed=True),
    "DenyRule": _obj({"id": _ID, "host": {"type": "string"}, "path": {"type": ["string", "null"]},
                      "method": {"type": ["string", "null"]}, "member_id": _NULLABLE_ID, "project_id": _NULLABLE_ID,
                      "reason": {"type": ["string", "null"]}, "created_at": _TIME}, ("id", "host")),
    "Call": _obj({"call_id": _ID, "created_at": _TIME, "method": {"type": "string"}, "target": {"type": "string"},
                  "status": {"type": ["integer", "null"]}, "outcome": {"type": "string"},
                  "refused_by": {"type": ["string", "null"]}, "credential_tier": {"type": ["string", "null"]},
                  "cost_micro": {"type": "integer"}, "duration_ms": {"type": ["integer", "null"]},
                  "kind": {"enum": [None, "async_submit", "async_poll", "async_fetch"]},
                  "demo": {"type": "boolean", "description": "made with a public demo's token (docs/sharing.md)"},
                  "overflow": {"type": ["object", "null"], "description": "the overflow attempt, when the call "
                               "was sent to an aggregator: {aggregator, status, cost_micro} (GET one call only)"},
                  "credential_kind": {"enum": [None, "oauth", "secret", "platform"],
                                      "description": "what was injected (GET one call only)"},
                  "connection_id": {"type": ["string", "null"], "description": "the OAuth connection whose token "
                                    "was injected (GET one call only)"},
                  "hub_ref": {"type": ["string", "null"], "description": "a hub call: the ref called (GET one "
                              "call only; docs/sharing.md)"},
                  "hub_caller_org": {"type": ["string", "null"], "description": "a hub call of your org's tool: "
                                     "the calling org's slug (GET one call only)"}},
                 ("call_id", "outcome")),
    "Balance": _obj({"balance_micro": {"type": "integer"}, "held_micro": _MICRO, "available_micro": {"type": "integer"},
                     "granted_micro": _MICRO, "settled_micro": _MICRO, "daily_cap_micro": _LIMIT,
                     "day": {"type": "string"}, "member": {"type": "object"}}, ("balance_micro", "available_micro")),
    "Limits": {"type": "object", "description": "the org's daily cap, tag budgets and member caps (docs/money.md)"},
    "CapacityLock": _obj({"key": {"type": "string"}, "provider": {"type": "string"},
                          "endpoint": {"type": ["string", "null"]}, "kind": {"enum": ["balance", "quota"]},
                          "since": {"type": "string"}, "until": {"type": ["string", "null"]},
                          "strikes": {"type": "integer"}}, ("key", "provider", "kind")),
    "Resource": _obj({"kind": {"type": "string"}, "provider": {"type": "string"}, "id": {"type": "string"},
                      "state": {"enum": ["active", "deleted"]}, "created_at": _TIME, "updated_at": _TIME,
                      "tag": {"type": ["string", "null"]}, "call_id": {"type": "string"}},
                     ("kind", "provider", "id", "state", "created_at")),
    "Org": _obj({"org_id": _ID, "slug": _ID, "created_at": _TIME, "platform_overflow": {"type": "boolean"},
                 "public_demo": {"type": "boolean", "description": "the operator runs this org as a public demo "
                                 "(treg demo enable|disable: CLI only, docs/sharing.md)"}},
                ("org_id", "slug", "platform_overflow", "public_demo")),
    "OrgChange": _obj({"platform_overflow": {"type": "boolean", "description": "false: this org's platform-tier "
                                             "calls never overflow to aggregators (docs/resilience.md)"}},
                      closed=True),
    "DailyCap": _obj({"micro": _LIMIT}, ("micro",), closed=True),
    "TagBudget": _obj({"budget_micro": _LIMIT}, ("budget_micro",), closed=True),
    "MemberCap": _obj({"daily_cap_micro": _LIMIT}, ("daily_cap_micro",), closed=True),
    "LimitSet": {"type": "object", "description": "the limit as it now stands"},
    "Grant": _obj({"id": _ID, "kind": {"type": "string"}, "amount_micro": {"type": "integer"}}, ("id", "kind")),
    "Endpoint": _obj({"id": _ID, "credential_tier": {"type": ["string", "null"]}, "callable": {"type": "boolean"},
                      "billed": {"type": "boolean"}, "kind": {"enum": ["endpoint", "routed"]},
                      "children": {"type": "array", "items": {"type": "object"}},
                      "guards": {"type": "array", "items": _ref("Guard"),
                                 "description": "integer ranges and defaults enforced on treg's own key (the "
                                                "platform tier) before any hold (docs/plugins.md)"},
                      "success": {"type": ["object", "null"], "description": "the declared success rule "
                                  "{status?, path, absent | equals | nonempty} (GET one endpoint; docs/money.md)"},
                      "table": {"type": ["object", "null"], "description": "GET one endpoint: where its answer's "
                                "rows are, {rows, columns?}; null: not callable on /table/ (docs/sharing.md)"}},
                     ("id", "callable", "billed")),
    "Guard": _obj({"param": {"type": "string"}, "in": {"enum": ["query", "body"]}, "type": {"const": "integer"},
                   "min": {"type": "integer"}, "max": {"type": "integer"}, "default": {"type": "integer"}},
                  ("param", "in", "type")),
    "Provider": _obj({"id": _ID, "platform_key_configured": {"type": "boolean"},
                      "anonymous_allowed": {"type": "boolean"}}, ("id",)),
    "OAuthAppSet": _obj({"client_id": {"type": "string", "minLength": 1, "maxLength": 2000, "pattern": r"\S"},
                         "client_secret": {"type": "string", "minLength": 1, "maxLength": 2000, "pattern": r"\S",
                                           "description": "write-only: sealed, never returned"}},
                        ("client_id", "client_secret"), closed=True),
    "OAuthApp": _obj({"provider": _ID, "client_id": {"type": "string"}, "source": {"enum": ["org", "deployment"]}},
                     ("provider", "client_id", "source")),
    "NewConnection": _obj({"provider": {"type": "string", "description": "a catalog provider that declares oauth"},
                           "scopes": {"type": ["array", "null"], "items": {"type": "string"},
                                      "description": "omitted or empty: the provider's own list"},
                           "name": {"type": "string", "minLength": 1, "maxLength": 200},
                           "shared": {"type": "boolean", "description": "the org's (team tier; owner/admin), "
                                      "else the creating member's own"},
                           "redirect_after": {"type": ["string", "null"], "description": "a URL on treg's own origin "
                                              "the browser goes to once connected"}},
                          ("provider",), closed=True),
    "ConnectionCreated": _obj({"id": _ID, "provider": _ID, "name": {"type": "string"}, "status": {"const": "pending"},
                               "shared": {"type": "boolean"}, "scopes": {"type": "array", "items": {"type": "string"}},
                               "connect_url": {"type": "string", "description": "single-use, for a person to open "
                                               "in a browser (no treg login)"},
                               "connect_expires_at": _TIME},
                              ("id", "provider", "name", "status", "connect_url", "connect_expires_at")),
    "Connection": _obj({"id": _ID, "provider": _ID, "name": {"type": "string"},
                        "status": {"enum": ["pending", "active", "needs_reauth", "denied"]},
                        "shared": {"type": "boolean"}, "scopes": {"type": "array", "items": {"type": "string"}},
                        "expires_at": _NULLABLE_TIME, "created_by": _NULLABLE_ID, "created_at": _TIME,
                        "last_refreshed_at": _NULLABLE_TIME, "refresh_count": {"type": "integer"},
                        "connect_url": {"type": ["string", "null"], "description": "while a pending or "
                                        "needs_reauth connection's link is valid"},
                        "connect_expires_at": _NULLABLE_TIME,
                        "refreshes": {"type": "array", "description": "GET one connection: the last 20, newest first",
                                      "items": _obj({"at": _TIME, "outcome": {"enum": ["ok", "invalid_grant",
                                                                                      "failed"]}})}},
                       ("id", "provider", "name", "status", "shared", "created_at")),
    "NewHubTool": _obj({"tool_id": {"type": "string", "minLength": 1, "description": "one of the org's tools"},
                        "name": {"type": "string", "pattern": f"^{TOOL_NAME_PATTERN}$",
                                 "description": "the ref is <org-slug>.<name>"},
                        "description": {"type": "string", "maxLength": 2000},
                        "price_micro": {"type": ["integer", "null"], "minimum": 0, "maximum": 10 ** 9,
                                        "description": "what a call charges the caller's org (micro-USD; 0 or "
                                                       "omitted: free), credited to this org"},
                        "max_runs": {"type": ["integer", "null"], "minimum": 1, "maximum": 1000,
                                     "description": "most calls of this tool at once (null: the org's limit, "
                                                    "TREG_HUB_MAX_RUNS_PER_TEAM)"}},
                       ("tool_id", "name", "description"), closed=True),
    "HubTool": _obj({"id": _ID, "ref": {"type": "string", "description": "call it as /call/<ref>/<path>"},
                     "org_slug": _ID, "name": {"type": "string"}, "description": {"type": "string"},
                     "price_micro": _MICRO, "max_runs": {"type": ["integer", "null"]}, "created_at": _TIME,
                     "own": {"type": "boolean", "description": "published by your org"},
                     "tool_id": {"type": "string", "description": "your org's tool (own entries only)"}},
                    ("id", "ref", "org_slug", "name", "description", "price_micro", "max_runs", "own")),
}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_ERROR = {"$ref": "#/components/responses/Error"}

#: refusals any authenticated route may answer: bad input, no/invalid token, wrong org or role, the
#: database unavailable
_COMMON = ("400", "401", "403", "503")


def _op(op_id: str, summary: str, ok: str, ok_schema: dict[str, Any] | None, *, body: str | None = None,
        body_optional: bool = False, errors: tuple[str, ...] = (), params: tuple[dict[str, Any], ...] = (),
        public: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"operationId": op_id, "summary": summary}
    if params or not public:
        out["parameters"] = list(params) + ([] if public else [{"$ref": "#/components/parameters/Org"}])
    if body is not None:
        out["requestBody"] = {"required": not body_optional,
                              "content": {"application/json": {"schema": _ref(body)}}}
    responses: dict[str, Any] = {ok: _json(ok_schema, "success") if ok_schema is not None
                                 else {"description": "done (no body)"}}
    for code in (() if public else _COMMON) + errors:
        responses[code] = _ERROR
    out["responses"] = responses
    if public:
        out["security"] = []
    return out


def _path_param(name: str, description: str) -> dict[str, Any]:
    return {"name": name, "in": "path", "required": True, "description": description,
            "schema": {"type": "string", "minLength": 1}}


_TOOL_ID = _path_param("tool_id", "a tool id (GET /api/v1/tools)")
_MEMBER_ID = _path_param("member_id", "a member id (GET /api/v1/members)")
_PROVIDER = _path_param("provider", "a catalog provider that declares oauth (GET /api/v1/catalog/providers)")
_CONNECTION_ID = _path_param("connection_id", "a connection id (GET /api/v1/connections)")

#: (method, path) -> operation: one row per route the management route tables register
OPERATIONS: dict[tuple[str, str], dict[str, Any]] = {
    ("GET", PATH): _op("openapi", "this document", "200", {"type": "object"}, public=True),
    ("GET", "/api/v1/me"): _op("me", "who the token is", "200", _ref("Me")),
    ("POST", "/api/v1/members"): _op("addMember", "add a member (owner/admin); answers their first token",
                                     "201", _ref("MemberCreated"), body="NewMember", errors=("409", "422")),
    ("GET", "/api/v1/members"): _op("listMembers", "the org's members (owner/admin)", "200",
                                    _list_of("members", "Member")),
    ("GET", "/api/v1/members/{member_id}/limits"): _op(
        "getMemberLimits", "a member's limits: call cap, calls today, daily money cap (yourself; any member for "
        "owner/admin)", "200", _ref("MemberLimits"), errors=("404",), params=(_MEMBER_ID,)),
    ("PUT", "/api/v1/members/{member_id}/limits"): _op(
        "putMemberLimits", "set or remove a member's cap on calls a UTC day (owner/admin; only an owner limits an "
        "owner)", "200", _ref("MemberLimits"), body="MemberLimitsSet", errors=("404",), params=(_MEMBER_ID,)),
    ("POST", "/api/v1/tokens"): _op("createToken", "a new token for yourself, or a member (owner/admin); "
                                    "`scope: table` for a read-only /table/ token", "201",
                                    _ref("TokenCreated"), body="NewToken", body_optional=True, errors=("404",)),
    ("GET", "/api/v1/tokens"): _op("listTokens", "tokens (yours; every member's for owner/admin)", "200",
                                   _list_of("tokens", "Token")),
    ("DELETE", "/api/v1/tokens/{token_id}"): _op(
        "revokeToken", "revoke a token", "204", None, errors=("404",),
        params=(_path_param("token_id", "a token id (GET /api/v1/tokens)"),)),
    ("POST", "/api/v1/projects"): _op("createProject", "create a project (owner/admin)", "201", _ref("Project"),
                                      body="NewProject", errors=("409",)),
    ("GET", "/api/v1/projects"): _op("listProjects", "the projects you can see", "200",
                                     _list_of("projects", "Project")),
    ("POST", "/api/v1/secrets"): _op("createSecret", "store a secret (owner/admin); its value is never returned",
                                     "201", _ref("Secret"), body="NewSecret"),
    ("GET", "/api/v1/secrets"): _op("listSecrets", "secrets, without values (owner/admin)", "200",
                                    _list_of("secrets", "Secret")),
    ("DELETE", "/api/v1/secrets/{secret_id}"): _op(
        "deleteSecret", "delete a secret no tool binds (owner/admin)", "204", None, errors=("404", "409"),
        params=(_path_param("secret_id", "a secret id (GET /api/v1/secrets)"),)),
    ("POST", "/api/v1/tools"): _op("createTool", "register a tool (owner/admin)", "201", _ref("Tool"),
                                   body="NewTool", errors=("409", "422", "502")),
    ("GET", "/api/v1/tools"): _op("listTools", "the tools you may use", "200", _list_of("tools", "Tool")),
    ("GET", "/api/v1/tools/{tool_id}"): _op("getTool", "one tool", "200", _ref("Tool"), errors=("404",),
                                            params=(_TOOL_ID,)),
    ("PATCH", "/api/v1/tools/{tool_id}"): _op("updateTool", "change a tool (owner/admin)", "200", _ref("Tool"),
                                              body="ToolChange", errors=("404", "409", "422", "502"),
                                              params=(_TOOL_ID,)),
    ("DELETE", "/api/v1/tools/{tool_id}"): _op("deleteTool", "delete a tool (owner/admin)", "204", None,
                                               errors=("404",), params=(_TOOL_ID,)),
    ("POST", "/api/v1/deny-rules"): _op("createDenyRule", "add a deny rule (owner/admin)", "201", _ref("DenyRule"),
                                        body="NewDenyRule", errors=("422",)),
    ("GET", "/api/v1/deny-rules"): _op("listDenyRules", "the org's deny rules (owner/admin)", "200",
                                       _list_of("deny_rules", "DenyRule")),
    ("DELETE", "/api/v1/deny-rules/{rule_id}"): _op(
        "deleteDenyRule", "delete a deny rule (owner/admin)", "204", None, errors=("404",),
        params=(_path_param("rule_id", "a deny rule id"),)),
    ("GET", "/api/v1/calls"): _op(
        "listCalls", "audited calls, newest first (yours; the org's for owner/admin)", "200",
        _list_of("calls", "Call"),
        params=({"name": "limit", "in": "query", "required": False,
                 "schema": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50}},
                {"name": "kind", "in": "query", "required": False,
                 "schema": {"enum": ["async_submit", "async_poll", "async_fetch"]},
                 "description": "only calls of this kind; without it, async polls are left out"})),
    ("GET", "/api/v1/calls/{call_id}"): _op("getCall", "one audited call", "200", _ref("Call"), errors=("404",),
                                            params=(_path_param("call_id", "a call id (X-Treg-Call-Id)"),)),
    ("GET", "/api/v1/catalog/endpoints"): _op(
        "listEndpoints", "catalog endpoints and the credential tier you would get", "200",
        _obj({"endpoints": {"type": "array", "items": _ref("Endpoint")},
              "hint": {"type": "string", "description": "no endpoint matched: what to try next (as MCP "
                       "catalog_search says)"},
              "capabilities": {"type": "array", "items": {"type": "string"},
                               "description": "no endpoint matched: every capability to search by"}},
             ("endpoints",)),
        params=tuple({"name": n, "in": "query", "required": False, "schema": s} for n, s in (
            ("provider", {"type": "string"}), ("capability", {"type": "string"}), ("q", {"type": "string"}),
            ("status", {"enum": ["live", "retired", "broken"]})))),
    ("GET", "/api/v1/catalog/endpoints/{endpoint_id}"): _op(
        "getEndpoint", "one catalog endpoint, its parameters and alternatives", "200", _ref("Endpoint"),
        errors=("404",), params=(_path_param("endpoint_id", "an endpoint id such as github.get_user"),)),
    ("GET", "/api/v1/catalog/providers"): _op("listProviders", "catalog providers", "200",
                                              _list_of("providers", "Provider")),
    ("GET", "/api/v1/balance"): _op("getBalance", "the org's balance and your spend today", "200", _ref("Balance")),
    ("GET", "/api/v1/limits"): _op("getLimits", "the org's limits", "200", _ref("Limits")),
    ("PUT", "/api/v1/limits/daily-cap"): _op("putDailyCap", "set or remove the org's daily cap (owner/admin)",
                                             "200", _ref("LimitSet"), body="DailyCap"),
    ("PUT", "/api/v1/limits/tags/{tag}"): _op(
        "putTagBudget", "set or remove a tag's budget (owner/admin)", "200", _ref("LimitSet"), body="TagBudget",
        params=({"name": "tag", "in": "path", "required": True,
                 "schema": {"type": "string", "pattern": "^[!-~]{1,200}$"}},)),
    ("PUT", "/api/v1/limits/members/{member_id}"): _op(
        "putMemberCap", "set or remove a member's daily cap (owner/admin)", "200", _ref("LimitSet"),
        body="MemberCap", errors=("404",), params=(_path_param("member_id", "a member id"),)),
    ("GET", "/api/v1/capacity"): _op("listCapacityLocks", "the platform tier's capacity locks (owner/admin; "
                                     "docs/resilience.md)", "200", _list_of("locks", "CapacityLock")),
    ("GET", "/api/v1/resources"): _op(
        "listResources", "objects the org created on treg's platform vendor accounts, newest first "
        "(docs/lifecycle.md)", "200", _list_of("resources", "Resource"),
        params=({"name": "limit", "in": "query", "required": False,
                 "schema": {"type": "integer", "minimum": 1, "maximum": 500, "default": 50}},
                {"name": "state", "in": "query", "required": False, "schema": {"enum": ["active", "deleted"]}},
                {"name": "kind", "in": "query", "required": False, "schema": {"type": "string"}},
                {"name": "provider", "in": "query", "required": False, "schema": {"type": "string"}})),
    ("GET", "/api/v1/org"): _op("getOrg", "the org and its settings", "200", _ref("Org")),
    ("PATCH", "/api/v1/org"): _op("updateOrg", "change the org's settings (owner only)", "200", _ref("Org"),
                                  body="OrgChange", errors=("404",)),
    ("PUT", "/api/v1/oauth-apps/{provider}"): _op(
        "putOAuthApp", "register the org's own OAuth app at a provider (owner/admin); the secret is never returned",
        "200", _ref("OAuthApp"), body="OAuthAppSet", errors=("404",), params=(_PROVIDER,)),
    ("GET", "/api/v1/oauth-apps/{provider}"): _op(
        "getOAuthApp", "the OAuth app connections at a provider use: the org's, else the deployment's", "200",
        _ref("OAuthApp"), errors=("404",), params=(_PROVIDER,)),
    ("DELETE", "/api/v1/oauth-apps/{provider}"): _op(
        "deleteOAuthApp", "remove the org's own OAuth app at a provider (owner/admin)", "204", None,
        errors=("404",), params=(_PROVIDER,)),
    ("POST", "/api/v1/connections"): _op(
        "createConnection", "a pending OAuth connection and the single-use connect_url a person opens "
        "(docs/oauth.md)", "201", _ref("ConnectionCreated"), body="NewConnection", errors=("422",)),
    ("GET", "/api/v1/connections"): _op(
        "listConnections", "OAuth connections, newest first (yours and the shared ones; every one for owner/admin); "
        "never a token", "200", _list_of("connections", "Connection")),
    ("GET", "/api/v1/connections/{connection_id}"): _op(
        "getConnection", "one connection with its last 20 refreshes", "200", _ref("Connection"), errors=("404",),
        params=(_CONNECTION_ID,)),
    ("DELETE", "/api/v1/connections/{connection_id}"): _op(
        "deleteConnection", "revoke (RFC 7009, when the provider declares it) and delete a connection (its "
        "creator, owner/admin)", "204", None, errors=("404",), params=(_CONNECTION_ID,)),
    ("POST", "/api/v1/connections/{connection_id}/refresh"): _op(
        "refreshConnection", "refresh the connection's token now (its creator, owner/admin)", "200",
        _ref("Connection"), errors=("404", "409", "502"), params=(_CONNECTION_ID,)),
    ("POST", "/api/v1/hub/tools"): _op(
        "publishHubTool", "publish one of the org's tools to every org on this treg as <org-slug>.<name> "
        "(owner/admin; docs/sharing.md)", "201", _ref("HubTool"), body="NewHubTool", errors=("404", "409")),
    ("GET", "/api/v1/hub/tools"): _op(
        "listHubTools", "every published hub tool, of every org (never a base URL, secret or binding)", "200",
        _list_of("tools", "HubTool")),
    ("DELETE", "/api/v1/hub/tools/{hub_tool_id}"): _op(
        "unpublishHubTool", "unpublish one of the org's hub tools (owner/admin): its ref is gone at once", "204",
        None, errors=("404",), params=(_path_param("hub_tool_id", "a hub tool id (GET /api/v1/hub/tools)"),)),
    ("GET", "/api/v1/credits"): _op("listCredits", "the org's credit ledger, newest first (owner/admin)", "200",
                                    _list_of("grants", "Grant")),
}


def body_fields(method: str, path: str) -> frozenset[str] | None:
    """The fields the request body of ``method path`` may hold, when its schema is closed
    (``additionalProperties: false``); None: the route takes no body, or an open one. The management
    routes enforce this (treg.web.errors.add_routes, read_json_object), so the document and the
    answers cannot disagree: an unknown field is 400 ``invalid_field`` on every closed route."""
    op = OPERATIONS.get((method.upper(), path))
    ref = (op or {}).get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema", {})
    schema = SCHEMAS.get(ref.get("$ref", "").rpartition("/")[2])
    if schema is None or schema.get("additionalProperties") is not False:
        return None
    return frozenset(schema.get("properties", {}))


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document (a fresh copy: callers may change it)."""
    paths: dict[str, dict[str, Any]] = {}
    for (method, path), op in OPERATIONS.items():
        paths.setdefault(path, {})[method.lower()] = copy.deepcopy(op)
    return {
        "openapi": "3.1.0",
        "info": {"title": "treg management API", "version": "1",
                 "description": "Management routes of treg (docs/operations.md, /work/shared api.md). Every "
                                "refusal is the Error body with `X-Treg-Error: 1`."},
        "paths": paths,
        "components": {
            "schemas": copy.deepcopy(SCHEMAS),
            "responses": {"Error": {
                "description": "a refusal (docs/errors.md)",
                "headers": {"X-Treg-Error": {"required": True, "schema": {"const": "1"}}},
                "content": {"application/json": {"schema": _ref("Error")}}}},
            "parameters": {"Org": {
                "name": "X-Treg-Org", "in": "header", "required": False,
                "description": "the org (slug or id) a user of several orgs acts in; another org than the "
                               "token's: 403 wrong_org",
                "schema": {"type": "string"}}},
            "securitySchemes": {"TregToken": {"type": "apiKey", "in": "header", "name": "X-Treg-Token"}},
        },
        "security": [{"TregToken": []}],
    }


@routes.get(PATH)
async def openapi_json(request: web.Request) -> web.Response:
    """No token needed: the document describes the API, it holds nothing of any org."""
    return json_response(document())
