"""Secrets at rest: AES-256-GCM with a key id, a fresh nonce per write and associated data.

Blob layout: ``b"t1" | key_id (8 ascii) | nonce (12) | ciphertext+tag``. The associated data is
``org_id \\0 secret_id``, so a row copied to another org (or another secret) fails to decrypt. The key
id is the first 8 hex digits of SHA-256 of the key: rotation (``treg secrets rotate-key``) re-encrypts
every blob under the new key while the old one is still given as a previous key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from treg.errors import ConfigError, TregError
from treg.settings import SecretStr, Settings

log = logging.getLogger(__name__)

_VERSION = b"t1"
_KEY_ID_LEN = 8
_NONCE_LEN = 12


class DecryptError(TregError):
    status, code, blame = 500, "secret_undecryptable", "treg"


def key_id_of(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:_KEY_ID_LEN]


def decode_key(text: str) -> bytes:
    try:
        # strict: characters outside the urlsafe alphabet or data after the padding are a typo, not a key
        raw = base64.b64decode(text.strip().encode() + b"=" * (-len(text.strip()) % 4), altchars=b"-_",
                               validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ConfigError("TREG_SECRET_KEY is not urlsafe base64", code="bad_secret_key") from exc
    if len(raw) != 32:
        raise ConfigError(f"TREG_SECRET_KEY must decode to 32 bytes, not {len(raw)}", code="bad_secret_key")
    return raw


def new_key_text() -> str:
    return base64.urlsafe_b64encode(os.urandom(32)).decode()


@dataclass(frozen=True)
class SecretBox:
    """Encrypts with the current key; decrypts with any key it knows (current or previous).

    ``reload`` (set by :func:`load_box`) re-reads the key files, so a running treg follows
    ``treg secrets rotate-key``: it encrypts under the newest key and, meeting a blob under a key id it
    does not know yet, reloads before giving up.
    """

    current: bytes = field(repr=False)
    previous: tuple[bytes, ...] = field(default=(), repr=False)
    reload: Callable[[], "SecretBox"] | None = field(default=None, repr=False, compare=False)
    #: one AESGCM per key: building one per decrypt (every call injects a secret) cost more than the
    #: decrypt itself (docs/performance.md)
    _ciphers: dict[bytes, AESGCM] = field(default_factory=dict, init=False, repr=False, compare=False)

    def _cipher(self, key: bytes) -> AESGCM:
        cipher = self._ciphers.get(key)
        if cipher is None:
            cipher = self._ciphers[key] = AESGCM(key)
        return cipher

    def refresh(self) -> bool:
        """Take the keys ``reload`` reads now; True when they changed."""
        if self.reload is None:
            return False
        try:
            fresh = self.reload()
        except ConfigError as exc:  # a half-written or missing key file: keep the keys we have
            log.warning("secret keys not reloaded: %s", exc.detail)
            return False
        if (fresh.current, fresh.previous) == (self.current, self.previous):
            return False
        # frozen for callers; the box itself swaps its keys (sync code: no await between the two writes)
        object.__setattr__(self, "previous", tuple(dict.fromkeys((*fresh.previous, self.current))))
        object.__setattr__(self, "current", fresh.current)
        return True

    @property
    def key_id(self) -> str:
        return key_id_of(self.current)

    def _keys(self) -> dict[str, bytes]:
        keys = {key_id_of(k): k for k in self.previous}
        keys[key_id_of(self.current)] = self.current
        return keys

    @staticmethod
    def _aad(org_id: str, secret_id: str) -> bytes:
        return org_id.encode() + b"\0" + secret_id.encode()

    def encrypt(self, plaintext: bytes, *, org_id: str, secret_id: str) -> bytes:
        self.refresh()  # writes are rare: always encrypt under the newest key
        nonce = os.urandom(_NONCE_LEN)
        ct = AESGCM(self.current).encrypt(nonce, plaintext, self._aad(org_id, secret_id))
        return _VERSION + self.key_id.encode() + nonce + ct

    def blob_key_id(self, blob: bytes) -> str:
        return bytes(blob[2:2 + _KEY_ID_LEN]).decode(errors="replace")

    def decrypt(self, blob: bytes, *, org_id: str, secret_id: str) -> bytes:
        blob = bytes(blob)
        if blob[:2] != _VERSION or len(blob) < 2 + _KEY_ID_LEN + _NONCE_LEN + 16:
            raise DecryptError("a stored secret is not in a format this treg reads")
        kid = self.blob_key_id(blob)
        key = self._keys().get(kid)
        if key is None and self.refresh():
            key = self._keys().get(kid)
        if key is None:
            raise DecryptError(f"a stored secret was encrypted under key {kid}, which this treg does not have")
        nonce = blob[2 + _KEY_ID_LEN:2 + _KEY_ID_LEN + _NONCE_LEN]
        try:
            return self._cipher(key).decrypt(nonce, blob[2 + _KEY_ID_LEN + _NONCE_LEN:], self._aad(org_id, secret_id))
        except InvalidTag as exc:
            raise DecryptError("a stored secret failed its integrity check (moved, altered or wrong key)") from exc


def key_file(settings: Settings) -> Path:
    return settings.home / "secret.key"


def previous_file(settings: Settings) -> Path:
    return settings.home / "secret.key.previous"


def _create_key_file(path: Path) -> None:
    """Write a new key to ``path`` once, whole: written to a temporary file first and linked into
    place (a link fails when the name exists), so two treg processes starting together on one fresh
    ``TREG_HOME`` both end up with the same key, and neither reads a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(new_key_text() + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process made it first: its key is the key
    finally:
        tmp.unlink(missing_ok=True)


def load_box(settings: Settings, *, create: bool = True) -> SecretBox:
    """The master key from TREG_SECRET_KEY, else from ``$TREG_HOME/secret.key`` (created 0600 once).

    Previous keys (kept by ``treg secrets rotate-key``) live in ``$TREG_HOME/secret.key.previous``,
    one per line. The box reloads these files (never creating one) when the keys may have moved.
    """
    if settings.secret_key is not None:
        current = decode_key(settings.secret_key.reveal())
    else:
        path = key_file(settings)
        if not path.exists() and not create:
            raise ConfigError(f"the key file {path} is missing", code="bad_secret_key")
        if not path.exists():
            _create_key_file(path)
        current = decode_key(path.read_text())
    previous_path = previous_file(settings)
    previous: tuple[bytes, ...] = ()
    if previous_path.exists():
        previous = tuple(decode_key(line) for line in previous_path.read_text().split() if line.strip())
    return SecretBox(current, previous, reload=lambda: load_box(settings, create=False))


def reveal(value: SecretStr | None) -> str | None:
    return value.reveal() if value is not None else None
