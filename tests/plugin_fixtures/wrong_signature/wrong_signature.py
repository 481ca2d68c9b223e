"""A plugin implementing a hook with an argument the spec does not have."""

from treg import hookimpl


@hookimpl
def treg_register_injectors(settings):
    return []
