"""The built-in generic capacity signatures: any provider's short rate limit (``burst``) and a CDN's
block (``edge_block``). ``trylast``: a provider plugin's own rows are consulted first, so a vendor whose
429 means "quota used up" claims it before the generic ``burst`` row does (docs/resilience.md)."""

from __future__ import annotations

from typing import Any

from treg import hookimpl

GENERIC_SIGNATURES: tuple[dict[str, Any], ...] = (
    # a 429 that says to come back within a minute is a short rate limit, not an empty account
    {"provider": "*", "kind": "burst", "status": [429], "retry_after_max_s": 60},
    # Cloudflare marks its own challenge / block answers
    {"provider": "*", "kind": "edge_block", "header": {"name": "cf-mitigated"}},
    # Cloudflare's HTML block page ("Attention Required! | Cloudflare", its error-details block)
    {"provider": "*", "kind": "edge_block", "body_contains": "cf-error-details"},
    {"provider": "*", "kind": "edge_block", "body_contains": "cloudflare ray id"},
    # Cloudflare's problem JSON for its 1xxx errors ({"error_code": 1020, "type": ".../cloudflare-1xxx-errors/..."})
    {"provider": "*", "kind": "edge_block", "body_contains": "cloudflare",
     "body_json": {"path": "error_code", "pattern": "^1[0-9]{3}$"}},
)


@hookimpl(trylast=True)
def treg_register_capacity_signatures() -> list[dict[str, Any]]:
    return [dict(row) for row in GENERIC_SIGNATURES]
