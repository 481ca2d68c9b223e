"""Settings for a treg under test: a fresh secret key, short cache and audit intervals, and a short
shutdown wait for an unreachable database (a test's database may be dropped before its app closes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from treg.infra import crypto
from treg.settings import SecretStr, Settings, load


def make_settings(home: Path, **overrides: Any) -> Settings:
    base = load(environ={"TREG_HOME": str(home)})
    values: dict[str, Any] = {"secret_key": SecretStr(crypto.new_key_text()), "cache_ttl_s": 30.0,
                              "audit_flush_ms": 20, "audit_close_s": 0.5}
    values.update(overrides)
    return base.replace(**values)
