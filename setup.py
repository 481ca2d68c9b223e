"""Finds treg's packages for setuptools; everything else is in pyproject.toml.

Three source folders install under their own names (``treg/``, ``plugins/`` as ``treg_plugins``,
``migrations/`` as ``treg_migrations``), and ``templates/`` as ``treg.templates``. pyproject.toml's ``packages.find`` cannot map a folder to
another name, and a hand-written list once left ``treg.money`` out of the wheel: here every package
below each folder is found, so a new subpackage ships without anyone remembering to list it.
"""

from setuptools import find_packages, setup

ROOTS = {"treg": "treg", "treg_plugins": "plugins", "treg_migrations": "migrations"}
#: folders that install inside a package: ``templates/`` (the dashboard's pages and static files) is
#: ``treg.templates`` in the wheel, so the wheel still holds nothing but treg's three package roots
NESTED = {"treg.templates": "templates"}


def packages() -> list[str]:
    out = []
    for name, folder in ROOTS.items():
        out.append(name)
        out += [f"{name}.{sub}" for sub in find_packages(where=folder)]
    out += list(NESTED)
    return out


setup(packages=packages())
