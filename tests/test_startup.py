"""One start-up plugins object (treg.startup.invoke_startup): the server, the CLI, the tests' gateway
and their domain services all run with the registries of one ``Startup``; a bad or duplicate row stops
each of them naming plugin, row and field; ``TREG_TRACE_PLUGINS`` logs every hook call, never a value.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import treg.startup
from treg import cli, hookimpl, membership
from treg.app import create_app
from treg.catalog.errors import CatalogError, Problem
from treg.factory import build_services
from treg.infra.db import Database
from treg.keys import SERVICES
from treg.settings import SecretStr
from treg.testing import Gateway, make_settings, raw_upstream

#: a third party's plugin file: rows for the registries that name catalog rows (the aggregators are the
#: built-ins')
VENDORZ = '''
from treg import hookimpl


@hookimpl
def treg_register_providers():
    return [{"id": "vendorz", "base_url": "https://api.vendorz.test", "auth": [{"location": "header", "name": "K"}],
             "endpoints": [{"id": "vendorz.get", "method": "GET", "path": "/get", "price": {"per_call_micro": 5}}]}]


@hookimpl
def treg_register_capacity_signatures():
    return [{"provider": "vendorz", "kind": "quota", "status": [429], "body_contains": "monthly quota"}]


@hookimpl
def treg_register_result_classifiers():
    return [{"endpoint": "vendorz.get", "hit": {"path": "data", "nonempty": True}}]
'''

#: a second file classifying the same endpoint again: a duplicate row
SECOND_CLASSIFIER = '''
from treg import hookimpl


@hookimpl
def treg_register_result_classifiers():
    return [{"endpoint": "vendorz.get", "miss": {"path": "data", "empty": True}}]
'''


def registries(holder: Any) -> tuple[Any, ...]:
    """What start-up collected, as a Services or a Startup holds it."""
    return (holder.pm, holder.injectors, holder.aggregators, holder.catalog, holder.capacity_signatures,
            holder.result_classifiers)


def same_objects(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


@pytest.fixture
def startups(monkeypatch) -> list[treg.startup.Startup]:
    """Every Startup built from here on, in order (the one function, spied on)."""
    made: list[treg.startup.Startup] = []
    real = treg.startup.invoke_startup

    def spy(*args: Any, **kwargs: Any) -> treg.startup.Startup:
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(treg.startup, "invoke_startup", spy)
    return made


def plugin_dir(tmp_path: Path, **files: str) -> Path:
    folder = tmp_path / "plugins"
    folder.mkdir()
    for name, text in files.items():
        (folder / f"{name}.py").write_text(text)
    return folder


def has_vendorz(svc: Any) -> bool:
    return (svc.catalog.get("vendorz.get").provider == "vendorz" and {"orthogonal", "monid"} <= set(svc.aggregators)
            and [s.kind for s in svc.capacity_signatures.for_provider("vendorz")][:1] == ["quota"]
            and svc.result_classifiers.get("vendorz.get") is not None
            and {"header", "query", "json"} <= set(svc.injectors))


async def test_the_gateway_runs_with_the_registries_of_one_startup(startups, gateway):
    # the `startups` spy is set up before the gateway fixture builds its app
    assert len(startups) == 1
    assert same_objects(registries(gateway.services), registries(startups[0]))
    assert gateway.services.pm.sources["injectors"] == "builtin"


async def test_server_cli_and_domain_services_get_their_registries_from_one_function(
        tmp_path, dsn, startups, aiohttp_client):
    settings = make_settings(tmp_path / "home", plugins_dir=plugin_dir(tmp_path, vendorz=VENDORZ),
                             database_url=SecretStr(dsn))
    # the server: one start-up when the app is built, its registries what the app's Services hold
    client = await aiohttp_client(create_app(settings, dsn=dsn))
    served = client.app[SERVICES]
    assert len(startups) == 1 and same_objects(registries(served), registries(startups[0]))
    assert has_vendorz(served)

    # the CLI's operator commands: their own start-up, through the same function, with the same rows
    async def keep(svc: Any) -> Any:
        return svc

    from_cli = await cli._with_services(settings, keep)
    assert len(startups) == 2 and same_objects(registries(from_cli), registries(startups[1]))
    assert has_vendorz(from_cli)

    # the domain tests' services (build_services without a Startup loads one, the same way)
    db = await Database(dsn, minsize=1, maxsize=2).open()
    try:
        domain = build_services(settings, db)
    finally:
        await db.close()
    assert len(startups) == 3 and same_objects(registries(domain), registries(startups[2]))
    assert has_vendorz(domain)
    # `treg catalog` and `treg doctor` validate through it too
    assert cli.cmd_catalog(type("Args", (), {"json": True, "provider": "vendorz"})(), settings) == 0
    assert len(startups) == 4
    await client.close()


def test_nothing_is_hung_on_pluggys_manager():
    startup = treg.startup.invoke_startup(make_settings(Path("/nonexistent-home")))
    pm = startup.pm._pm  # pluggy's own manager, private to the host
    assert not [name for name in vars(pm) if name.startswith("treg")], vars(pm)
    assert type(startup.pm).__name__ == "PluginHost"


def _duplicate_problem(exc: CatalogError) -> Problem:
    assert exc.code == "invalid_catalog"
    [problem] = exc.problems
    return problem


async def test_a_duplicate_row_stops_the_server_the_cli_and_the_services_naming_it(tmp_path, dsn):
    folder = plugin_dir(tmp_path, a_vendorz=VENDORZ, b_again=SECOND_CLASSIFIER)
    settings = make_settings(tmp_path / "home", plugins_dir=folder, database_url=SecretStr(dsn))
    expected = ("dir:b_again.py", "classifier #0 (vendorz.get)", "endpoint")
    with pytest.raises(CatalogError) as info:
        create_app(settings, dsn=dsn)
    problem = _duplicate_problem(info.value)
    assert (problem.plugin, problem.row, problem.field) == expected and "'dir:a_vendorz.py'" in problem.message
    db = await Database(dsn, minsize=1, maxsize=1).open()
    try:
        with pytest.raises(CatalogError) as info:
            build_services(settings, db)
    finally:
        await db.close()
    assert (lambda p: (p.plugin, p.row, p.field))(_duplicate_problem(info.value)) == expected

    # an operator command refuses before any database work, with the error body on stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("TREG_")}
    env.update(TREG_HOME=str(tmp_path / "home"), TREG_PLUGINS_DIR=str(folder),
               TREG_DATABASE_URL="postgresql://127.0.0.1:9/never-dialled")
    proc = subprocess.run([sys.executable, "-m", "treg", "capacity", "list"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    body = json.loads(proc.stderr.strip().splitlines()[-1])
    assert body["error"] == "invalid_catalog"
    assert "plugin 'dir:b_again.py', classifier #0 (vendorz.get), field 'endpoint'" in body["detail"]


# -- TREG_TRACE_PLUGINS ---------------------------------------------------------------------------------

SECRET = "sk-trace-3f9a1c-never-logged"
TRACE = re.compile(r"^hook (treg_\w+): plugin '([^']+)' (returned|raised \w+) in \d+\.\d{3} ms$")


class Observer:
    __name__ = "trace-observer"

    def __init__(self) -> None:
        self.seen = 0

    @hookimpl
    def treg_event(self, event: Any) -> None:
        self.seen += 1


class Failing:
    __name__ = "failing-observer"

    @hookimpl
    def treg_event(self, event: Any) -> None:
        raise RuntimeError(f"carries {event.props.get('tool_name')}")


async def _one_call_with_a_secret(make_app, aiohttp_client, **overrides: Any) -> tuple[Observer, dict[str, Any]]:
    observer = Observer()
    client = await aiohttp_client(make_app(extra_plugins=(observer, Failing()), ssrf_allow=("127.0.0.0/8",),
                                           **overrides))
    org = await membership.create_org(client.app[SERVICES], slug="acme", email="o@acme.test")
    gw = Gateway(client, org)
    async with raw_upstream() as up:
        sid = await gw.secret(SECRET)
        await gw.tool("traced-tool", up.url, [{"location": "header", "name": "Authorization",
                                               "format": "Bearer {secret}", "secret_id": sid}])
        resp = await gw.call("GET", "/call/traced-tool/private/path?q=hidden-query")
        assert resp.status == 200
        await resp.read()
        assert f"Bearer {SECRET}" in up.last.raw.decode("latin-1")  # the secret did travel, in the call
    await client.close()
    return observer, org


async def test_trace_plugins_logs_each_hook_call_with_its_plugin_and_time(make_app, aiohttp_client, caplog):
    caplog.set_level(logging.DEBUG)
    observer, org = await _one_call_with_a_secret(make_app, aiohttp_client, trace_plugins=True)
    assert observer.seen == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "treg.plugins.trace"]
    parsed = [TRACE.match(line) for line in lines]
    assert all(parsed), [line for line, m in zip(lines, parsed) if not m]
    calls = {(m[1], m[2], m[3]) for m in parsed if m}
    # start-up's registration hooks, each plugin's own line
    assert ("treg_register_injectors", "injectors", "returned") in calls
    assert ("treg_register_providers", "providers-github", "returned") in calls
    assert ("treg_register_aggregators", "aggregator-monid", "returned") in calls
    assert ("treg_register_capacity_signatures", "capacity-generic", "returned") in calls
    # the call's event: the observer that returned, the one that raised (contained, its type only)
    assert ("treg_event", "trace-observer", "returned") in calls
    assert ("treg_event", "failing-observer", "raised RuntimeError") in calls
    # nothing of the call's values in any line of the plugins' loggers (the trace, the contained failure):
    # the secret, the token, the tool, the path, the query
    mine = "\n".join(r.getMessage() for r in caplog.records if r.name.startswith("treg.plugins"))
    for value in (SECRET, org["token"], "traced-tool", "private/path", "hidden-query"):
        assert value not in mine


async def test_without_the_setting_no_hook_call_is_traced(make_app, aiohttp_client, caplog):
    caplog.set_level(logging.DEBUG)
    observer, _ = await _one_call_with_a_secret(make_app, aiohttp_client)
    assert observer.seen == 1
    assert not [r for r in caplog.records if r.name == "treg.plugins.trace"]


def test_every_hook_call_goes_through_the_one_caller():
    """No module but treg/plugins.py reaches pluggy's hook relay (``pm.hook.<name>(...)``) or an
    implementation's function: call_hook is the only caller, so the trace and the policies see every call."""
    root = Path(treg.startup.__file__).resolve().parent.parent
    relay = re.compile(r"\.hook\.\w|\.hook\b\s*,|getattr\([^)]*\.hook\b|\.function\(")
    offenders = []
    for folder in ("treg", "plugins"):
        for path in sorted((root / folder).rglob("*.py")):
            if path == root / "treg" / "plugins.py" or "testing" in path.parts:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if relay.search(line):
                    offenders.append(f"{path.relative_to(root)}:{n}: {line.strip()}")
    assert offenders == []
    text = (root / "treg" / "plugins.py").read_text()
    assert text.count(".function(") == 1  # in call_hook
