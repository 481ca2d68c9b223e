"""``treg.testing`` as plugin authors get it: every name importable from the package, and a test home
that works outside a checkout too (an installed treg must not put its test server in site-packages)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import treg
from treg import testing

CHECKOUT = Path(__file__).resolve().parent.parent
PUBLIC = {"Exchange", "FakeDns", "Gateway", "ProviderPlugin", "RawReply", "RawUpstream", "base_dsn",
          "drop_template", "dsn_for", "example_provider", "fresh_database", "http_response", "make_settings",
          "prepare_template", "raw_exchange", "raw_request_bytes", "raw_upstream", "read_reply", "test_home"}


def test_every_name_is_importable_from_the_package():
    assert PUBLIC <= set(testing.__all__)
    for name in testing.__all__:
        assert getattr(testing, name) is not None, name


def test_in_a_checkout_the_home_is_its_test_home(monkeypatch):
    monkeypatch.delenv("TREG_TEST_HOME", raising=False)
    assert testing.test_home() == CHECKOUT / ".test-home"
    monkeypatch.setenv("TREG_TEST_HOME", "~/elsewhere")
    assert testing.test_home() == Path("~/elsewhere").expanduser()


def installed_home(tmp_path: Path, **env: str) -> tuple[str, str]:
    """``test_home()`` of a copy of treg laid out as pip installs it (a bare ``treg/`` package in a
    site folder, no checkout around it), run in a fresh interpreter: (the home, where treg came from)."""
    site = tmp_path / "site"
    shutil.copytree(Path(treg.__file__).parent, site / "treg", ignore=shutil.ignore_patterns("__pycache__"))
    clean = {k: v for k, v in os.environ.items()
             if k not in ("TREG_TEST_HOME", "XDG_CACHE_HOME", "PYTHONPATH")}
    clean.update(env)
    code = "import treg, treg.testing as t; print(t.test_home()); print(treg.__file__)"
    # -S: no site-packages .pth files, so the editable install of the checkout cannot win over the copy
    paths = [str(site)] + [p for p in sys.path if p.endswith("site-packages")]
    out = subprocess.run([sys.executable, "-S", "-c", f"import sys; sys.path[:0] = {paths!r}; {code}"],
                         capture_output=True, text=True, timeout=60, env=clean, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    home, origin = out.stdout.splitlines()
    return home, origin


def test_installed_the_home_is_a_per_user_cache_folder(tmp_path):
    home, origin = installed_home(tmp_path, HOME=str(tmp_path / "user"))
    assert origin.startswith(str(tmp_path / "site"))
    assert home == str(tmp_path / "user" / ".cache" / "treg-test")


def test_installed_the_home_follows_xdg_cache_home_and_treg_test_home(tmp_path):
    home, _ = installed_home(tmp_path, HOME=str(tmp_path / "user"), XDG_CACHE_HOME=str(tmp_path / "cache"))
    assert home == str(tmp_path / "cache" / "treg-test")
    home, _ = installed_home(tmp_path / "2", TREG_TEST_HOME=str(tmp_path / "mine"))
    assert home == str(tmp_path / "mine")
