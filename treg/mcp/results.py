"""A call's answer as a ``CallToolResult`` a model can act on (pure).

* ``content``: one text block with the answer's body, cut at ``TREG_MCP_MAX_TEXT_BYTES`` (64 KiB) with
  a note saying so; for an error, the error body itself (JSON) so a model reading only text sees the
  ``hint``, ``did_you_mean`` and ``alternatives``;
* ``structuredContent``: ``{status, body, call_id, cost_micro, credential_tier, served_via}`` (plus
  ``body_truncated``, ``body_bytes``, ``content_type``), and for an error treg's error body's keys too;
* ``isError``: a vendor non-2xx or a treg refusal.

``served_via`` says how the answer was produced: ``upstream`` (relayed now), ``overflow:<aggregator>`` (served
through an aggregator, docs/resilience.md), ``idempotent_replay`` (the
stored answer of an earlier call with the same Idempotency-Key, not charged again) or ``treg`` (refused
before or instead of an upstream answer).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Sequence

from treg import json_text
from treg.errors import TregError


@dataclass(frozen=True)
class Answer:
    """What was read of a relayed answer (bounded)."""

    status: int
    reason: str
    headers: Sequence[tuple[str, str]]
    data: bytes
    #: the body was longer than what was read
    truncated: bool
    #: the whole body's size when known (Content-Length), else what was read
    size: int | None


def _header(headers: Sequence[tuple[str, str]], name: str) -> str | None:
    lname = name.lower()
    for k, v in headers:
        if k.lower() == lname:
            return v
    return None


def _utf8_prefix(data: bytes) -> str | None:
    """``data`` as text, allowing a character cut at the end (a cut body); None when it is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.reason != "unexpected end of data" or exc.start < len(data) - 3:
            return None
        try:
            return data[:exc.start].decode("utf-8")
        except UnicodeDecodeError:
            return None


def _body_value(answer: Answer, limit: int) -> tuple[Any, str]:
    """(structured body, text) for the first ``limit`` bytes of the answer."""
    data = answer.data[:limit]
    text = _utf8_prefix(data)
    if text is None:
        b64 = base64.b64encode(data).decode("ascii")
        return {"base64": b64}, (f"[binary body, {answer.size if answer.size is not None else len(data)} bytes; "
                                 "base64 in structuredContent.body]")
    if not answer.truncated:
        try:
            doc = json_text.parse(text)
        except ValueError:  # not JSON, or nested too deeply (treg/json_text.py)
            pass
        else:
            # nested deeper than a structure treg gives back (api.md's 64 levels): the text says it all
            if not json_text.nested_deeper(doc):
                return doc, text
    return text, text


def _cut_note(answer: Answer, limit: int) -> str:
    total = f"{answer.size} bytes" if answer.size is not None and answer.size > limit else "more"
    return (f"\n\n[treg: the body was cut at {limit} bytes (TREG_MCP_MAX_TEXT_BYTES) of {total}; ask for less, "
            "e.g. fewer fields or a smaller page, to see the rest]")


def _tier_and_cost(headers: Sequence[tuple[str, str]], fallback_tier: str | None) -> tuple[str | None, int]:
    tier = _header(headers, "X-Treg-Credential-Tier") or fallback_tier
    cost = _header(headers, "X-Treg-Cost-Micro")
    return tier, int(cost) if cost and cost.strip().isdigit() else 0


def answer_result(answer: Answer, *, call_id: str, limit: int, fallback_tier: str | None) -> dict[str, Any]:
    body, text = _body_value(answer, limit)
    if answer.truncated:
        text += _cut_note(answer, limit)
    tier, cost = _tier_and_cost(answer.headers, fallback_tier)
    replay = (_header(answer.headers, "X-Treg-Idempotent-Replay") or "").lower() == "true"
    structured: dict[str, Any] = {
        "status": answer.status, "body": body, "call_id": call_id, "cost_micro": cost, "credential_tier": tier,
        "served_via": "idempotent_replay" if replay else (_header(answer.headers, "X-Treg-Served-Via") or "upstream"),
        "body_truncated": answer.truncated,
        "body_bytes": answer.size if answer.size is not None else len(answer.data),
        "content_type": _header(answer.headers, "Content-Type")}
    if 300 <= answer.status < 400 and _header(answer.headers, "Location"):
        # already rewritten by the pipeline to a treg URL (/call/… or /redirect/…): follow it with your token
        structured["location"] = _header(answer.headers, "Location")
    ok = 200 <= answer.status < 400
    if not ok:
        # the vendor's refusal, in treg's error shape beside its own body: blame and a next step
        structured.update({"error": "upstream_status", "blame": "upstream",
                           "detail": f"the upstream answered {answer.status} {answer.reason}".rstrip() +
                                     "; its body is in body",
                           "hint": "read the upstream's body for what it wants changed, then call again"})
        text = f"HTTP {answer.status} from the upstream (call {call_id}):\n{text}"
    return {"content": [{"type": "text", "text": text}], "structuredContent": structured, "isError": not ok}


def refusal_result(exc: TregError, *, call_id: str) -> dict[str, Any]:
    """treg refused the call (or the upstream could not be reached): its error body, as a tool error."""
    body = exc.body()
    tier, cost = _tier_and_cost(list(exc.headers.items()), None)
    structured = {**body, "status": exc.status, "body": None, "call_id": call_id, "cost_micro": cost,
                  "credential_tier": tier, "served_via": "treg"}
    text = f"treg refused the call ({exc.status} {body['error']}, call {call_id}):\n" + json.dumps(body)
    return {"content": [{"type": "text", "text": text}], "structuredContent": structured, "isError": True}


def search_result(found: dict[str, Any]) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": json.dumps(found, separators=(",", ":"))}],
            "structuredContent": found, "isError": False}
