"""The token endpoint (RFC 6749 §4.1.3 code exchange, §6 refresh) and the revocation endpoint (RFC 7009),
through the vetted session of :mod:`treg.oauth_runtime`.

No database connection is held by anything here: callers take and release theirs around these awaits.
Nothing here logs a value: an answer's body is parsed, never printed; a failure names its kind (a
transport error, a status, "not JSON", the OAuth ``error`` code), never a token, code, verifier or
client secret. A redirect is not followed (a token endpoint that redirects is a failure).
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import Any, Mapping
from urllib.parse import quote, urlencode

import aiohttp

from treg import json_text
from treg.context import Services
from treg.errors import TregError
from treg.infra.dns import unwrap_treg_error
from treg.oauth.apps import OAuthClient
from treg.catalog.oauth import OAuthBlock

log = logging.getLogger("treg.oauth")

#: the most of a token endpoint's answer read (a token answer is a few KiB)
ANSWER_MAX = 256 * 1024
_ERROR_CODE_MAX = 64


@dataclass(frozen=True)
class TokenAnswer:
    access_token: str = field(repr=False)
    refresh_token: str | None = field(default=None, repr=False)
    token_type: str | None = None
    #: from ``expires_in``, counted from when the request was sent; None: the answer named no expiry
    expires_at: dt.datetime | None = None
    #: the answer's ``scope``; None: it named none (the asked scopes stand)
    scopes: tuple[str, ...] | None = None


class TokenRefused(Exception):
    """The endpoint answered an OAuth error (``invalid_grant``, ``invalid_client``, …)."""

    def __init__(self, error: str, status: int) -> None:
        super().__init__(error)
        self.error = error
        self.status = status


class TokenEndpointDown(Exception):
    """No usable answer: a transport error, a timeout, a 5xx, a redirect, or a body that is not a JSON
    object. ``why`` is a sentence without any value of the request or the answer."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def _timeout(svc: Services) -> aiohttp.ClientTimeout:
    # well inside the lease: a refresh that took longer than its lease could be overtaken by another
    # process's, and then its new (rotated) tokens could not be written
    total = max(1.0, svc.settings.oauth_refresh_lease_s / 2)
    return aiohttp.ClientTimeout(total=total, connect=min(10.0, total))


def _client_auth(block: OAuthBlock, client: OAuthClient, form: dict[str, str], headers: dict[str, str]) -> None:
    if block.client_auth == "post":
        form["client_id"] = client.client_id
        form["client_secret"] = client.client_secret
        return
    # RFC 6749 §2.3.1: each part form-urlencoded, then HTTP Basic
    pair = f"{quote(client.client_id, safe='')}:{quote(client.client_secret, safe='')}"
    headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()


async def _post(svc: Services, url: str, form: dict[str, str], headers: dict[str, str]) -> tuple[int, bytes]:
    session = svc.oauth.session
    try:
        async with session.request("POST", url, data=urlencode(form).encode(), headers=headers,
                                   allow_redirects=False, timeout=_timeout(svc)) as resp:
            data = await resp.content.read(ANSWER_MAX + 1)
            return resp.status, data
    except TregError as exc:  # the SSRF guard, the resolver, the null session of a process serving none
        raise TokenEndpointDown(f"the endpoint was not reached: {exc.detail}") from exc
    except asyncio.TimeoutError as exc:
        raise TokenEndpointDown("the endpoint did not answer in time") from exc
    except (aiohttp.ClientError, OSError) as exc:
        inner = unwrap_treg_error(exc)
        if inner is not None:
            raise TokenEndpointDown(f"the endpoint was not reached: {inner.detail}") from exc
        raise TokenEndpointDown(f"the endpoint was not reached ({type(exc).__name__})") from exc


def _parse(status: int, data: bytes) -> dict[str, Any]:
    if 300 <= status < 400:
        raise TokenEndpointDown(f"the endpoint answered a redirect ({status}), which treg does not follow")
    if status >= 500:
        raise TokenEndpointDown(f"the endpoint answered {status}")
    if len(data) > ANSWER_MAX:
        raise TokenEndpointDown("the endpoint's answer is larger than any token answer")
    try:
        body = json_text.parse(data)
    except ValueError:  # not JSON, or nested too deeply (treg/json_text.py)
        body = None
    if not isinstance(body, dict):
        raise TokenEndpointDown(f"the endpoint answered {status} with a body that is not a JSON object")
    if status >= 400 or "error" in body:
        error = body.get("error")
        if not isinstance(error, str) or not error or len(error) > _ERROR_CODE_MAX or not error.isascii() \
                or not error.replace("_", "").isalnum():
            error = f"http_{status}"
        raise TokenRefused(error, status)
    return body


def _answer(body: Mapping[str, Any], sent_at: dt.datetime, block: OAuthBlock) -> TokenAnswer:
    token = body.get("access_token")
    if not isinstance(token, str) or not token:
        raise TokenEndpointDown("the endpoint's answer has no access_token")
    refresh = body.get("refresh_token")
    expires_in = body.get("expires_in")
    if isinstance(expires_in, str) and expires_in.strip().isdigit():
        expires_in = int(expires_in.strip())
    expires_at = None
    if isinstance(expires_in, (int, float)) and not isinstance(expires_in, bool) and 0 <= expires_in < 10 ** 9:
        expires_at = sent_at + dt.timedelta(seconds=float(expires_in))
    scope = body.get("scope")
    token_type = body.get("token_type")
    return TokenAnswer(access_token=token, refresh_token=refresh if isinstance(refresh, str) and refresh else None,
                       token_type=token_type if isinstance(token_type, str) else None, expires_at=expires_at,
                       scopes=block.split_scope(scope) if isinstance(scope, str) else None)


async def _token_request(svc: Services, block: OAuthBlock, client: OAuthClient, form: dict[str, str]) -> TokenAnswer:
    headers = {"Accept": "application/json", "Content-Type": "application/x-www-form-urlencoded"}
    _client_auth(block, client, form, headers)
    sent_at = dt.datetime.now(dt.timezone.utc)
    status, data = await _post(svc, block.token_url, form, headers)
    return _answer(_parse(status, data), sent_at, block)


async def exchange_code(svc: Services, block: OAuthBlock, client: OAuthClient, *, auth_code: str,
                        redirect_uri: str, verifier: str) -> TokenAnswer:
    """The authorization code (and its PKCE verifier) for tokens."""
    return await _token_request(svc, block, client, {"grant_type": "authorization_code", "code": auth_code,
                                                     "redirect_uri": redirect_uri, "code_verifier": verifier})


async def refresh(svc: Services, block: OAuthBlock, client: OAuthClient, *, refresh_token: str) -> TokenAnswer:
    """A refresh token for new tokens (the answer may rotate the refresh token)."""
    return await _token_request(svc, block, client, {"grant_type": "refresh_token", "refresh_token": refresh_token})


async def revoke(svc: Services, block: OAuthBlock, client: OAuthClient, *, token: str, hint: str) -> bool:
    """RFC 7009: True when the endpoint answered 200. A failure is logged (its kind, never a value) and is
    the caller's to ignore: a connection is deleted all the same."""
    if block.revoke_url is None:
        return False
    headers = {"Accept": "application/json", "Content-Type": "application/x-www-form-urlencoded"}
    form = {"token": token, "token_type_hint": hint}
    _client_auth(block, client, form, headers)
    try:
        status, _ = await _post(svc, block.revoke_url, form, headers)
    except TokenEndpointDown as exc:
        log.warning("oauth: revocation at %s failed: %s", block.revoke_url, exc.why)
        return False
    if status != 200:
        log.warning("oauth: revocation at %s answered %d", block.revoke_url, status)
        return False
    return True
