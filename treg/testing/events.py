"""``Events``: a plugin object recording every ``treg_event`` a treg under test emits, in order.

The recording half of mitmproxy's ``taddons.RecordingMaster``, for treg's observer hook: hand it to the
app (``make_app(extra_plugins=(events,))``, or the ``events`` fixture of :mod:`treg.testing.pytest_plugin`)
and read what was observed. A props mapping is copied as it is read, so a test can keep it.
"""

from __future__ import annotations

from typing import Any

from treg import hookimpl
from treg.events import Event


class Events:
    """Every event seen (``seen``, :class:`treg.events.Event` values), and their props by name."""

    def __init__(self) -> None:
        self.seen: list[Event] = []

    @hookimpl
    def treg_event(self, event: Event) -> None:
        self.seen.append(event)

    def named(self, name: str) -> list[dict[str, Any]]:
        """The props of every ``name`` event, in order."""
        return [dict(e.props) for e in self.seen if e.name == name]

    @property
    def tool_called(self) -> list[dict[str, Any]]:
        """The props of every ``tool_called`` event (one per call attempt), in order."""
        return self.named("tool_called")

    def called(self, call_id: str) -> dict[str, Any]:
        """The props of the one ``tool_called`` event of ``call_id`` (fails unless there is exactly one)."""
        [props] = [p for p in self.tool_called if p["call_id"] == call_id]
        return props
