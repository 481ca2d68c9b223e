"""A provider row's ``oauth`` block (oauth.md "A provider declares OAuth"): its frozen type and its check.

Pure: no I/O, no names resolved (startup resolves nothing; the token endpoint's host is vetted like any
upstream when it is dialled). :func:`parse_block` is what :mod:`treg.catalog.load` calls for a row that
declares one; every problem is reported through the loader's ``add(field, message)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping
from urllib.parse import urlsplit

from treg.http_grammar import CTL

BLOCK_KEYS = frozenset({"authorize_url", "token_url", "revoke_url", "scopes", "scope_separator", "client_auth",
                        "authorize_params"})
CLIENT_AUTH = ("basic", "post")
#: what treg itself puts in an authorization request: a constant of the row cannot replace one
RESERVED_PARAMS = frozenset({"response_type", "client_id", "redirect_uri", "scope", "state", "code_challenge",
                             "code_challenge_method"})
#: RFC 6749 §3.3 scope-token: %x21 / %x23-5B / %x5D-7E
SCOPE_TOKEN = re.compile(r"\A[\x21\x23-\x5b\x5d-\x7e]{1,200}\Z")
_PARAM_NAME = re.compile(r"\A[A-Za-z0-9._~-]{1,100}\Z")


@dataclass(frozen=True)
class OAuthBlock:
    """How treg asks a provider for a grant and refreshes it (authorization code with PKCE S256, always)."""

    authorize_url: str
    token_url: str
    revoke_url: str | None = None
    #: asked for when the caller names none
    scopes: tuple[str, ...] = ()
    scope_separator: str = " "
    #: how the client authenticates at the token (and revocation) endpoint: HTTP Basic or in the body
    client_auth: str = "basic"
    #: constants added to every authorization request (``access_type=offline``)
    authorize_params: tuple[tuple[str, str], ...] = ()

    def scope_text(self, scopes: tuple[str, ...] | list[str]) -> str:
        return self.scope_separator.join(scopes)

    def split_scope(self, text: str) -> tuple[str, ...]:
        """A token answer's ``scope`` as a list (RFC 6749 says space-separated; some providers use the
        separator they take)."""
        seps = {self.scope_separator, " "}
        parts = [text]
        for sep in seps:
            parts = [p for part in parts for p in part.split(sep)]
        return tuple(p.strip() for p in parts if p.strip())

    def to_json(self) -> dict[str, Any]:
        return {"authorize_url": self.authorize_url, "token_url": self.token_url, "revoke_url": self.revoke_url,
                "scopes": list(self.scopes), "scope_separator": self.scope_separator,
                "client_auth": self.client_auth, "authorize_params": dict(self.authorize_params)}


def check_endpoint_url(raw: Any, *, allow_http: bool) -> str | None:
    """Why ``raw`` cannot be an OAuth endpoint URL (None: it can): https (plain http only while
    ``TREG_SSRF_ALLOW`` exempts addresses, as in tests), a host, no user-info, no fragment; a query is
    kept (treg adds its parameters after it)."""
    if not isinstance(raw, str) or not raw:
        return "must be an https:// URL string"
    if CTL.search(raw) or " " in raw or "\\" in raw:
        return "contains whitespace, a backslash or control characters"
    try:
        parts = urlsplit(raw)
        parts.port  # noqa: B018 - raises on a malformed port
    except ValueError as exc:
        return f"is not a valid URL: {exc}"
    if parts.scheme not in ("http", "https"):
        return "must use https://"
    if parts.scheme == "http" and not allow_http:
        return "must use https:// (plain http only while TREG_SSRF_ALLOW is set, for local development and tests)"
    if not parts.hostname:
        return "has no host"
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return "cannot carry user-info (the client authenticates as client_auth says)"
    if parts.fragment or raw.endswith("#"):
        return "cannot carry a fragment"
    return None


def parse_block(add: Callable[[str, str], None], raw: Any, *, allow_http: bool, has_auth: bool) -> OAuthBlock | None:
    """The block of one provider row, or None after reporting what is wrong (``add(field, message)``)."""
    before = [0]

    def bad(field: str, message: str) -> None:
        before[0] += 1
        add(field, message)

    if not isinstance(raw, Mapping):
        bad("oauth", "must be a dict {authorize_url, token_url, revoke_url?, scopes?, scope_separator?, "
            "client_auth?, authorize_params?}")
        return None
    for key in sorted(set(raw) - BLOCK_KEYS):
        bad(f"oauth.{key}", f"unknown oauth field; known: {sorted(BLOCK_KEYS)}")
    urls: dict[str, str | None] = {}
    for key, required in (("authorize_url", True), ("token_url", True), ("revoke_url", False)):
        value = raw.get(key)
        if value is None and not required:
            urls[key] = None
            continue
        why = check_endpoint_url(value, allow_http=allow_http)
        if why:
            bad(f"oauth.{key}", f"{value!r} {why}")
        urls[key] = value if isinstance(value, str) else None
    scopes: list[str] = []
    raw_scopes = raw.get("scopes", [])
    if not isinstance(raw_scopes, (list, tuple)):
        bad("oauth.scopes", "must be a list of scope strings")
    else:
        for i, scope in enumerate(raw_scopes):
            if not isinstance(scope, str) or not SCOPE_TOKEN.fullmatch(scope):
                bad(f"oauth.scopes[{i}]", f"{scope!r} is not a scope (printable ASCII without space, '\"' or '\\')")
            elif scope in scopes:
                bad(f"oauth.scopes[{i}]", f"{scope!r} is listed twice")
            else:
                scopes.append(scope)
    sep = raw.get("scope_separator", " ")
    if not isinstance(sep, str) or not 1 <= len(sep) <= 3 or CTL.search(sep):
        bad("oauth.scope_separator", "must be a short string such as \" \" or \",\"")
        sep = " "
    elif any(sep in s for s in scopes):
        bad("oauth.scope_separator", f"{sep!r} appears inside a scope")
    client_auth = raw.get("client_auth", "basic")
    if client_auth not in CLIENT_AUTH:
        bad("oauth.client_auth", f"{client_auth!r} must be one of {', '.join(CLIENT_AUTH)}")
    params: list[tuple[str, str]] = []
    raw_params = raw.get("authorize_params") or {}
    if not isinstance(raw_params, Mapping):
        bad("oauth.authorize_params", "must be a dict of parameter name → constant string")
    else:
        for name, value in raw_params.items():
            field = f"oauth.authorize_params.{name}"
            if not isinstance(name, str) or not _PARAM_NAME.fullmatch(name):
                bad(field, "is not a plain parameter name")
            elif name in RESERVED_PARAMS:
                bad(field, f"treg sets {name} itself (PKCE S256, the state, the redirect URI, the scopes)")
            elif not isinstance(value, str) or CTL.search(value):
                bad(field, "must be a string without control characters")
            else:
                params.append((name, value))
    if not has_auth:
        bad("auth", "a provider that declares oauth injects the access token through its auth bindings "
            "({secret}); it has none")
    if before[0]:
        return None
    assert urls["authorize_url"] is not None and urls["token_url"] is not None
    return OAuthBlock(authorize_url=urls["authorize_url"], token_url=urls["token_url"],
                      revoke_url=urls["revoke_url"], scopes=tuple(scopes), scope_separator=sep,
                      client_auth=client_auth, authorize_params=tuple(params))
