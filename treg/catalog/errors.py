"""The catalog's refusals (catalog.md "Error codes") and its startup error.

Each refusal is a :class:`~treg.errors.TregError`, so the web edge renders it as the contract's error
body; extra keys (``did_you_mean``, ``alternatives``, ``superseded_by``…) travel as ``extra``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from treg.errors import BadRequest, ConfigError, Gone, NotFound, TregError


class EndpointNotFound(NotFound):
    """404: no catalog endpoint has that id; ``did_you_mean`` lists provider-local near ids."""

    code = "endpoint_not_found"

    def __init__(self, endpoint_id: str, did_you_mean: Sequence[str] = (), **kw: Any) -> None:
        hint = f"; did you mean {', '.join(did_you_mean)}?" if did_you_mean else ""
        super().__init__(f"no catalog endpoint {endpoint_id!r}{hint} (GET /api/v1/catalog/endpoints lists them)",
                         did_you_mean=list(did_you_mean), **kw)
        self.endpoint_id = endpoint_id


class EndpointRetired(Gone):
    """410: a retired or broken tombstone, refused before any credential is chosen."""

    code = "endpoint_retired"

    def __init__(self, detail: str, *, status_note: str | None, superseded_by: str | None,
                 alternatives: list[dict[str, Any]] | None) -> None:
        super().__init__(detail, refused_by="retired", alternatives=alternatives)
        # both keys are always present in the body, even when null (catalog.md)
        self.extra["status_note"] = status_note
        self.extra["superseded_by"] = superseded_by

    def body(self) -> dict[str, Any]:
        out = super().body()
        out.setdefault("status_note", None)
        out.setdefault("superseded_by", None)
        return out


class CatalogPathNotAllowed(BadRequest):
    """400: ``/call/<endpoint-id>/<path>``: catalog endpoints take their path slots from the query."""

    code = "catalog_path_not_allowed"


class InvalidParameters(BadRequest):
    """400: strict_query, body_allowlist, enum, a missing required value, an unlisted table-price value."""

    code = "invalid_parameters"

    def __init__(self, detail: str, *, parameter: str | None = None, **kw: Any) -> None:
        super().__init__(detail, refused_by="catalog", parameter=parameter, **kw)
        self.parameter = parameter


class MethodNotAllowed(TregError):
    """405: the endpoint is declared with another HTTP method."""

    status, code, blame = 405, "method_not_allowed", "caller"


class NoCredential(NotFound):
    """404: no tier of the credential ladder can serve this endpoint for this caller."""

    code = "no_credential"


@dataclass(frozen=True)
class Problem:
    """One bad row of the catalog: which plugin declared it, which row, which field, and why."""

    plugin: str
    row: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"plugin {self.plugin!r}, {self.row}, field {self.field!r}: {self.message}"

    def to_json(self) -> dict[str, str]:
        return {"plugin": self.plugin, "row": self.row, "field": self.field, "message": self.message}


class CatalogError(ConfigError):
    """The catalog declared by the plugins is invalid: treg refuses to start.

    ``problems`` lists every bad row found (the detail names the first one).
    """

    code = "invalid_catalog"

    def __init__(self, problems: Sequence[Problem]) -> None:
        first = problems[0]
        more = f" (and {len(problems) - 1} more problem(s); `treg catalog` lists them)" if len(problems) > 1 else ""
        super().__init__(f"invalid catalog: {first}{more}")
        self.problems = tuple(problems)
