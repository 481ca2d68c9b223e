"""JSON from outside treg (a caller's body, an upstream's or an aggregator's answer, an OAuth server's, a
form field) read so that what cannot be read is a ``ValueError``, never a 500.

``json.loads`` fails in three ways: ``JSONDecodeError`` (not JSON) and ``UnicodeDecodeError`` (bytes in
no UTF it reads), both ``ValueError``; and ``RecursionError`` for a document nested deeper than Python's
recursion limit allows from where it is called. That last one is valid JSON (``[`` 50 000 times, then
``]`` 50 000 times, is 100 kB), and it is a ``RuntimeError``: a site that caught ``ValueError`` alone let
an upstream's answer turn a platform-tier call into a 500 (the usage read did, until this module).
:func:`parse` raises :class:`TooDeep`, a ``ValueError``, instead, so each site's own ``except ValueError``
holds for all three. tests/test_json_text.py holds every ``json.loads`` of treg to this module or to the
short list of texts treg wrote itself.
"""

from __future__ import annotations

import json
from typing import IO, Any

#: JSON treg takes from a caller or gives back as a structure (a management body, an MCP result's
#: ``structuredContent``) is nested at most this deep (api.md); deeper stays text
DEPTH_MAX = 64


class TooDeep(ValueError):
    """A text nested deeper than Python's parser can recurse from where it was called (valid JSON or not)."""


def parse(data: bytes | bytearray | str, **hooks: Any) -> Any:
    """``json.loads(data, **hooks)``, with a document nested too deeply raised as :class:`TooDeep`.
    Everything else is ``json.loads``'s own: what it reads (UTF-8, -16 and -32 bytes, NaN, integers of
    any size, the last of duplicate keys) and its ``ValueError`` on the rest, as well as whatever a hook
    raises (a duplicate-key or a constant refusal keeps its own class)."""
    try:
        return json.loads(data, **hooks)
    except RecursionError as exc:
        raise TooDeep("the JSON is nested too deeply to read") from exc


def dumps(value: Any, **options: Any) -> str:
    """``json.dumps(value, **options)``, with a value nested too deeply to write raised as :class:`TooDeep`
    (a caller's document parsed at one depth of the stack can be too deep to write from a deeper one)."""
    try:
        return json.dumps(value, **options)
    except RecursionError as exc:
        raise TooDeep("the JSON is nested too deeply to write") from exc


def parse_file(file: IO[bytes], **hooks: Any) -> Any:
    """:func:`parse` of a whole file from its current position (``json.load`` reads it whole too)."""
    return parse(file.read(), **hooks)


def nested_deeper(doc: Any, limit: int = DEPTH_MAX) -> bool:
    """Whether a parsed document holds an array or object more than ``limit`` levels deep (the document
    itself, if one, is level 1). Iterative: the document may be as deep as the parser let it be."""
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            node = node.values()
        elif not isinstance(node, list):
            continue
        if depth > limit:
            return True
        stack.extend((v, depth + 1) for v in node)
    return False
