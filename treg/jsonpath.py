"""Dotted paths into a parsed JSON answer (``usage.total_tokens``, ``candidates.0.finishReason``): the
one lookup the catalog's prices, the capacity signatures and metered evidence all read answers with."""

from __future__ import annotations

from typing import Any, Sequence

#: a ``default`` that no JSON value can be, for callers that must tell a missing key from a ``null``
MISSING: Any = object()


def parts(path: str) -> list[str]:
    """``candidates.0.finishReason`` or ``candidates[0].finishReason`` → its keys and indexes."""
    return [p for p in path.replace("[", ".").replace("]", "").split(".") if p]


def dig(doc: Any, path: str | Sequence[str], default: Any = None) -> Any:
    """The value at ``path`` (dotted, or already split into keys and indexes) in ``doc``, else
    ``default``: a key of an object, a digit string an index of an array."""
    for key in path.split(".") if isinstance(path, str) else path:
        if isinstance(doc, dict) and key in doc:
            doc = doc[key]
        elif isinstance(doc, list) and key.isdigit() and int(key) < len(doc):
            doc = doc[int(key)]
        else:
            return default
    return doc
