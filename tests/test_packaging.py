"""What the wheel ships: treg's three package folders, every package below them, and nothing else.

The benchmark (``bench/``) and the test suite (``tests/``, its fixtures and plugin folders) are a
checkout's, not an installed treg's. setup.py decides the package list; it is run here with
``setuptools.setup`` recording its arguments (building a real wheel needs the build backend's own
environment, which a test run has no network to create).
"""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import setuptools

CHECKOUT = Path(__file__).resolve().parent.parent
FOLDERS = {"treg": "treg", "treg_plugins": "plugins", "treg_migrations": "migrations"}


def shipped_packages(monkeypatch) -> list[str]:
    seen: dict[str, Any] = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: seen.update(kw))
    monkeypatch.chdir(CHECKOUT)
    runpy.run_path(str(CHECKOUT / "setup.py"), run_name="__main__")
    return seen["packages"]


def on_disk(name: str, folder: str) -> set[str]:
    root = CHECKOUT / folder
    return {".".join([name, *init.parent.relative_to(root).parts]) for init in root.rglob("__init__.py")}


def test_every_package_of_the_three_folders_ships(monkeypatch):
    packages = set(shipped_packages(monkeypatch))
    for name, folder in FOLDERS.items():
        assert on_disk(name, folder) <= packages, name
    assert "treg.testing" in packages  # plugin authors import it from an installed treg


def test_the_benchmark_and_the_tests_do_not_ship(monkeypatch):
    packages = shipped_packages(monkeypatch)
    assert (CHECKOUT / "bench" / "__main__.py").exists()
    roots = {p.split(".")[0] for p in packages}
    assert roots == set(FOLDERS)
    assert not [p for p in packages if "bench" in p.split(".") or "tests" in p.split(".")]
    assert not (CHECKOUT / "treg" / "bench.py").exists()
