"""Finds treg's packages for setuptools; everything else is in pyproject.toml.

Four source folders install under their own names (``treg/``, ``plugins/`` as ``treg_plugins``,
``migrations/`` as ``treg_migrations``, ``templates/`` (the dashboard's pages and static
files) as ``treg_templates``). pyproject.toml's ``packages.find`` cannot map a folder to
another name, and a hand-written list once left ``treg.money`` out of the wheel: here every package
below each folder is found, so a new subpackage ships without anyone remembering to list it.
"""

from setuptools import find_packages, setup

ROOTS = {"treg": "treg", "treg_plugins": "plugins", "treg_migrations": "migrations", "treg_templates": "templates"}


def packages() -> list[str]:
    out = []
    for name, folder in ROOTS.items():
        out.append(name)
        out += [f"{name}.{sub}" for sub in find_packages(where=folder)]
    return out


setup(packages=packages())
