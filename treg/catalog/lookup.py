"""Finding the endpoint a call names (pure): ``/catalog/call/<id>`` and the ``/call/<name>`` fall-through.

* ``/catalog/call/<rest>`` accepts an exact endpoint id only (:func:`resolve_catalog_call`): a private
  tool can never shadow a catalog entry there.
* ``/call/<name>/<path>`` tries the org's tools first; on a named miss (:func:`resolve_named_miss`) an
  exact catalog id is the endpoint, and an exact catalog id *with a path behind it* is a 400 naming the
  slots and the query form, since a catalog path is fixed and its slots come from the query. When
  every other shape missed too, a dotted name gets the final lookup (:func:`named_miss_error`): a 404
  ``endpoint_not_found`` with provider-local ``did_you_mean``.
* :func:`ensure_live` refuses a retired or broken tombstone with 410 before any credential is chosen
  (an org tool named like the old id already won above, so it is never shadowed).
"""

from __future__ import annotations

from treg.catalog.errors import CatalogPathNotAllowed, EndpointNotFound, EndpointRetired
from treg.catalog.model import Endpoint
from treg.catalog.registry import CatalogRegistry
from treg.catalog.search import with_pointer
from treg.catalog.suggest import did_you_mean
from treg.catalog.tiers import OrgCredentials
from treg.settings import Settings


def _path_refusal(endpoint: Endpoint, surface: str) -> CatalogPathNotAllowed:
    slots = list(endpoint.slots)
    what = (f"its path slots ({', '.join(slots)}) come from the query" if slots
            else "it has no path parameters")
    return CatalogPathNotAllowed(
        f"{endpoint.id} is a catalog endpoint with a fixed path; {what}: call {endpoint.query_form(surface)}",
        slots=slots, query_form=endpoint.query_form(surface), refused_by="catalog")


def resolve_catalog_call(registry: CatalogRegistry, rest: str) -> Endpoint:
    """The endpoint of ``/catalog/call/<rest>``; 404 (with did_you_mean) or 400 (a path after the id)."""
    name, sep, _ = rest.partition("/")
    endpoint = registry.get(name)
    if endpoint is None:
        raise with_pointer(registry, EndpointNotFound(name, did_you_mean(registry, name)), name)
    if sep:
        raise _path_refusal(endpoint, "/catalog/call")
    return endpoint


def resolve_named_miss(registry: CatalogRegistry, rest: str) -> Endpoint | None:
    """After ``/call/<rest>`` found no org tool named ``rest``'s first segment: the catalog endpoint of that
    exact id (None: not a catalog id; the pipeline goes on). An exact id with a path: 400."""
    name, sep, _ = rest.partition("/")
    endpoint = registry.get(name)
    if endpoint is None:
        return None
    if sep:
        raise _path_refusal(endpoint, "/call")
    return endpoint


def named_miss_error(registry: CatalogRegistry, name: str) -> EndpointNotFound | None:
    """The final dotted lookup, once every shape missed: a dotted ``name`` that looks like a catalog id
    (its provider exists, or near ids exist) gets ``endpoint_not_found`` with did_you_mean. None: not
    catalog-shaped; the pipeline answers its own tool_not_found."""
    if "." not in name or registry.get(name) is not None:
        return None
    hints = did_you_mean(registry, name)
    if hints or name.partition(".")[0] in registry.providers:
        return EndpointNotFound(name, hints)
    return None


def ensure_live(registry: CatalogRegistry, endpoint: Endpoint, settings: Settings,
                creds: OrgCredentials | None = None) -> None:
    """410 ``endpoint_retired`` for a retired or broken endpoint: ``status_note``, ``superseded_by``, and
    same-capability ``alternatives`` when there is no successor."""
    if endpoint.is_live:
        return
    from treg.catalog.alternatives import alternatives

    word = "retired" if endpoint.status == "retired" else "out of service (broken)"
    note = f": {endpoint.status_note}" if endpoint.status_note else ""
    if endpoint.superseded_by:
        detail = f"{endpoint.id} is {word}{note}; use {endpoint.superseded_by} instead"
        alts = None
    else:
        alts = alternatives(registry, endpoint, settings, creds)
        tail = f"; same-capability alternatives: {', '.join(a['id'] for a in alts)}" if alts else ""
        detail = f"{endpoint.id} is {word}{note}{tail}"
    raise EndpointRetired(detail, status_note=endpoint.status_note, superseded_by=endpoint.superseded_by,
                          alternatives=alts)
