"""treg: a self-hosted gateway that injects a team's credentials into agents' API calls."""

import pluggy

__version__ = "0.1.0"

#: Decorator for plugin hook implementations: ``@hookimpl def treg_register_injectors(): ...``
hookimpl = pluggy.HookimplMarker("treg")

__all__ = ["hookimpl", "__version__"]
