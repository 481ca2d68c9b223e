"""Credential bindings and the injector interface (shared by core and plugins).

A binding says where one credential goes: ``{location, name, format?, secret_id?, connection_id?,
platform_setting?, secret_field?}`` (exactly one of ``secret_id``, ``connection_id`` and
``platform_setting``; a connection's access token is the value: docs/oauth.md). An :class:`Injector`
(registered by a plugin for its ``location``) validates bindings at
registration time and writes the rendered value into the outgoing request at call time.

Which injector writes each of a target's bindings, and whether one needs the JSON body, is decided once
when the bindings load instead of on every call (:class:`InjectionPlan`, :func:`compile_plan`):
compiled for an org's tools when the tools cache loads them (``ToolRef.plan``, ``treg/org_data.py``,
dropped with the entry on any change of the org) and for a catalog provider's auth once per provider
(``treg/call/injection.py``). A plan depends only on each binding's location, not on which secret or
platform key fills it, so the team and platform tiers share their provider's; the values themselves are
never part of a plan (the relay looks them up per call).
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple, Protocol, runtime_checkable

from multidict import CIMultiDict

from treg.memo import memoized

PLACEHOLDER = "secret"


@memoized(4096)
def _format_literals(fmt: str) -> tuple[str, ...]:
    """The literal text around each field of a binding format (parsed once per format: every call
    renders its bindings, twice counting the redactor's copy)."""
    parts = [""]
    for literal, name, _, _ in string.Formatter().parse(fmt):
        parts[-1] += literal
        if name is not None:
            parts.append("")
    return tuple(parts)


@dataclass(frozen=True)
class Binding:
    location: str
    name: str
    format: str = "{secret}"
    secret_id: str | None = None
    platform_setting: str | None = None
    secret_field: str | None = None
    #: an OAuth connection whose access token is the value (docs/oauth.md)
    connection_id: str | None = None

    @property
    def is_literal(self) -> bool:
        """A format without ``{secret}`` renders as a constant (a provider's protocol pin)."""
        return len(_format_literals(self.format)) == 1  # no field between literals

    def render(self, value: str) -> str:
        # str.format's own parse (``{{``/``}}`` escapes, ``{{{secret}}}`` → ``{value}``), but the value is
        # inserted as-is: no format spec or conversion is ever applied to a credential
        return value.join(_format_literals(self.format))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"location": self.location, "name": self.name, "format": self.format}
        for key in ("secret_id", "connection_id", "platform_setting", "secret_field"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Binding":
        return cls(location=data["location"], name=data["name"], format=data.get("format") or "{secret}",
                   secret_id=data.get("secret_id"), platform_setting=data.get("platform_setting"),
                   secret_field=data.get("secret_field"), connection_id=data.get("connection_id"))


def format_fields(fmt: str) -> list[str]:
    """The placeholder names of a format (raises ValueError on a malformed one)."""
    return [name for _, name, _, _ in string.Formatter().parse(fmt) if name is not None]


@dataclass
class OutgoingRequest:
    """The mutable request an injector writes into, inside the relay stage only."""

    headers: CIMultiDict[str]
    #: raw query pairs as the caller sent them (percent-encoding, order, duplicates kept); value None: ``?flag``
    query: list[tuple[str, str | None]]
    json_body: dict[str, Any] | None = None
    #: every value injected, so evidence redaction can mask it wherever it appears
    injected_values: list[str] = field(default_factory=list)


@runtime_checkable
class Injector(Protocol):
    """Puts one credential into an outgoing request. One injector per binding ``location``."""

    #: the binding ``location`` this injector serves (``header``, ``query``, ``json``, …)
    location: str
    #: True when the injector writes into the JSON body (the relay then buffers and reserializes it)
    needs_json_body: bool

    def validate(self, binding: Binding) -> None:
        """Raise ``ValueError`` with a sentence for the caller when ``binding`` cannot work."""

    def inject(self, request: OutgoingRequest, binding: Binding, value: str) -> None:
        """Write the rendered ``value`` for ``binding`` into ``request`` (overwriting what the caller sent)."""


class InjectionPlan(NamedTuple):
    #: per binding, in order: its injector, or None when no loaded plugin serves its location any more
    #: (the call then fails closed, ``injector_missing``)
    injectors: tuple[Injector | None, ...]
    needs_json: bool
    #: a binding names an OAuth connection: its token is fetched (refreshed if due) before injecting
    connections: bool = False


EMPTY = InjectionPlan((), False)


def compile_plan(injectors: Mapping[str, Injector], bindings: tuple[Binding, ...]) -> InjectionPlan:
    if not bindings:
        return EMPTY
    found = tuple(injectors.get(b.location) for b in bindings)
    return InjectionPlan(found, any(i is not None and i.needs_json_body for i in found),
                         any(b.connection_id for b in bindings))
