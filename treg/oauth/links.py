"""The opaque parts of a consent, and what is kept of them at rest.

* a **connect link** ``/oauth/connect/<opaque>``: the opaque is an HMAC of the connection id and a random
  nonce under a purpose key of the master key (HKDF-SHA256, info ``treg-oauth-link``); the row keeps the
  nonce and the opaque's SHA-256, so a link is found by its digest, any treg process with the key can
  show a still-valid link again (a pending one is reused), and a database reader cannot make one;
* the consent page's **form token** ``<issued>.<HMAC of the opaque and the time>`` (purpose
  ``treg-oauth-form``, treg/infra/form_tokens.py): the page's button posts it, nothing else can;
* the **state** of an authorization request and the browser's **``treg_oauth_state`` cookie**: 256
  random bits each, only their SHA-256 stored; the callback needs both (a state used in another browser
  than the one that pressed the button is refused);
* the **PKCE** verifier (64 URL-safe characters) and its S256 challenge; the verifier is sealed at rest.

No I/O; every comparison in constant time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets as pysecrets

from treg.infra import form_tokens
from treg.infra.crypto import SecretBox

#: the cookie binding an authorization request to the browser that asked for it (scrubbed from every
#: relayed Cookie header, and an upstream may not set it: treg/call/headers.py)
STATE_COOKIE = "treg_oauth_state"
_RANDOM = re.compile(r"\A[A-Za-z0-9_-]{43}\Z")
_OPAQUE = re.compile(r"\A[A-Za-z0-9_-]{43}\Z")
#: the consent page's form token (treg/infra/form_tokens.py)
_FORM_PURPOSE = "treg-oauth-form"


def digest(value: str) -> str:
    """What is stored of a link, a state or a cookie: its SHA-256, hex."""
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()


def random_value() -> str:
    """256 random bits, URL-safe (a link nonce, a state, a cookie)."""
    return pysecrets.token_urlsafe(32)


def well_formed(value: str | None) -> str | None:
    """``value`` when it has the shape of a random value of this module (a cookie, a state), else None."""
    return value if value and _RANDOM.fullmatch(value) else None


# -- connect links ------------------------------------------------------------------------------------

def link_opaque(master: bytes, connection_id: str, nonce: str) -> str:
    return form_tokens.mac(form_tokens.purpose_key(master, b"treg-oauth-link"), "treg-oauth-link v1", connection_id, nonce)


def opaque_shape(value: str) -> bool:
    return bool(_OPAQUE.fullmatch(value))


def reproduce_link(box: SecretBox, connection_id: str, nonce: str, stored_digest: str) -> str | None:
    """The opaque of a link issued earlier (under the current key or a previous one), None when no key
    of this treg makes the stored digest."""
    for master in (box.current, *box.previous):
        opaque = link_opaque(master, connection_id, nonce)
        if hmac.compare_digest(digest(opaque), stored_digest):
            return opaque
    return None


# -- the consent page's form token --------------------------------------------------------------------

def form_token(box: SecretBox, opaque: str, *, now: float | None = None) -> str:
    return form_tokens.issue(box, _FORM_PURPOSE, opaque, now=now)


def form_token_ok(box: SecretBox, opaque: str, token: str | None, ttl_s: float, *, now: float | None = None) -> bool:
    return form_tokens.valid(box, _FORM_PURPOSE, opaque, token, ttl_s, now=now)


# -- PKCE (RFC 7636) ----------------------------------------------------------------------------------

def pkce_verifier() -> str:
    return pysecrets.token_urlsafe(48)  # 64 characters of the unreserved set (43-128 allowed)


def pkce_challenge(verifier: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode("ascii")).digest()).rstrip(b"=").decode()
