"""Product events handed to ``treg_event`` observers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class Event:
    name: str
    props: Mapping[str, Any] = field(default_factory=dict)
