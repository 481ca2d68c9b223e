"""Every hook a treg plugin may implement, grouped by the pipeline stage that calls it.

Conventions (the same as pytest's and Datasette's):

* every hook is named ``treg_…`` and implemented with ``@treg.hookimpl``;
* ``treg_register_*`` hooks run once at startup and return objects (or lists of them); treg collects
  them into a frozen registry and refuses to start on a duplicate name;
* pluggy calls hooks synchronously. No hook here is a coroutine and none uses ``firstresult`` on async
  work: the objects a registration hook returns carry the async methods;
* observer hooks (events) are contained: an exception is logged and the call goes on. Hooks that
  authorize or inject fail closed: an exception refuses the call.

Every hook below must be documented in ``docs/plugins.md`` (a test checks it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

import pluggy

if TYPE_CHECKING:
    from treg.bindings import Injector
    from treg.events import Event

hookspec = pluggy.HookspecMarker("treg")


# -- startup: registration -------------------------------------------------------------------------

@hookspec
def treg_register_injectors() -> "Sequence[Injector] | None":
    """Called once at startup. Return the credential injectors this plugin provides.

    Each injector serves one binding ``location`` (the built-ins serve ``header``, ``query`` and
    ``json``). Two injectors for one location stop startup, unless the built-in's implementation is
    overridden: built-ins are ``trylast``, so a plugin's injector for the same location is collected
    first and the built-in's duplicate is dropped. ``None`` or an empty list: nothing to add.
    """


@hookspec
def treg_register_providers() -> "Sequence[Mapping[str, Any]] | None":
    """Called once at startup, before anything else starts. Return provider dicts for the catalog.

    The dict shape is the contract of ``docs/plugins.md`` § Providers (provider id, base URL, auth
    bindings, required headers, approved catalog hosts, rate limit, endpoints with their params, price,
    status…); treg turns the dicts into its own frozen types (:mod:`treg.catalog.model`). treg validates
    the whole catalog and refuses to start on a bad row (:class:`treg.catalog.errors.CatalogError`,
    listing every problem with the plugin, the row and the field); two providers or endpoints with one
    id stop startup too. An exception raised here stops startup naming the plugin. ``None`` or an empty
    list: this plugin adds no provider. Return a list, never a bare dict.
    """


# -- evidence and events: observers (contained) ----------------------------------------------------

@hookspec
def treg_spool_evidence_paths(endpoint: "Any") -> "Sequence[str] | None":
    """Called when a billed answer of a ``spooled_response`` endpoint has been spooled, before it is
    parsed. Return extra dotted paths of the JSON answer to keep as evidence (only the value at each
    path survives, at its original place; e.g. ``"candidates.0.finishReason"`` for a result classifier
    keeps ``{"candidates": [{"finishReason": ...}]}``, not the inline media beside it). Settlement's own
    usage paths are always kept. ``None`` or an empty list: nothing to add. Contained: an exception is
    logged and ignored.
    """


@hookspec
def treg_event(event: "Event") -> None:
    """Called for every product event (``tool_called`` once per call attempt, …), after the fact.

    ``event.name`` says what happened and ``event.props`` carries outcome, status, timing and
    tool/provider identity, never parameters, bodies or secrets. The return value is ignored. An
    exception is logged and the call goes on. Keep it fast: it runs on the event loop.
    """
