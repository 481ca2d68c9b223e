"""A request body's ``_method`` fields (pure): the method a framework acts on instead of the request line's.

Rails (Rack's ``MethodOverride``), Laravel and Symfony let a POST name another method in a ``_method``
field of its body; a deny rule on ``DELETE`` must see ``_method=DELETE`` there (api.md "Deny rules
match what the upstream will understand"). Which bodies they read it from, and so which are read here:

* ``application/x-www-form-urlencoded`` — every framework; also a body with **no** ``Content-Type``
  (Rack reads a POST without one as a form). Fields split on ``&`` and ``;`` (older Rack splits on both).
* ``multipart/form-data`` — Rack and PHP parse it like a form.
* JSON (``application/json``, ``*+json``) — Laravel's input is the decoded JSON object for a JSON
  request, and its method override reads ``_method`` from that input.

Any other media type is never parsed by them for a method, so its body is not read (and keeps
streaming). A field name is compared as PHP and the others decode it (:func:`treg.domain.deny.override_name`).

:func:`body_methods` answers ``None`` when it cannot tell: a multipart body that mentions ``_method``
although no part parsed as such a field (another parser might find one). The deny check then refuses
the call rather than guess (``deny_body_uninspectable``): a rule is never easier to dodge than to obey.
"""

from __future__ import annotations

from email import policy
from email.parser import BytesParser
from email.utils import collapse_rfc2231_value
from typing import Any, Iterable
from urllib.parse import unquote_to_bytes

from treg import json_text
from treg.domain.deny import override_name

FORM, MULTIPART, JSON = "form", "multipart", "json"


def media_type(value: str) -> str:
    return value.partition(";")[0].strip().lower()


def kind_of(content_type: str | None) -> str | None:
    """Which reader a body of this ``Content-Type`` needs (None: frameworks never read a method from it)."""
    if content_type is None:
        return FORM  # Rack: a POST without a Content-Type is form data
    mt = media_type(content_type)
    if mt in ("application/x-www-form-urlencoded", ""):
        return FORM
    if mt == "multipart/form-data":
        return MULTIPART
    if mt == "application/json" or (mt.startswith("application/") and mt.endswith("+json")):
        return JSON
    return None


def kinds(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str | None]]:
    """(kind, Content-Type) for every ``Content-Type`` header that needs a reader: a request carrying two
    is read both ways, since the caller cannot know which one its upstream believes."""
    types = [v for k, v in headers if k.lower() == "content-type"]
    out = [(kind, ct) for ct in (types or [None]) if (kind := kind_of(ct)) is not None]
    return list(dict.fromkeys(out))


def body_methods(headers: Iterable[tuple[str, str]], body: bytes) -> list[str] | None:
    """Every ``_method`` value in ``body`` under each reading its ``Content-Type`` headers call for;
    None: a reading could not tell."""
    out: list[str] = []
    for kind, content_type in kinds(headers):
        found = _READERS[kind](content_type, body)
        if found is None:
            return None
        out += found
    return out


def _form(content_type: str | None, body: bytes) -> list[str]:
    out = []
    for field in body.replace(b";", b"&").split(b"&"):
        name, eq, value = field.partition(b"=")
        if eq and override_name(_decoded(name)):
            out.append(_decoded(value))
    return out


def _decoded(raw: bytes) -> str:
    return unquote_to_bytes(raw.replace(b"+", b" ")).decode("utf-8", "replace")


def _multipart(content_type: str | None, body: bytes) -> list[str] | None:
    head = b"Content-Type: " + (content_type or "").encode("latin-1", "replace") + b"\r\n\r\n"
    try:
        msg = BytesParser(policy=policy.HTTP).parsebytes(head + body)
        parts = list(msg.iter_parts()) if msg.is_multipart() else []
        out = []
        for part in parts:
            name = part.get_param("name", header="content-disposition")
            if name is None:
                continue
            if override_name(collapse_rfc2231_value(name)):
                payload = part.get_payload(decode=True)
                out.append(payload.decode("utf-8", "replace") if isinstance(payload, bytes) else str(payload))
    except Exception:  # noqa: BLE001 (the email parser's failures are many; any of them: cannot tell)
        return None
    if not out and b"_method" in body.lower().replace(b"%5f", b"_"):
        return None  # named somewhere, found as no field: another parser may read it as one
    return out


class _Pairs(list):  # type: ignore[type-arg]
    """A JSON object as its (key, value) pairs, duplicates kept (the last one is what PHP keeps)."""


def _json(content_type: str | None, body: bytes) -> list[str]:
    try:
        data: Any = json_text.parse(body, object_pairs_hook=_Pairs)
    except ValueError:  # not JSON, not text, or nested too deeply (treg/json_text.py)
        return []  # not JSON: Laravel reads no input from it either
    if not isinstance(data, _Pairs):
        return []
    return [v for k, v in data if isinstance(k, str) and isinstance(v, str) and override_name(k)]


_READERS = {FORM: _form, MULTIPART: _multipart, JSON: _json}
