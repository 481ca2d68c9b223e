"""HTTP/1.1 grammar treg checks names and values against, and the headers that belong to one hop.

Pure constants, no I/O, importable from every layer (the relay's header filter, the catalog loader,
the built-in injectors, the benchmark's bare relay): one copy, so what the loader refuses in a
provider's headers and what the relay drops on the wire cannot drift apart.
"""

from __future__ import annotations

import re

#: a token's characters (RFC 9110 §5.6.2 ``tchar``), as the inside of a regular expression's class
TCHAR = r"!#$%&'*+\-.^_`|~0-9A-Za-z"
#: a field name (RFC 9110 §5.1, §5.6.2 ``token``: one or more tchar). Anything else in a header name
#: could smuggle a second header or split the line. ``\Z``, not ``$``: ``$`` also matches before a
#: final newline, and ``X-Key\n`` is not a token
TOKEN = re.compile(rf"\A[{TCHAR}]+\Z")

#: a control character (RFC 5234 ``CTL``: %x00-1F / %x7F); CR or LF in a field value splits the header
CTL = re.compile(r"[\x00-\x1f\x7f]")

#: hop-by-hop fields (RFC 9110 §7.6.1, RFC 7230 §6.1; ``proxy-connection`` and ``trailers``: common
#: non-standard spellings): they describe one connection and are never forwarded
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "proxy-authenticate",
                        "proxy-authorization", "te", "trailer", "trailers", "transfer-encoding", "upgrade"})

#: end-to-end in the RFCs, but derived again by whoever sends each hop: the authority of the URL it
#: dials and the length of the body it sends
FRAMING = frozenset({"host", "content-length"})

#: what a relay re-derives per hop instead of copying from one side to the other
PER_HOP = HOP_BY_HOP | FRAMING

#: one element of a comma-separated field value (RFC 9110 §5.6.1): a run of anything but commas and
#: quotes, or a quoted-string (with its backslash escapes), repeated; a comma inside quotes
#: (``no-cache="Set-Cookie, X-Id"``) belongs to its element. An unclosed quote runs to the end
_ELEMENT = re.compile(r'(?:[^,"]|"(?:[^"\\]|\\.)*(?:"|\Z))+', re.S)


def list_elements(value: str) -> list[str]:
    """The non-empty elements of a comma-separated field value, each stripped, quotes kept as sent."""
    return [e for e in (m.group().strip() for m in _ELEMENT.finditer(value)) if e]
