"""The plugin manager: load built-ins, entry points and ``TREG_PLUGINS_DIR``, then collect registries.

Load order: treg's own entry points (the built-ins in ``plugins/``, installed as ``treg_plugins``),
third-party entry points of the ``treg`` group, then ``*.py`` files in ``TREG_PLUGINS_DIR`` (sorted).
A plugin that fails to import stops startup with its name; treg never runs half-configured.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Iterable, Mapping

import pluggy

from treg import hookspecs
from treg.bindings import Injector
from treg.errors import ConfigError
from treg.events import Event

log = logging.getLogger(__name__)

GROUP = "treg"
DISTRIBUTION = "treg"


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


def create_manager(plugins_dir: Path | None = None, extra: Iterable[Any] = ()) -> pluggy.PluginManager:
    """A ``PluginManager`` named ``treg`` with every plugin loaded (``extra``: objects for tests)."""
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
    pm.treg_sources = sources  # type: ignore[attr-defined]
    return pm


def _register(pm: pluggy.PluginManager, plugin: Any, name: str) -> None:
    try:
        pm.register(plugin, name=name)
    except (ValueError, pluggy.PluginValidationError) as exc:
        raise ConfigError(f"plugin {name!r} cannot be registered: {exc}", code="plugin_failed") from exc


def describe(pm: pluggy.PluginManager) -> list[LoadedPlugin]:
    sources = getattr(pm, "treg_sources", {})
    out = []
    for name, plugin in pm.list_name_plugin():
        hooks = tuple(sorted(h.name for h in pm.get_hookcallers(plugin) or []))
        out.append(LoadedPlugin(name, sources.get(name, "?"), hooks))
    return out


def _plugin_name(pm: pluggy.PluginManager, impl: pluggy.HookImpl) -> str:
    return impl.plugin_name


def collect_injectors(pm: pluggy.PluginManager) -> Mapping[str, Injector]:
    """Injectors by location. Hook results arrive in call order: ``trylast`` built-ins come last, so a
    plugin's injector for a built-in location wins; two non-builtin injectors for one location stop
    startup."""
    found: dict[str, tuple[Injector, str, bool]] = {}
    for impl in reversed(pm.hook.treg_register_injectors.get_hookimpls()):
        try:
            result = impl.function() or []
        except Exception as exc:  # fail closed, naming the plugin: treg never starts half-configured
            raise ConfigError(f"plugin {impl.plugin_name!r} failed in treg_register_injectors: {exc!r}",
                              code="plugin_failed") from exc
        if not isinstance(result, (list, tuple)):
            raise ConfigError(f"plugin {impl.plugin_name!r}: treg_register_injectors must return a list of "
                              f"injectors, not {type(result).__name__}", code="plugin_failed")
        for injector in result:
            if not isinstance(injector, Injector) or not isinstance(getattr(injector, "location", None), str):
                raise ConfigError(f"plugin {impl.plugin_name!r}: treg_register_injectors returned {injector!r}, "
                                  "which is not an Injector (location, needs_json_body, validate, inject)",
                                  code="plugin_failed")
            loc = injector.location
            if loc in found:
                _, other, other_trylast = found[loc]
                if impl.trylast and not other_trylast:
                    continue  # an overridable default lost to a plugin's own injector
                raise ConfigError(f"two injectors for location {loc!r}: plugins {other!r} and {impl.plugin_name!r}",
                                  code="plugin_conflict")
            found[loc] = (injector, impl.plugin_name, impl.trylast)
    return {loc: inj for loc, (inj, _, _) in found.items()}


def emit(pm: pluggy.PluginManager, event: Event) -> None:
    """Hand an event to every observer; a failing observer is logged and skipped (contained)."""
    for impl in pm.hook.treg_event.get_hookimpls():
        try:
            impl.function(event=event)
        except Exception:  # observers must never break a call
            log.exception("plugin %r failed in treg_event(%s); ignored", impl.plugin_name, event.name)


def spool_evidence_paths(pm: pluggy.PluginManager, endpoint: Any) -> list[str]:
    """Evidence paths plugins ask to keep from a spooled answer (contained: a failing plugin is skipped)."""
    paths: list[str] = []
    for impl in pm.hook.treg_spool_evidence_paths.get_hookimpls():
        try:
            result = impl.function(endpoint=endpoint)
        except Exception:
            log.exception("plugin %r failed in treg_spool_evidence_paths; ignored", impl.plugin_name)
            continue
        paths.extend(p for p in (result or ()) if isinstance(p, str))
    return paths
