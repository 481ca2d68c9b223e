"""The plugin registry: built-ins through the entry-point group, TREG_PLUGINS_DIR plugins, injector
collection (new locations, overrides of the trylast built-ins, conflicts), failures that stop startup
naming the plugin, ``treg plugins``, and every hook documented in docs/plugins.md."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from treg import hookimpl, hookspecs, membership, plugins
from treg.app import create_app
from treg.bindings import Binding, OutgoingRequest
from treg.errors import ConfigError
from treg.keys import SERVICES
from treg.testing import raw_upstream

FIXTURES = Path(__file__).parent / "plugin_fixtures"
ROOT = Path(__file__).resolve().parent.parent


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TREG_")}
    env.update(extra)
    return env


def _treg(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "treg", *args], env=_env(**env), capture_output=True, text=True,
                          timeout=120)


# -- the built-ins ----------------------------------------------------------------------------------------

def test_builtin_injectors_load_through_the_entry_point_group():
    pm = plugins.create_manager()
    loaded = {p.name: p for p in plugins.describe(pm)}
    assert loaded["injectors"].source == "builtin"
    assert loaded["injectors"].hooks == ("treg_register_injectors",)
    assert set(plugins.collect_injectors(pm)) >= {"header", "query", "json"}
    # the built-in is trylast, so any plugin's injector for its location is collected first
    impls = pm.impls("treg_register_injectors")
    assert [i.trylast for i in impls if i.plugin_name == "injectors"] == [True]


def test_treg_plugins_command_lists_builtins_and_hooks(tmp_path):
    proc = _treg("plugins", "--json", TREG_HOME=str(tmp_path / "home"))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    rows = {p["name"]: p for p in out["plugins"]}
    assert rows["injectors"] == {"name": "injectors", "source": "builtin", "hooks": ["treg_register_injectors"]}
    assert {"header", "query", "json"} <= set(out["injectors"])
    text = _treg("plugins", TREG_HOME=str(tmp_path / "home"))
    assert text.returncode == 0 and "injectors" in text.stdout and "treg_register_injectors" in text.stdout
    assert "header" in text.stdout


def test_treg_plugins_lists_a_dir_plugin(tmp_path):
    proc = _treg("plugins", "--json", TREG_HOME=str(tmp_path / "home"),
                 TREG_PLUGINS_DIR=str(FIXTURES / "cookie_injector"))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    rows = {p["name"]: p for p in out["plugins"]}
    assert rows["dir:cookie_injector.py"]["source"] == "dir"
    assert rows["dir:cookie_injector.py"]["hooks"] == ["treg_register_injectors"]
    assert "cookie" in out["injectors"]


# -- a plugin that cannot load stops treg, naming it ------------------------------------------------------

@pytest.mark.parametrize("folder,file", [("broken", "broken_plugin.py"), ("syntax_error", "bad_syntax.py"),
                                         ("raising_hook", "raising.py"), ("bad_return", "bad_return.py"),
                                         ("wrong_signature", "wrong_signature.py"),
                                         ("unknown_hook", "typo_hook.py")])
def test_bad_plugin_stops_create_app(settings, folder, file):
    with pytest.raises(ConfigError) as info:
        create_app(settings.replace(plugins_dir=FIXTURES / folder), dsn="host=/nonexistent dbname=x")
    assert info.value.code == "plugin_failed"
    assert file in info.value.detail, info.value.detail


def test_missing_plugins_dir_stops_create_app(settings, tmp_path):
    with pytest.raises(ConfigError) as info:
        create_app(settings.replace(plugins_dir=tmp_path / "nope"))
    assert str(tmp_path / "nope") in info.value.detail


@pytest.mark.parametrize("command", [["plugins"], ["serve", "--port", "1"], ["init", "--org", "x", "--email", "a@b.c"]])
def test_bad_plugin_stops_the_cli(tmp_path, command):
    # the database URL points nowhere: the plugin error must come first, before any connection
    proc = _treg(*command, TREG_HOME=str(tmp_path / "home"), TREG_PLUGINS_DIR=str(FIXTURES / "broken"),
                 TREG_DATABASE_URL="host=/nonexistent dbname=x connect_timeout=1")
    assert proc.returncode != 0
    err = json.loads(proc.stderr.strip().splitlines()[-1])
    assert err["error"] == "plugin_failed" and "broken_plugin.py" in err["detail"] and err["blame"] == "treg"
    assert proc.stdout == ""


def test_bad_entry_point_names_it(monkeypatch):
    import importlib.metadata as md

    ep = md.EntryPoint(name="exploding", value="treg_no_such_module_anywhere", group="treg")
    monkeypatch.setattr(plugins, "_entry_points", lambda: [(False, ep)])
    with pytest.raises(ConfigError) as info:
        plugins.create_manager()
    assert "exploding" in info.value.detail and "treg_no_such_module_anywhere" in info.value.detail


# -- injectors from plugins ---------------------------------------------------------------------------------

def test_two_plugins_for_one_new_location_stop_startup(settings):
    with pytest.raises(ConfigError) as info:
        create_app(settings.replace(plugins_dir=FIXTURES / "conflict"))
    assert info.value.code == "plugin_conflict"
    assert "'cookie'" in info.value.detail
    assert "first.py" in info.value.detail and "second.py" in info.value.detail


def test_a_plugin_overriding_a_builtin_location_wins():
    pm = plugins.create_manager(FIXTURES / "header_override")
    injectors = plugins.collect_injectors(pm)
    assert type(injectors["header"]).__name__ == "LoudHeaderInjector"
    assert type(injectors["query"]).__name__ == "QueryInjector"  # the other built-ins stay


def test_an_extra_plugin_object_overrides_too():
    class Quiet:
        location = "query"
        needs_json_body = False

        def validate(self, binding: Binding) -> None:
            pass

        def inject(self, request: OutgoingRequest, binding: Binding, value: str) -> None:
            request.query.append((binding.name, value))

    class Plugin:
        @hookimpl
        def treg_register_injectors(self) -> list[Any]:
            return [Quiet()]

    injectors = plugins.collect_injectors(plugins.create_manager(extra=[Plugin()]))
    assert isinstance(injectors["query"], Quiet)


async def _org(client: Any) -> dict[str, str]:
    org = await membership.create_org(client.app[SERVICES], slug="acme", email="owner@acme.test")
    return {"X-Treg-Token": org["token"]}


async def test_dir_plugin_adds_a_location(make_app, aiohttp_client):
    client = await aiohttp_client(make_app(plugins_dir=FIXTURES / "cookie_injector", ssrf_allow=("127.0.0.0/8",)))
    h = await _org(client)
    assert "cookie" in client.app[SERVICES].injectors
    sid = (await (await client.post("/api/v1/secrets", json={"name": "s", "value": "sess_123"}, headers=h)).json())["id"]
    async with raw_upstream() as up:
        resp = await client.post("/api/v1/tools", json={
            "name": "site", "base_url": up.url,
            "bindings": [{"location": "cookie", "name": "session", "secret_id": sid}]}, headers=h)
        assert resp.status == 201, await resp.text()
        # the plugin's own validation runs at registration
        bad = await client.post("/api/v1/tools", json={
            "name": "bad", "base_url": up.url,
            "bindings": [{"location": "cookie", "name": "bad name", "secret_id": sid}]}, headers=h)
        assert bad.status == 400 and "cookie name" in (await bad.json())["detail"]
        # and it injects at call time
        resp = await client.get("/call/site/x", headers={**h, "Cookie": "theme=dark; session=callers"})
        assert resp.status == 200, await resp.text()
        assert up.last.header("Cookie") == "theme=dark; session=sess_123"


async def test_without_the_plugin_the_location_is_unknown(client, owner):
    sid = (await (await client.post("/api/v1/secrets", json={"name": "s", "value": "v"},
                                    headers=owner["headers"])).json())["id"]
    resp = await client.post("/api/v1/tools", json={
        "name": "site", "base_url": "https://api.example.com",
        "bindings": [{"location": "cookie", "name": "session", "secret_id": sid}]}, headers=owner["headers"])
    assert resp.status == 422 and (await resp.json())["error"] == "unknown_injector"


async def test_override_of_header_is_used_at_registration_and_call(make_app, aiohttp_client):
    client = await aiohttp_client(make_app(plugins_dir=FIXTURES / "header_override", ssrf_allow=("127.0.0.0/8",)))
    h = await _org(client)
    sid = (await (await client.post("/api/v1/secrets", json={"name": "s", "value": "k1"}, headers=h)).json())["id"]
    async with raw_upstream() as up:
        # the built-in would accept this name; the override refuses it
        refused = await client.post("/api/v1/tools", json={
            "name": "a", "base_url": up.url,
            "bindings": [{"location": "header", "name": "X-Refused-By-Loud", "secret_id": sid}]}, headers=h)
        assert refused.status == 400 and "loud_header" in (await refused.json())["detail"]
        resp = await client.post("/api/v1/tools", json={
            "name": "b", "base_url": up.url,
            "bindings": [{"location": "header", "name": "X-Api-Key", "secret_id": sid}]}, headers=h)
        assert resp.status == 201, await resp.text()
        resp = await client.get("/call/b/", headers=h)
        assert resp.status == 200, await resp.text()
        assert up.last.header("X-Api-Key") == "k1" and up.last.header("X-Injected-By") == "loud_header"


# -- every hook is documented ----------------------------------------------------------------------------

def hook_names() -> list[str]:
    return sorted(name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
                  if hasattr(fn, "treg_spec"))


def test_every_hook_has_a_docstring():
    names = hook_names()
    assert "treg_register_injectors" in names and all(n.startswith("treg_") for n in names)
    for name in names:
        doc = inspect.getdoc(getattr(hookspecs, name)) or ""
        assert "Called" in doc or "called" in doc, f"{name}: the docstring says when it is called"


def test_every_hook_is_documented_in_docs_plugins_md():
    text = (ROOT / "docs" / "plugins.md").read_text()
    assert re.search(r"^## Hooks\s*$", text, re.M), "docs/plugins.md has a '## Hooks' section"
    hooks_section = text.split("## Hooks", 1)[1]
    missing = [n for n in hook_names() if not re.search(rf"^### {re.escape(n)}\s*$", hooks_section, re.M)]
    assert missing == [], f"hooks without a '### <name>' heading under '## Hooks' in docs/plugins.md: {missing}"
