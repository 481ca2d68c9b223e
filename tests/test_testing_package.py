"""``treg.testing`` as plugin authors get it: every name importable from the package, its fixtures a pytest
plugin a suite opts into (also from an installed treg, in pytest-asyncio's strict mode), and a test home
that works outside a checkout too (an installed treg must not put its test server in site-packages)."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import treg
from treg import testing

CHECKOUT = Path(__file__).resolve().parent.parent
PUBLIC = {"Exchange", "FakeDns", "Gateway", "ProviderPlugin", "RawReply", "RawUpstream", "base_dsn",
          "drop_template", "dsn_for", "example_provider", "fresh_database", "http_response", "make_settings",
          "prepare_template", "raw_exchange", "raw_request_bytes", "raw_upstream", "read_reply", "test_home"}


#: modules of treg/testing/ used by their own name (see the package's docstring), not re-exported
BY_MODULE = {"__init__", "pytest_plugin", "import_each", "error_codes", "browser", "nginx", "oauth_server"}


def test_every_name_is_importable_from_the_package():
    assert PUBLIC <= set(testing.__all__)
    for name in testing.__all__:
        assert getattr(testing, name) is not None, name


def test_every_public_name_of_a_concern_module_is_exported():
    folder = Path(testing.__file__).parent
    defined = {}
    for path in sorted(folder.glob("*.py")):
        if path.stem in BY_MODULE:
            continue
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names = [node.name]
            elif isinstance(node, ast.Assign):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            else:
                names = []
            defined.update({n: path.stem for n in names if not n.startswith("_")})
    missing = {n: m for n, m in defined.items() if n not in testing.__all__}
    assert missing == {}, f"defined in treg/testing/<module>.py but not importable from treg.testing: {missing}"
    assert all(getattr(testing, n) is getattr(sys.modules[f"treg.testing.{m}"], n) for n, m in defined.items())


def test_the_suite_loads_the_plugin_and_no_entry_point_does():
    # opt-in: an entry point would hand treg's fixtures (``client``, ``settings``…) to every project that
    # installs treg, and a suite naming the plugin as well would register it twice
    conftest = (CHECKOUT / "tests" / "conftest.py").read_text()
    assert 'pytest_plugins = ["treg.testing.pytest_plugin"]' in conftest
    assert not [ep for ep in importlib.metadata.entry_points(group="pytest11") if ep.value.startswith("treg")]
    assert "pytest11" not in (CHECKOUT / "pyproject.toml").read_text()


def test_in_a_checkout_the_home_is_its_test_home(monkeypatch):
    monkeypatch.delenv("TREG_TEST_HOME", raising=False)
    assert testing.test_home() == CHECKOUT / ".test-home"
    monkeypatch.setenv("TREG_TEST_HOME", "~/elsewhere")
    assert testing.test_home() == Path("~/elsewhere").expanduser()


def run_installed(tmp_path: Path, code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``code`` run in a fresh interpreter against a copy of treg laid out as pip installs it (a bare
    ``treg/`` package in a site folder, no checkout around it)."""
    site = tmp_path / "site"
    shutil.copytree(Path(treg.__file__).parent, site / "treg", ignore=shutil.ignore_patterns("__pycache__"))
    clean = {k: v for k, v in os.environ.items()
             if k not in ("TREG_TEST_HOME", "XDG_CACHE_HOME", "PYTHONPATH")}
    clean.update(env)
    # -S: no site-packages .pth files, so the editable install of the checkout cannot win over the copy
    paths = [str(site)] + [p for p in sys.path if p.endswith("site-packages")]
    return subprocess.run([sys.executable, "-S", "-c", f"import sys; sys.path[:0] = {paths!r}; {code}"],
                          capture_output=True, text=True, timeout=120, env=clean, cwd=tmp_path)


def installed_home(tmp_path: Path, **env: str) -> tuple[str, str]:
    """``test_home()`` of an installed copy of treg: (the home, where treg came from)."""
    out = run_installed(tmp_path, "import treg, treg.testing as t; print(t.test_home()); print(treg.__file__)",
                        **env)
    assert out.returncode == 0, out.stderr[-2000:]
    home, origin = out.stdout.splitlines()
    return home, origin


def test_an_installed_treg_gives_a_plugin_authors_suite_its_fixtures(tmp_path):
    """A third-party suite (no treg checkout around it) names the plugin in its conftest.py and gets the
    fixtures, async ones too under pytest-asyncio's strict mode; nothing else of treg's suite comes along."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text('pytest_plugins = ["treg.testing.pytest_plugin"]\n')
    (suite / "test_mine.py").write_text(textwrap.dedent('''
        import pytest
        import treg
        from treg.testing import Clock, Closes, Events, FakeDns


        def test_where_treg_came_from():
            print("TREG_FROM", treg.__file__)


        @pytest.mark.asyncio
        async def test_the_fixtures(events, clock, closes, fake_dns):
            assert isinstance(events, Events) and events.seen == []
            assert isinstance(clock, Clock) and isinstance(closes, Closes)
            assert isinstance(fake_dns, FakeDns) and fake_dns.nameserver.startswith("127.0.0.1:")
    '''))
    out = run_installed(tmp_path, "import pytest; sys.exit(pytest.main(['-q', '-s', '-p', 'no:cacheprovider', "
                                  "'-o', 'asyncio_mode=strict', '-o', 'asyncio_default_fixture_loop_scope=function', "
                                  "'suite']))")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "2 passed" in out.stdout
    [origin] = [line.split(" ", 1)[1] for line in out.stdout.splitlines() if line.startswith("TREG_FROM ")]
    assert origin.startswith(str(tmp_path / "site"))


def test_installed_the_home_is_a_per_user_cache_folder(tmp_path):
    home, origin = installed_home(tmp_path, HOME=str(tmp_path / "user"))
    assert origin.startswith(str(tmp_path / "site"))
    assert home == str(tmp_path / "user" / ".cache" / "treg-test")


def test_installed_the_home_follows_xdg_cache_home_and_treg_test_home(tmp_path):
    home, _ = installed_home(tmp_path, HOME=str(tmp_path / "user"), XDG_CACHE_HOME=str(tmp_path / "cache"))
    assert home == str(tmp_path / "cache" / "treg-test")
    home, _ = installed_home(tmp_path / "2", TREG_TEST_HOME=str(tmp_path / "mine"))
    assert home == str(tmp_path / "mine")
