"""A published tool as the call pipeline reads it, and the rules of its name and ref.

A ref is ``<org-slug>.<name>``. An org slug never holds a dot (``[a-z0-9-]``), so a ref splits at its
first dot without ambiguity; a name is a tool name (``[A-Za-z0-9._~-]``, no ``/``), so the whole ref
is the first path segment of ``/call/<ref>/<path>``, as an own tool's name is.
"""

from __future__ import annotations

from typing import Any

from treg.errors import BadRequest
from treg.frozen import frozen_value
from treg.names import TOOL_NAME

DESCRIPTION_MAX = 2000
#: the most ``max_runs`` a tool may declare (the team limit binds anyway)
MAX_RUNS_MAX = 1000
#: the largest price a hub tool may ask per call (USD 1 000: a typo guard, like a grant's)
PRICE_MAX_MICRO = 1_000_000_000


@frozen_value
class HubTool:
    """One published tool: the publisher's org, its tool, and what a call of it costs the caller."""

    id: str
    org_id: str  # the publishing org
    org_slug: str
    name: str
    tool_id: str  # the publishing org's tool that runs
    description: str
    price_micro: int
    max_runs: int | None

    @property
    def ref(self) -> str:
        return ref_of(self.org_slug, self.name)


def ref_of(org_slug: str, name: str) -> str:
    return f"{org_slug}.{name}"


def check_name(value: Any) -> str:
    if not isinstance(value, str) or not TOOL_NAME.fullmatch(value):
        raise BadRequest("a hub tool's name is 1-200 characters of A-Z, a-z, 0-9 and . _ ~ -, starting with a "
                         "letter or digit (the ref is <org-slug>.<name>)", code="invalid_name")
    return value


def check_description(value: Any) -> str:
    if not isinstance(value, str) or len(value) > DESCRIPTION_MAX or "\x00" in value:
        raise BadRequest(f"description must be a string of at most {DESCRIPTION_MAX} characters",
                         code="invalid_description")
    return value.strip()


def check_price(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= PRICE_MAX_MICRO:
        raise BadRequest(f"price_micro must be an integer from 0 to {PRICE_MAX_MICRO} (micro-USD per call; "
                         "0: free)", code="invalid_price")
    return value


def check_max_runs(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_RUNS_MAX:
        raise BadRequest(f"max_runs must be an integer from 1 to {MAX_RUNS_MAX}, or null (the org's limit only)",
                         code="invalid_max_runs")
    return value
