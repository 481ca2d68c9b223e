"""``call_input(...)``: a :class:`treg.call.types.CallInput` as an edge would build it, every field
defaulted (mitmproxy's ``tflow()`` for treg's pipeline), for tests that drive the pipeline without HTTP:
``service.execute(svc, call_input("acme.items.get", surface="catalog", token=...))``."""

from __future__ import annotations

from typing import Any

from treg.call.types import CallInput
from treg.ids import new_call_id


def call_input(rest: str, *, surface: str = "call", method: str = "GET", raw_query: str = "",
               token: str | None = None, headers: tuple[tuple[str, str], ...] = (), body: Any = None,
               content_length: int | None = None, org_hint: str | None = None, call_id: str | None = None,
               **extra: Any) -> CallInput:
    """A call of ``rest`` (the raw path after ``/call/``, or an endpoint id on the ``catalog`` surface),
    with no body and no headers unless given and a fresh call id unless ``call_id``; ``extra``: CallInput's
    optional fields (``tag``, ``idempotency_key``, ``parent_call_id``, ``form``…)."""
    return CallInput(call_id=call_id or new_call_id(), surface=surface, method=method, rest=rest,
                     raw_query=raw_query, headers=headers, token=token, org_hint=org_hint, body=body,
                     content_length=content_length, **extra)
