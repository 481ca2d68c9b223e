"""A plugin implementing a hook that does not exist (a typo of treg_register_injectors)."""

from treg import hookimpl


@hookimpl
def treg_register_injector():
    return []
