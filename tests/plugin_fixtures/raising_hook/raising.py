"""A plugin whose registration hook raises."""

from treg import hookimpl


@hookimpl
def treg_register_injectors():
    raise RuntimeError("cannot reach the license server")
