"""The one hook caller (treg.plugins.call_hook): pluggy's calling convention, each hook's declared
failure policy (contained observers, fail-closed registration), wrappers refused at load time, and the
startup check that the built-in injector locations are served."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from treg import hookimpl, hookspecs, membership, plugins
from treg.errors import ConfigError
from treg.keys import SERVICES
from treg.testing import Events, Gateway, raw_upstream


def test_every_hook_declares_its_policy_once():
    specced = sorted(n for n in dir(hookspecs) if hasattr(getattr(hookspecs, n), "treg_spec"))
    assert sorted(hookspecs.hook_names()) == specced and specced
    assert hookspecs.policy_of("treg_event") is hookspecs.CONTAINED
    assert hookspecs.policy_of("treg_spool_evidence_paths") is hookspecs.CONTAINED
    assert hookspecs.policy_of("treg_register_injectors") is hookspecs.FAIL_CLOSED
    assert hookspecs.policy_of("treg_register_providers") is hookspecs.FAIL_CLOSED
    with pytest.raises(KeyError):
        hookspecs.policy_of("treg_no_such_hook")


@pytest.mark.parametrize("style", ["hookwrapper", "wrapper"])
def test_a_wrapper_implementation_is_refused_at_load_naming_the_plugin(style):
    class Timing:
        __name__ = "timing-plugin"

        @hookimpl(**{style: True})
        def treg_event(self, event: Any) -> Any:
            yield

    with pytest.raises(ConfigError) as info:
        plugins.create_manager(extra=[Timing()])
    assert info.value.code == "plugin_failed"
    assert "'timing-plugin'" in info.value.detail and "treg_event" in info.value.detail
    assert "wrapper" in info.value.detail


def test_arguments_go_by_name_and_an_impl_may_take_a_subset():
    class NoArgs:
        @hookimpl
        def treg_spool_evidence_paths(self) -> list[str]:  # pluggy allows a subset of the spec's args
            return ["candidates"]

    class Named:
        def __init__(self) -> None:
            self.seen: list[Any] = []

        @hookimpl
        def treg_spool_evidence_paths(self, endpoint: Any) -> list[Any]:
            self.seen.append(endpoint)
            return ["choices", 7]  # a non-string path is ignored

    named = Named()
    pm = plugins.create_manager(extra=[NoArgs(), named])
    assert sorted(plugins.spool_evidence_paths(pm, endpoint="the-endpoint")) == ["candidates", "choices"]
    assert named.seen == ["the-endpoint"]
    with pytest.raises(TypeError):  # a treg bug, not a plugin's: the spec's arguments are required
        plugins.call_hook(pm, "treg_spool_evidence_paths")


def test_tryfirst_and_trylast_order_the_calls():
    order: list[str] = []

    def make(name: str, **opts: bool) -> Any:
        class P:
            __name__ = name

            @hookimpl(**opts)
            def treg_event(self, event: Any) -> None:
                order.append(name)
        return P()

    pm = plugins.create_manager(extra=[make("last", trylast=True), make("plain"), make("first", tryfirst=True)])
    results = plugins.call_hook(pm, "treg_event", event=object())
    assert order == ["first", "plain", "last"]
    assert [r.plugin for r in results] == order and results[-1].trylast


def test_a_fail_closed_hook_raises_naming_the_plugin():
    class Broken:
        __name__ = "licensed"

        @hookimpl
        def treg_register_injectors(self) -> list[Any]:
            raise RuntimeError("cannot reach the license server")

    pm = plugins.create_manager(extra=[Broken()])
    with pytest.raises(plugins.PluginFailed) as info:
        plugins.call_hook(pm, "treg_register_injectors")
    assert info.value.plugin == "licensed" and info.value.code == "plugin_failed"
    assert "'licensed'" in info.value.detail and "treg_register_injectors" in info.value.detail
    assert isinstance(info.value.__cause__, RuntimeError)


def test_missing_builtin_injectors_stop_startup_naming_them(monkeypatch):
    without = [(b, ep) for b, ep in plugins._entry_points() if ep.name != plugins.BUILTIN_INJECTORS]
    monkeypatch.setattr(plugins, "_entry_points", lambda: without)
    pm = plugins.create_manager()
    with pytest.raises(ConfigError) as info:
        plugins.collect_injectors(pm)
    assert info.value.code == "plugin_missing"
    for loc in ("'header'", "'query'", "'json'", "'injectors'"):
        assert loc in info.value.detail


def test_a_plugin_replacing_every_builtin_location_is_enough(monkeypatch):
    class Any3:
        def __init__(self, location: str) -> None:
            self.location = location
            self.needs_json_body = location == "json"

        def validate(self, binding: Any) -> None:
            pass

        def inject(self, request: Any, binding: Any, value: str) -> None:
            pass

    class Replacement:
        @hookimpl
        def treg_register_injectors(self) -> list[Any]:
            return [Any3("header"), Any3("query"), Any3("json")]

    without = [(b, ep) for b, ep in plugins._entry_points() if ep.name != plugins.BUILTIN_INJECTORS]
    monkeypatch.setattr(plugins, "_entry_points", lambda: without)
    assert set(plugins.collect_injectors(plugins.create_manager(extra=[Replacement()]))) == {"header", "query", "json"}


class Leaky:
    """An observer whose exception message carries the event's values."""

    __name__ = "leaky-observer"

    @hookimpl
    def treg_event(self, event: Any) -> None:
        raise ValueError(f"cannot export {event.props['call_id']} of tool {event.props['tool_name']}")


async def test_a_failing_observer_is_logged_once_without_the_event(aiohttp_client, make_app, caplog):
    caplog.set_level(logging.DEBUG)
    rec = Events()
    client = await aiohttp_client(make_app(extra_plugins=(Leaky(), rec), ssrf_allow=("127.0.0.0/8",)))
    svc = client.app[SERVICES]
    org = await membership.create_org(svc, slug="acme", email="o@acme.test")
    gw = Gateway(client, org)
    async with raw_upstream() as up:
        await gw.tool("tool-name-xyz", up.url)
        ids = []
        for i in range(3):
            resp = await gw.call("GET", f"/call/tool-name-xyz/{i}")
            assert resp.status == 200  # the observer's failure never reaches the caller
            ids.append(resp.headers["X-Treg-Call-Id"])
    assert [e.props["call_id"] for e in rec.seen] == ids  # the other observer still saw every event
    mine = [r for r in caplog.records if r.name == "treg.plugins"]
    assert len(mine) == 1, [r.getMessage() for r in mine]
    text = mine[0].getMessage()
    assert "'leaky-observer'" in text and "treg_event" in text and "ValueError" in text
    # the record (message and the stack in it) names the plugin, never the values the exception carried
    assert "tool-name-xyz" not in text and not any(i in text for i in ids) and mine[0].exc_info is None
    assert plugins.contained_failures(svc.pm) == {("leaky-observer", "treg_event", "ValueError"): 3}
    await client.close()
