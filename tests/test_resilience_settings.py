"""The resilience settings: per-aggregator prefixed variables (like TREG_PLATFORM_*) and the mode."""

from __future__ import annotations

import pytest

from treg import settings as settings_mod
from treg.errors import ConfigError


def test_prefixed_overflow_settings_from_env_and_config_file(tmp_path):
    (tmp_path / "treg.toml").write_text('overflow_url_monid = "https://monid.internal"\n'
                                        'overflow_daily_budget_micro_monid = 5000\n')
    s = settings_mod.load({"TREG_HOME": str(tmp_path), "TREG_OVERFLOW_KEY_ORTHOGONAL": "sk-o",
                           "TREG_OVERFLOW_DAILY_BUDGET_MICRO_MY_AGG": "77", "TREG_OVERFLOW_UNHEALTHY_S": "30",
                           "TREG_OVERFLOW_MODE": "Shadow"})
    assert s.overflow_key("orthogonal").reveal() == "sk-o" and s.overflow_key("monid") is None
    assert "sk-o" not in repr(s)
    assert s.overflow_url("monid", "https://default") == "https://monid.internal"
    assert s.overflow_url("orthogonal", "https://default") == "https://default"
    assert s.overflow_budget_micro("monid") == 5000 and s.overflow_budget_micro("my-agg") == 77
    assert s.overflow_budget_micro("orthogonal") == settings_mod.OVERFLOW_DAILY_BUDGET_MICRO
    assert s.overflow_unhealthy_s == 30 and s.overflow_mode == "shadow"


def test_bad_values_stop_startup(tmp_path):
    with pytest.raises(ConfigError, match="TREG_OVERFLOW_MODE"):
        settings_mod.load({"TREG_HOME": str(tmp_path), "TREG_OVERFLOW_MODE": "maybe"})
    with pytest.raises(ConfigError, match="TREG_OVERFLOW_DAILY_BUDGET_MICRO_MONID"):
        settings_mod.load({"TREG_HOME": str(tmp_path), "TREG_OVERFLOW_DAILY_BUDGET_MICRO_MONID": "lots"})


def test_every_resilience_setting_of_the_contract_is_in_the_table():
    envs = {row[0] for row in settings_mod.table()}
    assert {"TREG_CAPACITY_STRIKE_GAP_S", "TREG_CAPACITY_STRIKE_WINDOW_S", "TREG_CAPACITY_MAX_HOLD_S",
            "TREG_CAPACITY_GUESS_HOLD_S", "TREG_CAPACITY_PROBE_INTERVAL_S", "TREG_SMOOTHING_MAX_WAIT_MS",
            "TREG_SMOOTHING_RETRY_MAX_S", "TREG_OVERFLOW_MODE", "TREG_OVERFLOW_KEY_*", "TREG_OVERFLOW_URL_*",
            "TREG_OVERFLOW_DAILY_BUDGET_MICRO_*", "TREG_OVERFLOW_UNHEALTHY_S", "TREG_OVERFLOW_POLL_MAX_S"} <= envs
    defaults = {row[0]: row[2] for row in settings_mod.table()}
    assert (defaults["TREG_CAPACITY_STRIKE_GAP_S"], defaults["TREG_CAPACITY_MAX_HOLD_S"],
            defaults["TREG_SMOOTHING_MAX_WAIT_MS"], defaults["TREG_OVERFLOW_MODE"]) == ("15.0", "21600.0", "2000", "off")
