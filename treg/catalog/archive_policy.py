"""An endpoint row's ``archive`` descriptor, the archive key and the rollout: pure, no I/O.

    "archive": {"ttl_s": 86400, "cache_price": "full" | "repeat" | "free",
                "repeat_price_micro": 500, "scope": "org" | "global"}

The key is a SHA-256 digest of the endpoint, the method, the caller's query as sorted pairs, a hash
of the body, the org (``scope: org``; ``global`` leaves the org out of a platform-tier entry, sharing
answers across orgs) and the credential that fetched the answer, by tier and id (:class:`CredentialRef`:
``own`` + the tool and its secrets, ``team`` + the secret, ``platform``): an answer one credential
fetched is never served to a call whose ladder picked another. It never holds a credential's value: the
query pairs and body fields an injection binding writes are left out (whatever the caller put there is
overwritten before the vendor sees it), and what treg injects is never part of the caller's request,
which is all the key is made from besides the credential's tier and id.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Literal
from urllib.parse import unquote_plus

from treg import json_text
from treg.bindings import Binding
from treg.catalog.descriptors import is_int, open_descriptor

CACHE_PRICES = ("full", "repeat", "free")
SCOPES = ("org", "global")
KEYS = frozenset({"ttl_s", "cache_price", "repeat_price_micro", "scope"})
#: the longest an entry may live (30 days): an archive is for repeat lookups, not a data store
MAX_TTL_S = 30 * 86400
MAX_MICRO = 10 ** 12
#: only reads are archived: a PUT/PATCH/DELETE changes something at the vendor, a repeat must reach it
METHODS = ("GET", "POST")


@dataclass(frozen=True)
class ArchivePolicy:
    ttl_s: int
    cache_price: Literal["full", "repeat", "free"] = "full"
    repeat_price_micro: int = 0
    scope: Literal["org", "global"] = "org"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"ttl_s": self.ttl_s, "cache_price": self.cache_price, "scope": self.scope}
        if self.cache_price == "repeat":
            out["repeat_price_micro"] = self.repeat_price_micro
        return out


def check_row(raw: Any, method: str, price: Any, spooled: bool,
              bad: Callable[[str, str], None]) -> ArchivePolicy | None:
    """The row's ``archive`` field validated (None: absent, or a problem reported through ``bad(field,
    message)``, the catalog loader's collector, so it names the plugin and the row)."""
    opened = open_descriptor(raw, "archive", "{ttl_s, cache_price?, repeat_price_micro?, scope?}", KEYS, bad)
    if opened is None:
        return None
    raw, fail = opened
    ttl = raw.get("ttl_s")
    if not is_int(ttl) or not 1 <= ttl <= MAX_TTL_S:
        fail("archive.ttl_s", f"{ttl!r} must be a whole number of seconds, 1 to {MAX_TTL_S}")
    cache_price = raw.get("cache_price", "full")
    if cache_price not in CACHE_PRICES:
        fail("archive.cache_price", f"{cache_price!r} is not one of {', '.join(CACHE_PRICES)}")
    repeat = raw.get("repeat_price_micro")
    if cache_price == "repeat":
        if not is_int(repeat) or not 0 <= repeat <= MAX_MICRO:
            fail("archive.repeat_price_micro", f"{repeat!r} must be a whole number of micro-USD, 0 to {MAX_MICRO}")
        elif price is not None and price.kind == "per_call" and repeat > price.per_call_micro:
            fail("archive.repeat_price_micro", f"{repeat} is more than the endpoint's own price "
                 f"({price.per_call_micro}): a repeat never costs more than a fresh call")
    elif repeat is not None:
        fail("archive.repeat_price_micro", "is only read with \"cache_price\": \"repeat\"")
    scope = raw.get("scope", "org")
    if scope not in SCOPES:
        fail("archive.scope", f"{scope!r} is not one of {', '.join(SCOPES)}")
    if method not in METHODS:
        fail("archive", f"a {method} is never archived (only {', '.join(METHODS)}: a repeat must reach the vendor)")
    if spooled:
        fail("archive", "a spooled_response answer is never stored (too large to archive)")
    if fail.count:
        return None
    return ArchivePolicy(ttl_s=ttl, cache_price=cache_price, repeat_price_micro=repeat or 0, scope=scope)


def _body_digest(body: bytes, json_fields: frozenset[str]) -> str:
    if json_fields and body.strip():
        # a JSON binding overwrites these fields: what the caller put there never reaches the vendor
        try:
            doc = json_text.parse(body)
        except ValueError:  # not JSON, or nested too deeply (treg/json_text.py)
            doc = None
        if isinstance(doc, dict):
            kept = {k: v for k, v in doc.items() if k not in json_fields}
            body = json.dumps(kept, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return hashlib.sha256(body).hexdigest()


@dataclass(frozen=True)
class CredentialRef:
    """Which credential fetched (or would fetch) an answer: its tier and its id, never its value.

    ``own``: ``tool:<tool id>`` and the ``secret:<id>`` of each secret its bindings inject (a tool
    re-bound to another account's secret is another credential); ``team``: ``secret:<id>``;
    ``platform``: no id (treg's one key per provider); a connection (OAuth) is ``connection:<id>`` on
    the own or team tier (the caller's own, a shared one, or one an own tool's binding names)."""

    tier: str
    id: str | None = None

    @classmethod
    def of(cls, tier: str, *, tool_id: str | None = None, secret_ids: Iterable[str] = (),
           connection_ids: Iterable[str] = ()) -> "CredentialRef":
        if tier == "platform":
            return cls("platform")
        parts = [f"tool:{tool_id}"] if tool_id is not None else []
        parts += [f"connection:{c}" for c in sorted(set(connection_ids))]
        parts += [f"secret:{s}" for s in sorted(set(secret_ids))]
        # an own or team call always names its credential; none named would make every such call one key
        if not parts:
            raise ValueError(f"a {tier}-tier archive key needs the credential's id")
        return cls(tier, ",".join(parts))


def key_material(*, endpoint_id: str, method: str, query: Iterable[tuple[str, str | None]], body: bytes,
                 org_id: str | None, credential: CredentialRef, bindings: Iterable[Binding] = ()) -> bytes:
    """What the key is the digest of (kept apart from :func:`archive_key` so tests can read it)."""
    bindings = tuple(bindings)
    query_names = frozenset(b.name for b in bindings if b.location == "query")
    json_fields = frozenset(b.name for b in bindings if b.location == "json")
    pairs = sorted((k, "" if v is None else v, v is None) for k, v in query
                   if unquote_plus(k) not in query_names)
    return json.dumps([endpoint_id, method.upper(), [[k, v, flag] for k, v, flag in pairs],
                       _body_digest(body, json_fields), org_id, [credential.tier, credential.id]],
                      separators=(",", ":")).encode()


def archive_key(material: bytes) -> str:
    return hashlib.sha256(material).hexdigest()


def in_rollout(org_id: str, endpoint_id: str, pct: int) -> bool:
    """Whether the (org, endpoint) pair is in the archive's rollout: a stable share of pairs (the same
    answer in every process and after a restart), ``pct`` of 100."""
    if pct >= 100:
        return True
    if pct <= 0:
        return False
    h = hashlib.sha256(f"{org_id}\0{endpoint_id}".encode()).digest()
    return int.from_bytes(h[:8], "big") % 100 < pct
