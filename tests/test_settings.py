"""Settings: the environment wins over the TOML file, bad values are ConfigErrors naming the variable,
secrets are masked, and the README's settings table lists every variable of ``treg.settings.table()``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from treg.errors import ConfigError
from treg.settings import SecretStr, load, table

ROOT = Path(__file__).resolve().parent.parent


def test_defaults(tmp_path):
    s = load({"TREG_HOME": str(tmp_path)})
    assert s.home == tmp_path and s.pg_dir == tmp_path / "pg"
    assert s.database_url is None and s.secret_key is None
    assert s.proxy_ssrf_check is True and s.ssrf_allow == () and s.dns_nameservers == ()
    assert s.plugins_dir is None and (s.host, s.port) == ("127.0.0.1", 8080)
    assert load({}).home == Path("~/.local/share/treg").expanduser()


def test_env_wins_over_the_config_file(tmp_path):
    (tmp_path / "treg.toml").write_text('port = 9000\nlog_level = "DEBUG"\nTREG_SSRF_ALLOW = ["10.0.0.0/8"]\n'
                                        'proxy_ssrf_check = false\nplatform_key_acme = "pk_file"\n')
    from_file = load({"TREG_HOME": str(tmp_path)})
    assert (from_file.port, from_file.log_level, from_file.ssrf_allow, from_file.proxy_ssrf_check) == (
        9000, "DEBUG", ("10.0.0.0/8",), False)
    assert from_file.platform_value("platform_key_acme".replace("platform_", "")) is None
    assert from_file.platform_value("TREG_PLATFORM_KEY_ACME") == SecretStr("pk_file")
    both = load({"TREG_HOME": str(tmp_path), "TREG_PORT": "9100", "TREG_PROXY_SSRF_CHECK": "1",
                 "TREG_PLATFORM_KEY_ACME": "pk_env"})
    assert (both.port, both.log_level, both.proxy_ssrf_check) == (9100, "DEBUG", True)
    assert both.platform_value("treg_platform_key_acme") == SecretStr("pk_env")


def test_config_file_from_treg_config(tmp_path):
    cfg = tmp_path / "elsewhere.toml"
    cfg.write_text("db_pool_max = 3\n")
    assert load({"TREG_HOME": str(tmp_path / "home"), "TREG_CONFIG": str(cfg)}).db_pool_max == 3


@pytest.mark.parametrize("env,value,expected", [
    ("TREG_PROXY_SSRF_CHECK", "0", False), ("TREG_PROXY_SSRF_CHECK", "false", False),
    ("TREG_PROXY_SSRF_CHECK", "1", True), ("TREG_PROXY_SSRF_CHECK", "yes", True),
    ("TREG_SSRF_ALLOW", "127.0.0.0/8, ::1/128,", ("127.0.0.0/8", "::1/128")),
    ("TREG_DNS_NAMESERVERS", "127.0.0.1:5353,9.9.9.9", ("127.0.0.1:5353", "9.9.9.9")),
    ("TREG_DB_TIMEOUT_S", "2.5", 2.5), ("TREG_PORT", "0", 0),
])
def test_values_are_converted(tmp_path, env, value, expected):
    s = load({"TREG_HOME": str(tmp_path), env: value})
    field = {"TREG_PROXY_SSRF_CHECK": "proxy_ssrf_check", "TREG_SSRF_ALLOW": "ssrf_allow",
             "TREG_DNS_NAMESERVERS": "dns_nameservers", "TREG_DB_TIMEOUT_S": "db_timeout_s", "TREG_PORT": "port"}[env]
    assert getattr(s, field) == expected


@pytest.mark.parametrize("value,origin,prefix", [
    ("https://gw.example.com/treg", "https://gw.example.com", "/treg"),
    ("https://GW.example.com:443/treg/", "https://gw.example.com", "/treg"),
    ("http://127.0.0.1:8080", "http://127.0.0.1:8080", ""), ("https://gw.example.com/", "https://gw.example.com", ""),
    ("https://gw.example.com/a/b%20c", "https://gw.example.com", "/a/b%20c"),
])
def test_public_url_gives_treg_its_origin_and_path_prefix(tmp_path, value, origin, prefix):
    from treg.origin import path_prefix, public_origin

    s = load({"TREG_HOME": str(tmp_path), "TREG_PUBLIC_URL": value})
    assert (public_origin(s), path_prefix(s)) == (origin, prefix)
    unset = load({"TREG_HOME": str(tmp_path)})
    assert (public_origin(unset), path_prefix(unset)) == (None, "")


def test_empty_values_mean_unset(tmp_path):
    s = load({"TREG_HOME": str(tmp_path), "TREG_DATABASE_URL": "", "TREG_SECRET_KEY": "", "TREG_PLUGINS_DIR": "",
              "TREG_PLATFORM_KEY_X": ""})
    assert s.database_url is None and s.secret_key is None and s.plugins_dir is None and s.platform == {}


@pytest.mark.parametrize("env,value", [
    ("TREG_PORT", "eighty"), ("TREG_PROXY_SSRF_CHECK", "maybe"), ("TREG_SSRF_ALLOW", "not-a-cidr"),
    ("TREG_SSRF_ALLOW", "10.0.0.0/33"), ("TREG_DB_TIMEOUT_S", "soon"), ("TREG_DB_POOL_MAX", "1.5"),
    ("TREG_PUBLIC_URL", "gw.example.com/treg"), ("TREG_PUBLIC_URL", "ftp://gw.example.com"),
    ("TREG_PUBLIC_URL", "https://gw.example.com/t?x=1"), ("TREG_PUBLIC_URL", "https://u:p@gw.example.com"),
    ("TREG_PUBLIC_URL", "https://gw.example.com//treg"), ("TREG_PUBLIC_URL", "https://gw.example.com/a b"),
])
def test_bad_env_values_are_config_errors(tmp_path, env, value):
    with pytest.raises(ConfigError) as info:
        load({"TREG_HOME": str(tmp_path), env: value})
    assert info.value.code == "bad_setting" and env in info.value.detail


@pytest.mark.parametrize("text", ["port = ", "colour = 'red'\n", "port = 'eighty'\n"])
def test_bad_config_files_are_config_errors(tmp_path, text):
    (tmp_path / "treg.toml").write_text(text)
    with pytest.raises(ConfigError) as info:
        load({"TREG_HOME": str(tmp_path)})
    assert "treg.toml" in info.value.detail or "TREG_PORT" in info.value.detail


def test_secret_str_is_masked(tmp_path):
    s = SecretStr("hunter2-very-secret")
    assert "hunter2" not in repr(s) and "hunter2" not in str(s) and "hunter2" not in f"{s}" and "hunter2" not in "%s" % s
    assert s.reveal() == "hunter2-very-secret" and s == SecretStr("hunter2-very-secret") and s
    settings = load({"TREG_HOME": str(tmp_path), "TREG_DATABASE_URL": "postgresql://u:dbpass-xyz@h/db",
                     "TREG_SECRET_KEY": "masterkey-xyz", "TREG_PLATFORM_KEY_ACME": "platform-xyz"})
    text = repr(settings) + str(settings)
    for secret in ("dbpass-xyz", "masterkey-xyz", "platform-xyz"):
        assert secret not in text
    assert settings.database_url.reveal() == "postgresql://u:dbpass-xyz@h/db"


def test_table_rows():
    rows = table()
    envs = [r[0] for r in rows]
    assert len(envs) == len(set(envs))
    for required in ("TREG_HOME", "TREG_DATABASE_URL", "TREG_SECRET_KEY", "TREG_PROXY_SSRF_CHECK", "TREG_SSRF_ALLOW",
                     "TREG_DNS_NAMESERVERS", "TREG_PLUGINS_DIR"):
        assert required in envs
    assert all(env.startswith("TREG_") and help_ for env, _, _, help_ in rows)


def test_readme_lists_every_setting():
    readme = (ROOT / "README.md").read_text()
    missing = [env for env, *_ in table() if not re.search(rf"^\|\s*`{re.escape(env)}`", readme, re.M)]
    assert missing == [], f"README.md settings table lacks {missing} (regenerate it from treg.settings.table())"


def test_readme_commands_match_ci():
    readme = (ROOT / "README.md").read_text()
    serve = "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/treg serve"
    test = "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/pytest"
    assert serve in readme and test in readme
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert test in ci  # CI runs the README's test command exactly as written (then its own extra checks)
