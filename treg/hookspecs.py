"""Every hook a treg plugin may implement, grouped by the pipeline stage that calls it.

Conventions (the same as pytest's and Datasette's):

* every hook is named ``treg_…`` and implemented with ``@treg.hookimpl``;
* ``treg_register_*`` hooks run once at startup and return objects (or lists of them); treg collects
  them into a frozen registry (all of them in one place, :func:`treg.startup.invoke_startup`) and
  refuses to start on a duplicate name;
* pluggy calls hooks synchronously. No hook here is a coroutine and none uses ``firstresult`` on async
  work: the objects a registration hook returns carry the async methods;
* each hook declares its failure policy once, here, with :func:`spec`: a ``CONTAINED`` hook's
  exception is logged with the plugin's name and the call goes on (observers); a ``FAIL_CLOSED``
  hook's exception stops what called it (registration: startup refuses). :func:`treg.plugins.call_hook`
  is the only caller and applies the policy;
* wrapper implementations (``hookwrapper=True`` / ``wrapper=True``) are refused at load time: treg calls
  each plugin's implementation on its own so that one plugin's failure is attributed and contained.

Every hook below must be documented in ``docs/plugins.md`` with the same parameters (tests/test_docs.py).
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, TypeVar

import pluggy

if TYPE_CHECKING:
    from treg.bindings import Injector
    from treg.events import Event

hookspec = pluggy.HookspecMarker("treg")

F = TypeVar("F", bound=Callable[..., Any])


class Policy(enum.Enum):
    """What an exception raised by one plugin's implementation does."""

    #: logged once (plugin, hook, exception type), that plugin's answer is skipped, the caller goes on
    CONTAINED = "contained"
    #: raised as :class:`treg.plugins.PluginFailed` naming the plugin; nothing half-done is used
    FAIL_CLOSED = "fail_closed"


CONTAINED = Policy.CONTAINED
FAIL_CLOSED = Policy.FAIL_CLOSED


def spec(policy: Policy) -> Callable[[F], F]:
    """Declare a hook and its failure policy in one place (read back by :func:`policy_of`)."""

    def mark(fn: F) -> F:
        fn.treg_policy = policy  # type: ignore[attr-defined]
        return hookspec(fn)

    return mark


def policy_of(name: str) -> Policy:
    """The declared policy of hook ``name`` (KeyError: treg has no such hook)."""
    fn = globals().get(name)
    policy = getattr(fn, "treg_policy", None)
    if policy is None:
        raise KeyError(f"treg has no hook {name!r}")
    return policy


def hook_names() -> tuple[str, ...]:
    """Every hook declared here, in declaration (= stage) order."""
    return tuple(name for name, fn in globals().items() if callable(fn) and hasattr(fn, "treg_policy"))


# -- startup: registration (fail closed: startup refuses) ------------------------------------------

@spec(FAIL_CLOSED)
def treg_register_injectors() -> "Sequence[Injector] | None":
    """Called once at startup. Return the credential injectors this plugin provides.

    Each injector serves one binding ``location`` (the built-ins serve ``header``, ``query`` and
    ``json``). Two injectors for one location stop startup, unless the built-in's implementation is
    overridden: built-ins are ``trylast``, so a plugin's injector for the same location is collected
    first and the built-in's duplicate is dropped. ``None`` or an empty list: nothing to add.
    Fail closed: an exception stops startup naming the plugin.
    """


@spec(FAIL_CLOSED)
def treg_register_providers() -> "Sequence[Mapping[str, Any]] | None":
    """Called once at startup, before anything else starts. Return provider dicts for the catalog.

    The dict shape is the contract of ``docs/plugins.md`` § Providers (provider id, base URL, auth
    bindings, required headers, approved catalog hosts, rate limit, endpoints with their params, price,
    status…); treg turns the dicts into its own frozen types (:mod:`treg.catalog.model`). treg validates
    the whole catalog and refuses to start on a bad row (:class:`treg.catalog.errors.CatalogError`,
    listing every problem with the plugin, the row and the field); two providers or endpoints with one
    id stop startup too. Fail closed: an exception raised here stops startup naming the plugin. ``None``
    or an empty list: this plugin adds no provider. Return a list, never a bare dict.
    """


@spec(FAIL_CLOSED)
def treg_register_capacity_signatures() -> "Sequence[Mapping[str, Any]] | None":
    """Called once at startup, after the catalog is loaded. Return signature dicts: how a vendor says
    "treg's account is out" (``docs/resilience.md`` § Capacity signatures).

    Each row names a catalog ``provider`` (or ``"*"``: any provider), a ``kind`` (``balance``, ``quota``,
    ``burst``, ``edge_block``) and conditions that must all hold (``status``, ``body_contains``,
    ``body_json``, ``header``, ``retry_after_max_s``), optionally where the vendor states its reset
    (``resets_at``). treg validates every row as it validates provider rows and refuses to start on a bad
    one, naming the plugin, the row and the field. Rows of ``trylast`` implementations (the built-in
    generic ``burst``/``edge_block``) are consulted after every other plugin's. ``None`` or an empty
    list: no signature. Fail closed: an exception stops startup naming the plugin.
    """


@spec(FAIL_CLOSED)
def treg_register_aggregators() -> "Sequence[Any] | None":
    """Called once at startup, before the catalog is loaded (endpoint rows' ``overflow`` routes name
    them). Return aggregator objects (:class:`treg.overflow.aggregator.Aggregator`: a ``name``, a route
    check, and an async ``run`` that builds the request and reads the answer into a normalised result).
    Two aggregators with one name stop startup. ``None`` or an empty list: nothing to add. Fail closed:
    an exception stops startup naming the plugin.
    """


@spec(FAIL_CLOSED)
def treg_register_result_classifiers() -> "Sequence[Mapping[str, Any]] | None":
    """Called once at startup, after the catalog is loaded. Return classifier rows: what a good answer of
    a catalog endpoint looks like (``docs/lifecycle.md`` § Result classifiers and the archive).

    Each row is ``{"endpoint": id, "hit": rule, "miss": rule, "admit_misses": bool}`` (``hit``, ``miss``
    or both; ``admit_misses`` optional, false); a rule is ``{"path": "data.emails", P}`` with exactly one
    predicate ``P`` on the value at that dotted path of the JSON answer: ``"nonempty": true``,
    ``"empty": true`` (null, ``""``, ``[]`` or ``{}``; an absent path is not empty), ``"equals": scalar``
    or ``"in": [scalars]``. A buffered 2xx whose hit rule holds is ``hit``, else whose miss rule holds is
    ``miss``, else ``unknown`` (the audit row's ``result_state``; the archive stores hits, and misses
    with ``admit_misses``). treg validates every row and refuses to start on a bad one or on a second
    row for one endpoint, naming the plugin, the row and the field. ``None`` or an empty list: no
    classifier. Fail closed: an exception stops startup naming the plugin.
    """


# -- call time, after the answer: evidence and events (observers, contained) -----------------------

@spec(CONTAINED)
def treg_spool_evidence_paths(endpoint: "Any") -> "Sequence[str] | None":
    """Called when a billed answer of a ``spooled_response`` endpoint has been spooled, before it is
    parsed. Return extra dotted paths of the JSON answer to keep as evidence (only the value at each
    path survives, at its original place; e.g. ``"candidates.0.finishReason"`` for a result classifier
    keeps ``{"candidates": [{"finishReason": ...}]}``, not the inline media beside it). Settlement's own
    usage paths are always kept. ``None`` or an empty list: nothing to add. Contained: an exception is
    logged and ignored.
    """


@spec(CONTAINED)
def treg_event(event: "Event") -> None:
    """Called for every product event (``tool_called`` once per call, for its final answer: an
    overflowed call's two attempts are two audit rows and one event), after the fact.

    ``event.name`` says what happened and ``event.props`` carries outcome, status, timing and
    tool/provider identity, never parameters, bodies or secrets. Returns nothing: the return value
    (``None`` or anything else) is ignored. Contained: an exception is logged and the call goes on.
    Keep it fast: it runs on the event loop.
    """
