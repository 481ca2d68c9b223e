"""The plugin manager: load built-ins, entry points and ``TREG_PLUGINS_DIR``; call their hooks.

Load order: treg's own entry points (the built-ins in ``plugins/``, installed as ``treg_plugins``),
third-party entry points of the ``treg`` group, then ``*.py`` files in ``TREG_PLUGINS_DIR`` (sorted).
A plugin that fails to import stops startup with its name; treg never runs half-configured.

:func:`create_manager` returns a :class:`PluginHost`: pluggy's manager, kept private, with what treg
knows about its plugins (where each came from, how often a contained hook failed, whether calls are
traced). :func:`call_hook` is the only way to call a hook. What the ``treg_register_*`` hooks return is
collected once by :func:`treg.startup.invoke_startup`, never hung on the manager.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any, Iterable, Mapping

import pluggy

from treg import hookspecs
from treg.bindings import Injector
from treg.errors import ConfigError
from treg.hookspecs import CONTAINED, policy_of

log = logging.getLogger(__name__)
#: one line per hook implementation called, when ``TREG_TRACE_PLUGINS`` is on
trace_log = logging.getLogger(__name__ + ".trace")

GROUP = "treg"
DISTRIBUTION = "treg"
#: the entry point that serves the built-in binding locations
BUILTIN_INJECTORS = "injectors"
#: locations every stored tool may use; startup refuses when one has no injector
ESSENTIAL_INJECTORS = ("header", "query", "json")


class PluginFailed(ConfigError):
    """A fail-closed hook of one plugin raised or returned what its spec does not allow."""

    code = "plugin_failed"

    def __init__(self, plugin: str, hook: str, detail: str) -> None:
        super().__init__(f"plugin {plugin!r} failed in {hook}: {detail}")
        self.plugin = plugin
        self.hook = hook


@dataclass(frozen=True)
class HookResult:
    """One plugin's answer to a hook call."""

    plugin: str
    value: Any
    #: the implementation was ``trylast`` (an overridable built-in)
    trylast: bool


class PluginHost:
    """The loaded plugins of one process: pluggy's manager (private: every hook call goes through
    :func:`call_hook`), where each plugin came from, and the count of each contained failure.

    ``trace`` (``TREG_TRACE_PLUGINS``): :func:`call_hook` logs every implementation it calls with its
    plugin and time, never the arguments or the answer (an observer's event, a request's values)."""

    def __init__(self, pm: pluggy.PluginManager, sources: Mapping[str, str], *, trace: bool = False) -> None:
        self._pm = pm
        self.sources: Mapping[str, str] = MappingProxyType(dict(sources))
        self.trace = trace
        #: (plugin, hook, exception type) -> how many times a contained hook failed that way
        self.contained_failures: dict[tuple[str, str, str], int] = {}
        # hook -> (its spec's arguments, its implementations in call order): every plugin is registered
        # by now and none later, so this is read once instead of on every call of a call-path hook
        self._calls: dict[str, tuple[frozenset[str], tuple[pluggy.HookImpl, ...]]] = {}
        for name in hookspecs.hook_names():
            caller = getattr(pm.hook, name)
            args = caller.spec.argnames if caller.spec is not None else ()
            # pluggy calls the last-registered first
            self._calls[name] = (frozenset(args), tuple(reversed(caller.get_hookimpls())))

    def impls(self, name: str) -> list[pluggy.HookImpl]:
        """The implementations of hook ``name``, in registration order (pluggy calls the last first)."""
        return getattr(self._pm.hook, name).get_hookimpls()

    def calls(self, name: str) -> tuple[frozenset[str], tuple[pluggy.HookImpl, ...]]:
        """(the spec's argument names, the implementations in call order) of hook ``name``."""
        return self._calls[name]

    def names_and_plugins(self) -> list[tuple[str, Any]]:
        return self._pm.list_name_plugin()

    def hooks_of(self, plugin: Any) -> tuple[str, ...]:
        return tuple(sorted(h.name for h in self._pm.get_hookcallers(plugin) or []))


@dataclass(frozen=True)
class LoadedPlugin:
    name: str
    source: str  # builtin | entrypoint | dir
    hooks: tuple[str, ...]


def _entry_points() -> list[tuple[bool, importlib.metadata.EntryPoint]]:
    eps = []
    for ep in importlib.metadata.entry_points(group=GROUP):
        builtin = ep.dist is not None and ep.dist.name == DISTRIBUTION
        eps.append((builtin, ep))
    # built-ins first, then third parties, each in name order (a stable load order)
    eps.sort(key=lambda item: (not item[0], item[1].name))
    return eps


def _import_file(path: Path) -> ModuleType:
    name = f"treg_local_plugins.{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)  # no half-imported module left behind
        raise
    return module


def create_manager(plugins_dir: Path | None = None, extra: Iterable[Any] = (), *,
                   trace: bool = False) -> PluginHost:
    """Every plugin loaded into a pluggy manager named ``treg`` (``extra``: objects for tests);
    ``trace``: log each hook call (``TREG_TRACE_PLUGINS``)."""
    pm = pluggy.PluginManager(GROUP)
    pm.add_hookspecs(hookspecs)
    sources: dict[str, str] = {}
    for builtin, ep in _entry_points():
        if pm.has_plugin(ep.name):
            continue
        try:
            plugin = ep.load()
        except Exception as exc:  # any import failure must name the plugin
            raise ConfigError(f"plugin {ep.name!r} ({ep.value}) failed to import: {exc!r}",
                              code="plugin_failed") from exc
        _register(pm, plugin, ep.name)
        sources[ep.name] = "builtin" if builtin else "entrypoint"
    if plugins_dir is not None:
        if not plugins_dir.is_dir():
            raise ConfigError(f"TREG_PLUGINS_DIR {plugins_dir} is not a folder", code="plugin_failed")
        for path in sorted(plugins_dir.glob("*.py")):
            name = f"dir:{path.name}"
            try:
                module = _import_file(path)
            except Exception as exc:
                raise ConfigError(f"plugin {path.name!r} in {plugins_dir} failed to import: {exc!r}",
                                  code="plugin_failed") from exc
            _register(pm, module, name)
            sources[name] = "dir"
    for i, obj in enumerate(extra):
        name = getattr(obj, "__name__", None) or f"extra:{type(obj).__name__}:{i}"
        _register(pm, obj, name)
        sources[name] = "extra"
    try:
        pm.check_pending()  # a hookimpl with no spec is a typo (treg_register_injector): refuse, don't ignore
    except pluggy.PluginValidationError as exc:
        raise ConfigError(f"plugin {pm.get_name(exc.plugin)!r} implements a hook treg does not have: {exc}",
                          code="plugin_failed") from exc
    _refuse_wrappers(pm)
    return PluginHost(pm, sources, trace=trace)


def _refuse_wrappers(pm: pluggy.PluginManager) -> None:
    # call_hook runs each implementation on its own (to attribute and contain failures); a wrapper
    # would silently never run, so it is refused here rather than ignored
    for name in hookspecs.hook_names():
        for impl in getattr(pm.hook, name).get_hookimpls():
            if impl.hookwrapper or impl.wrapper:
                raise ConfigError(f"plugin {impl.plugin_name!r} implements {name} as a wrapper (hookwrapper=True "
                                  "or wrapper=True); treg does not run hook wrappers: implement the hook plainly",
                                  code="plugin_failed")


def has_impls(pm: PluginHost, name: str) -> bool:
    """Whether any plugin implements hook ``name`` (lets a caller skip building arguments nobody reads)."""
    return bool(pm.calls(name)[1])


def call_hook(pm: PluginHost, name: str, /, **kwargs: Any) -> list[HookResult]:
    """Call every plugin's implementation of hook ``name`` and return their answers, in pluggy's order.

    pluggy's calling convention is kept: the caller passes exactly the spec's arguments, by name, and
    each implementation receives the subset it declares; ``tryfirst``/``trylast`` order the calls.
    The hook's declared policy (:func:`treg.hookspecs.policy_of`) decides what an exception does:
    CONTAINED logs it once per (plugin, exception type) and skips that plugin; FAIL_CLOSED raises
    :class:`PluginFailed` naming the plugin. With ``pm.trace``, each implementation called is logged
    (hook, plugin, milliseconds, returned or raised which exception type), nothing of its values.
    """
    policy = policy_of(name)
    expected, impls = pm.calls(name)
    if kwargs.keys() != expected:
        raise TypeError(f"{name} takes {tuple(sorted(expected))}, called with {tuple(kwargs)}")
    out: list[HookResult] = []
    for impl in impls:
        started = time.perf_counter() if pm.trace else 0.0
        try:
            value = impl.function(**{arg: kwargs[arg] for arg in impl.argnames})
        except Exception as exc:
            if pm.trace:
                _trace(name, impl.plugin_name, started, f"raised {type(exc).__name__}")
            if policy is CONTAINED:
                _log_contained(pm, impl.plugin_name, name, exc)
                continue
            raise PluginFailed(impl.plugin_name, name, f"the hook raised {type(exc).__name__}: {exc}") from exc
        if pm.trace:
            _trace(name, impl.plugin_name, started, "returned")
        out.append(HookResult(impl.plugin_name, value, impl.trylast))
    return out


def _trace(hook: str, plugin: str, started: float, ended: str) -> None:
    # names and a time only: a hook's arguments and answers carry call values (events, endpoints' rows)
    trace_log.info("hook %s: plugin %r %s in %.3f ms", hook, plugin, ended, (time.perf_counter() - started) * 1000)


def _log_contained(pm: PluginHost, plugin: str, hook: str, exc: Exception) -> None:
    # the exception's message is not logged: an observer may have put the event's values into it.
    # Type and stack locate the bug; logging every repeat would flood the log on every call.
    failures = pm.contained_failures
    key = (plugin, hook, type(exc).__name__)
    failures[key] = failures.get(key, 0) + 1
    if failures[key] > 1:
        return
    stack = "".join(traceback.format_list(traceback.extract_tb(exc.__traceback__)))
    log.error("plugin %r failed in %s (%s); ignored, the call goes on. Later %s failures of this plugin in "
              "this hook are counted, not logged.\n%s", plugin, hook, type(exc).__name__, type(exc).__name__,
              stack.rstrip())


def contained_failures(pm: PluginHost) -> dict[tuple[str, str, str], int]:
    """How often each (plugin, hook, exception type) failed in a contained hook."""
    return dict(pm.contained_failures)


def _register(pm: pluggy.PluginManager, plugin: Any, name: str) -> None:
    try:
        pm.register(plugin, name=name)
    except (ValueError, pluggy.PluginValidationError) as exc:
        raise ConfigError(f"plugin {name!r} cannot be registered: {exc}", code="plugin_failed") from exc


def describe(pm: PluginHost) -> list[LoadedPlugin]:
    return [LoadedPlugin(name, pm.sources.get(name, "?"), pm.hooks_of(plugin))
            for name, plugin in pm.names_and_plugins()]


def collect_injectors(pm: PluginHost) -> Mapping[str, Injector]:
    """Injectors by location. Hook results arrive in call order: ``trylast`` built-ins come last, so a
    plugin's injector for a built-in location wins; two non-builtin injectors for one location stop
    startup. The built-in locations (:data:`ESSENTIAL_INJECTORS`) must be served: without them every
    stored tool would fail at call time, so startup refuses instead."""
    found: dict[str, tuple[Injector, str, bool]] = {}
    for res in call_hook(pm, "treg_register_injectors"):
        result = res.value or []
        if not isinstance(result, (list, tuple)):
            raise PluginFailed(res.plugin, "treg_register_injectors",
                               f"must return a list of injectors, not {type(result).__name__}")
        for injector in result:
            if not isinstance(injector, Injector) or not isinstance(getattr(injector, "location", None), str):
                raise PluginFailed(res.plugin, "treg_register_injectors",
                                   f"returned {injector!r}, which is not an Injector "
                                   "(location, needs_json_body, validate, inject)")
            loc = injector.location
            if loc in found:
                _, other, other_trylast = found[loc]
                if res.trylast and not other_trylast:
                    continue  # an overridable default lost to a plugin's own injector
                raise ConfigError(f"two injectors for location {loc!r}: plugins {other!r} and {res.plugin!r}",
                                  code="plugin_conflict")
            found[loc] = (injector, res.plugin, res.trylast)
    missing = [loc for loc in ESSENTIAL_INJECTORS if loc not in found]
    if missing:
        raise ConfigError(f"no injector for the built-in location(s) {', '.join(map(repr, missing))}: the "
                          f"built-in plugin {BUILTIN_INJECTORS!r} (entry point group {GROUP!r} of the "
                          f"{DISTRIBUTION!r} distribution) is not loaded and no plugin replaces it; "
                          "reinstall treg", code="plugin_missing")
    return {loc: inj for loc, (inj, _, _) in found.items()}


def spool_evidence_paths(pm: PluginHost, endpoint: Any) -> list[str]:
    """Evidence paths plugins ask to keep from a spooled answer (contained: a failing plugin is skipped,
    a non-string path is ignored)."""
    paths: list[str] = []
    for res in call_hook(pm, "treg_spool_evidence_paths", endpoint=endpoint):
        paths.extend(p for p in (res.value or ()) if isinstance(p, str))
    return paths
