"""Start-up: the plugins loaded and every registry they declare collected, once (Datasette's
``invoke_startup`` is the model).

:func:`invoke_startup` is the one function that turns the ``treg_register_*`` hooks into frozen
registries; the app factory, the CLI and the tests' services all get theirs from it, handed to
:func:`treg.factory.build_services`, so what a process runs with cannot differ between them. Nothing of
it is hung on the plugin manager. Its order is the order the rows depend on one another:

1. injectors (``treg_register_injectors``): a provider's auth bindings name their locations;
2. aggregators (``treg_register_aggregators``): endpoint rows' ``overflow`` routes name them;
3. the catalog (``treg_register_providers``);
4. capacity signatures and result classifiers, whose rows name catalog providers and endpoints.

A bad or duplicate row stops start-up: :class:`~treg.catalog.errors.CatalogError` lists every problem
with its plugin, row and field; a bad or duplicate injector or aggregator is a
:class:`~treg.errors.ConfigError` naming the plugins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from treg import plugins
from treg.bindings import Injector
from treg.capacity.signatures import SignatureRegistry, load_signatures
from treg.catalog.load import load_catalog
from treg.catalog.registry import CatalogRegistry
from treg.overflow.aggregator import Aggregator, collect_aggregators
from treg.plugins import PluginHost
from treg.results import ClassifierRegistry, load_classifiers
from treg.settings import Settings


@dataclass(frozen=True)
class Startup:
    """What one process's plugins registered, collected once at start-up and not changed after."""

    #: the loaded plugins (the call-time hooks go through :func:`treg.plugins.call_hook` on it)
    pm: PluginHost
    #: credential injectors by binding location
    injectors: Mapping[str, Injector]
    #: overflow aggregators by name
    aggregators: Mapping[str, Aggregator]
    #: the validated endpoint catalog
    catalog: CatalogRegistry
    #: how vendors say treg's account is out
    capacity_signatures: SignatureRegistry
    #: result classifiers by endpoint id
    result_classifiers: ClassifierRegistry


def invoke_startup(settings: Settings, *, extra_plugins: Iterable[Any] = ()) -> Startup:
    """Load the plugins ``settings`` name (``extra_plugins``: objects, for tests) and collect every
    registry, validated; raises on the first bad plugin, or on every bad row at once."""
    pm = plugins.create_manager(settings.plugins_dir, extra=extra_plugins, trace=settings.trace_plugins)
    injectors = plugins.collect_injectors(pm)
    aggregators = collect_aggregators(pm)
    # an oauth block's URLs may be plain http only while TREG_SSRF_ALLOW exempts addresses (docs/oauth.md)
    catalog = load_catalog(pm, injectors, aggregators, oauth_http=bool(settings.ssrf_allow))
    return Startup(pm=pm, injectors=injectors, aggregators=aggregators, catalog=catalog,
                   capacity_signatures=load_signatures(pm, catalog),
                   result_classifiers=load_classifiers(pm, catalog))
