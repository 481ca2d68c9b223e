"""Idempotency-Key on metered calls: the first answer is stored per (org, label) and replayed to retries.

``claim`` decides what a request carrying a label gets:

- ``NEW``         — this request owns the label: run the call, then ``complete`` (store the answer) or
                    ``abandon`` (a refusal before the relay, a free streamed read: nothing is stored);
- ``REPLAY``      — the stored status, headers and body (answered with ``X-Treg-Idempotent-Replay: true``,
                    not charged again);
- ``IN_PROGRESS`` — the first request with this label is still running: 409 ``idempotency_in_progress``;
- ``MISMATCH``    — the label was used for a different request: 422 ``idempotency_mismatch``.

"The same request" is the same method, endpoint, query and body bytes (``request_digest``). Concurrent
claims of one label get exactly one NEW (``INSERT … ON CONFLICT DO NOTHING``). A stored answer expires
24 hours after it was stored; an in-progress claim whose process died expires after ``TREG_HOLD_TTL_S``.
An expired entry is replaced by the next claim and pruned by the reaper.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from sqlalchemy import and_, delete, func, literal_column, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert

from treg.context import Services
from treg.errors import BadRequest, Conflict, IntegrityError, NotFound, TregError, Unprocessable
from treg.infra.schema import idempotency_keys

#: how long a stored answer is replayed
TTL_S = 24 * 3600
#: HMAC key of the platform-tier Idempotency-Key rewrite (a fixed domain separator, not a secret)
_SHARED_KEY_DOMAIN = b"treg/platform-idempotency-key/v1"
_LABEL = re.compile(r"\A[\x21-\x7e][\x20-\x7e]{0,254}\Z")
_CLAIM_ATTEMPTS = 3


class ClaimOutcome(str, enum.Enum):
    NEW = "new"
    REPLAY = "replay"
    IN_PROGRESS = "in_progress"
    MISMATCH = "mismatch"


@dataclass(frozen=True)
class Claim:
    outcome: ClaimOutcome
    org_id: str
    label: str
    digest: str
    #: set on NEW: proves ownership to complete/abandon (a replaced expired claim cannot clobber its successor)
    claim_id: str | None = None
    #: the call that owns (NEW, IN_PROGRESS) or produced (REPLAY) the entry
    call_id: str | None = None
    status: int | None = None
    headers: tuple[tuple[str, str], ...] = field(default=())
    body: bytes | None = None
    #: the entry's stored key when it is not the label itself (a pinned call's namespace)
    key: str | None = None

    def refusal(self) -> TregError | None:
        """The error to answer for IN_PROGRESS (409) and MISMATCH (422); None for NEW and REPLAY."""
        if self.outcome is ClaimOutcome.IN_PROGRESS:
            return Conflict(f"a request with Idempotency-Key {self.label!r} is still running; retry after it "
                            "finishes to get its answer", code="idempotency_in_progress")
        if self.outcome is ClaimOutcome.MISMATCH:
            return Unprocessable(f"Idempotency-Key {self.label!r} was already used for a different request "
                                 "(method, endpoint, query or body differ); use a new key", code="idempotency_mismatch")
        return None


def check_label(label: Any) -> str:
    if not isinstance(label, str) or not _LABEL.fullmatch(label) or label != label.strip():
        raise BadRequest("an Idempotency-Key is 1-255 printable ASCII characters", code="invalid_idempotency_key")
    return label


def request_digest(method: str, endpoint: str, query: str | bytes, body: bytes) -> str:
    """SHA-256 over the method, endpoint, raw query and body bytes (length-prefixed: no ambiguity)."""
    h = hashlib.sha256()
    for part in (method.upper().encode(), endpoint.encode(),
                 query.encode() if isinstance(query, str) else bytes(query), bytes(body)):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()


def _pin_bytes(pin: Sequence[tuple[str, str]]) -> bytes:
    # after the label, which is printable ASCII: the NUL cannot be part of it, so no pinned message
    # equals an unpinned one; every part length-prefixed
    out = b""
    for name, value in pin:
        for part in (name.encode(), value.encode()):
            out += b"\0" + len(part).to_bytes(4, "big") + part
    return out


def shared_key_digest(org_id: str, label: str, pin: Sequence[tuple[str, str]] = ()) -> str:
    """The Idempotency-Key the upstream sees on the platform tier: HMAC-SHA256(domain, org ‖ label ‖ pin), hex.

    Orgs share treg's provider account there, so two orgs' labels must never collide upstream; the
    caller's label itself is never sent. A pinned call (``pin``: its complete pin, see
    treg/call/resources.py) adds every pin, so two customers of one org never get one upstream job
    through the vendor's deduplication; an unpinned digest is unchanged.
    """
    msg = len(org_id).to_bytes(4, "big") + org_id.encode() + label.encode() + _pin_bytes(pin)
    return hmac.new(_SHARED_KEY_DOMAIN, msg, hashlib.sha256).hexdigest()


def pinned_key(label: str, pin: Sequence[tuple[str, str]]) -> str:
    """A pinned call's entry key: its own namespace per pin. It starts with a space, which no label
    may (``check_label``), so it never collides with an unpinned label."""
    return " pin " + hashlib.sha256(len(label).to_bytes(4, "big") + label.encode() + _pin_bytes(pin)).hexdigest()


def _interval(seconds: float) -> Any:
    return text(f"interval '{float(seconds)} seconds'")


def _headers(raw: Any) -> tuple[tuple[str, str], ...]:
    return tuple((str(k), str(v)) for k, v in (raw or ()))


async def claim(svc: Services, org_id: str, label: str, digest: str, *, call_id: str | None = None,
                pin: Sequence[tuple[str, str]] = ()) -> Claim:
    """Claim ``label`` for this request (see the module doc for the four outcomes); a pinned call's
    label lives in its pin's own namespace (:func:`pinned_key`)."""
    label = check_label(label)
    key = pinned_key(label, pin) if pin else label
    lease = _interval(svc.settings.hold_ttl_s)
    for _ in range(_CLAIM_ATTEMPTS):
        claim_id = secrets.token_hex(16)
        new = Claim(ClaimOutcome.NEW, org_id, label, digest, claim_id=claim_id, call_id=call_id, key=key)
        async with svc.db.tx() as tx:
            try:
                won = await tx.fetch_one(
                    pg_insert(idempotency_keys).values(org_id=org_id, label=key, digest=digest, state="in_progress",
                                                       claim_id=claim_id, call_id=call_id,
                                                       expires_at=func.now() + lease)
                    .on_conflict_do_nothing(index_elements=[idempotency_keys.c.org_id, idempotency_keys.c.label])
                    .returning(idempotency_keys.c.claim_id))
            except IntegrityError as exc:  # the foreign key: no such org
                raise NotFound("no such org", code="org_not_found") from exc
            if won is not None:
                return new
            # An expired entry is replaced; concurrent replacers serialise on the row and re-check expiry.
            entry = and_(idempotency_keys.c.org_id == org_id, idempotency_keys.c.label == key)
            won = await tx.fetch_one(
                update(idempotency_keys).where(and_(entry, idempotency_keys.c.expires_at <= func.now()))
                .values(digest=digest, state="in_progress", claim_id=claim_id, call_id=call_id, status=None,
                        headers=None, body=None, created_at=func.now(), expires_at=func.now() + lease)
                .returning(idempotency_keys.c.claim_id))
            if won is not None:
                return new
            row = await tx.fetch_one(select(idempotency_keys).where(entry))
        if row is None:  # abandoned or pruned between the statements: try again
            continue
        if row["digest"] != digest:
            return Claim(ClaimOutcome.MISMATCH, org_id, label, digest, call_id=row["call_id"])
        if row["state"] != "done":
            return Claim(ClaimOutcome.IN_PROGRESS, org_id, label, digest, call_id=row["call_id"])
        return Claim(ClaimOutcome.REPLAY, org_id, label, digest, call_id=row["call_id"], status=row["status"],
                     headers=_headers(row["headers"]), body=bytes(row["body"] or b""))
    # Only reachable if the label flips between states faster than three round trips: say so.
    return Claim(ClaimOutcome.IN_PROGRESS, org_id, label, digest)


def _owned(c: Claim) -> Any:
    if c.outcome is not ClaimOutcome.NEW or c.claim_id is None:
        raise ValueError("only a NEW claim can be completed or abandoned")
    return and_(idempotency_keys.c.org_id == c.org_id, idempotency_keys.c.label == (c.key or c.label),
                idempotency_keys.c.claim_id == c.claim_id, idempotency_keys.c.state == "in_progress")


async def complete(svc: Services, c: Claim | None, status: int, headers: Iterable[Sequence[str]] | Any,
                   body: bytes) -> bool:
    """Store the answer of a NEW claim for replay (24 h). False if the claim was lost (expired and
    taken over, or abandoned): then nothing is stored. ``None`` (no Idempotency-Key): a no-op."""
    if c is None:
        return False
    pairs = [[str(k), str(v)] for k, v in (headers.items() if hasattr(headers, "items") else headers)]
    async with svc.db.tx() as tx:
        n = await tx.execute(update(idempotency_keys).where(_owned(c)).values(
            state="done", status=int(status), headers=pairs, body=bytes(body),
            expires_at=func.now() + _interval(TTL_S)))
    return n == 1


async def abandon(svc: Services, c: Claim | None) -> bool:
    """Give the label back without storing anything (a refusal before the relay, a free streamed read,
    a failure). Safe to call after ``complete``, on a non-NEW claim or on None (then a no-op: False)."""
    if c is None or c.outcome is not ClaimOutcome.NEW:
        return False
    async with svc.db.tx() as tx:
        n = await tx.execute(delete(idempotency_keys).where(_owned(c)))
    return n == 1


async def prune(svc: Services, *, batch: int = 1000, max_batches: int = 100) -> int:
    """Delete expired entries (bounded per run); returns how many."""
    pruned = 0
    for _ in range(max_batches):
        async with svc.db.tx() as tx:
            # expiry re-checked on the row itself: a claim may have just replaced an expired entry
            n = await tx.execute(delete(idempotency_keys).where(idempotency_keys.c.expires_at <= func.now()).where(
                literal_column("ctid").in_(select(literal_column("ctid")).select_from(idempotency_keys)
                                           .where(idempotency_keys.c.expires_at <= func.now()).limit(batch))))
        pruned += max(0, n)
        if n < batch:
            break
    return pruned
