"""A URL's raw query as pairs, split once: order, duplicates and percent-encoding kept, nothing decoded.

Plain text handling, no I/O, for every layer that reads a query the way treg relays it: a tool's base
URL (``treg/org_data.py``), the caller's query (the call stages), the catalog's checks.
"""

from __future__ import annotations


def split_query(raw: str) -> list[tuple[str, str | None]]:
    """Raw query pairs in order, duplicates and encoding kept (``?flag`` → ``("flag", None)``)."""
    if not raw:
        return []
    out: list[tuple[str, str | None]] = []
    for seg in raw.split("&"):
        k, eq, v = seg.partition("=")
        out.append((k, v if eq else None))
    return out
