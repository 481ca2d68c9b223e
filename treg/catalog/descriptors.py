"""What the validators of a catalog row's descriptor fields (``table``, ``archive``) share: the field
absent or not an object, its unknown keys, and its problems counted as they are reported.

Every problem goes through the loader's ``bad(field, message)`` collector, so startup names the plugin,
the row and the field (treg/catalog/load.py); the validator builds its value only when none was found.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection, Mapping


@dataclass
class Problems:
    """The problems of one descriptor, reported through ``bad`` and counted."""

    bad: Callable[[str, str], None]
    count: int = 0

    def __call__(self, field: str, message: str) -> None:
        self.count += 1
        self.bad(field, message)


def open_descriptor(raw: Any, name: str, shape: str, keys: Collection[str],
                    bad: Callable[[str, str], None]) -> tuple[Mapping[str, Any], Problems] | None:
    """``raw`` (the row's ``name`` field) as a mapping with its problem counter, its unknown keys already
    reported; None: the field is absent, or not an object (reported, ``shape`` saying what it must be)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        bad(name, f"must be a dict {shape}")
        return None
    fail = Problems(bad)
    for key in sorted(set(raw) - set(keys)):
        fail(f"{name}.{key}", f"unknown {name} field; known: {sorted(keys)}")
    return raw, fail


def is_int(v: Any) -> bool:
    """A JSON integer as a row field must be one: an ``int`` that is not a ``bool`` (``True`` is an int
    to Python, never a count or a price to a catalog row)."""
    return isinstance(v, int) and not isinstance(v, bool)
