"""The names a caller writes as a path segment: a tool's name (``/call/<name>/…``), and the name part
of a hub ref (``/call/<org-slug>.<name>/…``, treg/hub/model.py).

RFC 3986 unreserved characters only (letters, digits, ``. _ ~ -``), starting with a letter or a digit,
at most 200: a name is one path segment that no client percent-encodes or splits, never holds a ``/``,
and reads the same in a URL, a log line and the dashboard. One pattern, for the checks and for the
OpenAPI document (treg/web/openapi.py) alike.
"""

from __future__ import annotations

import re

#: the pattern without anchors, as JSON Schema's ``pattern`` takes it (``^…$``)
TOOL_NAME_PATTERN = "[A-Za-z0-9][A-Za-z0-9._~-]{0,199}"
TOOL_NAME = re.compile(rf"\A{TOOL_NAME_PATTERN}\Z")
