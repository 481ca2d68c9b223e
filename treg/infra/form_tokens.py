"""What treg signs for a browser form: ``<issued>.<HMAC>`` tokens, and the purpose keys they are made with.

A token is ``<unix seconds issued>.<base64url HMAC-SHA256>`` of ``"<purpose> v1"``, the form's subject
(the login page's pre-login cookie, a consent page's opaque) and the time, under a key of its own derived
from the master key (HKDF-SHA256, ``info`` the purpose): a token of one purpose is never a valid MAC of
anything else treg signs. Any process holding the master key (current or previous, so a key rotation does
not break a form already shown) checks one; nothing is stored. The login form (treg/ui_sessions.py) and
the OAuth consent page (treg/oauth/links.py) use it. No I/O; every comparison in constant time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from treg.infra.crypto import SecretBox
from treg.memo import BoundedMemo

#: how far a token's issue time may lie in the future (another box's clock)
CLOCK_SKEW_S = 300
#: a token longer than this is no token of treg's (its time and MAC are ~55 characters)
_MAX_LENGTH = 100
_KEYS: BoundedMemo[tuple[bytes, bytes], bytes] = BoundedMemo(16)


def purpose_key(master: bytes, purpose: bytes) -> bytes:
    """The key of one purpose, derived from the master key once per process (HKDF is ~20 µs)."""
    found = _KEYS.get((master, purpose))
    if found is None:
        found = _KEYS.put((master, purpose), HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                                                  info=purpose).derive(master))
    return found


def mac(key: bytes, *parts: str) -> str:
    """base64url (unpadded) HMAC-SHA256 of ``parts`` joined by NUL."""
    digest = hmac.new(key, "\0".join(parts).encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _signed(master: bytes, purpose: str, subject: str, issued: str) -> str:
    return mac(purpose_key(master, purpose.encode()), f"{purpose} v1", subject, issued)


def issue(box: SecretBox, purpose: str, subject: str, *, now: float | None = None) -> str:
    """A token of ``purpose`` for ``subject``, issued now, under the current master key."""
    issued = str(int(time.time() if now is None else now))
    return f"{issued}.{_signed(box.current, purpose, subject, issued)}"


def valid(box: SecretBox, purpose: str, subject: str, token: str | None, ttl_s: float, *,
          now: float | None = None) -> bool:
    """Whether ``token`` was issued for ``purpose`` and ``subject`` by a process holding the master key
    (current or previous), at most ``ttl_s`` ago."""
    if not token or len(token) > _MAX_LENGTH:
        return False
    issued_text, _, sent = token.partition(".")
    if not issued_text.isascii() or not issued_text.isdigit():
        return False
    age = (time.time() if now is None else now) - int(issued_text)
    if not -CLOCK_SKEW_S <= age <= ttl_s:
        return False
    sent_bytes = sent.encode("ascii", "replace")
    return any(hmac.compare_digest(_signed(master, purpose, subject, issued_text).encode(), sent_bytes)
               for master in (box.current, *box.previous))
