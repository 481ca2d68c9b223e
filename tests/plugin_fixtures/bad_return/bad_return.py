"""A plugin whose registration hook returns something that is not an injector."""

from treg import hookimpl


@hookimpl
def treg_register_injectors():
    return [object()]
