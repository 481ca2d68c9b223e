"""Settings: one declarative table, read from the environment (a TOML file may add to it).

Each field of :class:`Settings` is one row of the table: its environment variable, type, default and
help live in the field's metadata. ``treg settings`` and the README table are generated from it.
The environment wins over the config file (``$TREG_CONFIG`` or ``$TREG_HOME/treg.toml``).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from treg import origin
from treg.http_grammar import TOKEN
from treg.errors import ConfigError


class SecretStr:
    """A string whose repr and str are masked, so it cannot reach a log by accident."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "SecretStr('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SecretStr) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __bool__(self) -> bool:
        return bool(self._value)


#: an aggregator's daily budget when ``TREG_OVERFLOW_DAILY_BUDGET_MICRO_<NAME>`` is unset (USD 10)
OVERFLOW_DAILY_BUDGET_MICRO = 10_000_000


def prefixed_name(name: str) -> str:
    """How a name (aggregator, provider) is spelled in a prefixed variable: upper-case, ``-`` → ``_``."""
    return name.upper().replace("-", "_")


def _setting(env: str, default: Any, help: str, kind: str = "str") -> Any:
    meta = {"env": env, "help": help, "kind": kind}
    if isinstance(default, (list, tuple, dict)):
        return field(default_factory=lambda d=default: type(d)(d), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Settings:
    home: Path = _setting("TREG_HOME", Path("~/.local/share/treg"), "data folder: everything treg writes", "path")
    database_url: SecretStr | None = _setting(
        "TREG_DATABASE_URL", None,
        "`postgresql://…` of an existing server; unset: an embedded PostgreSQL under `$TREG_HOME/pg`", "secret")
    secret_key: SecretStr | None = _setting(
        "TREG_SECRET_KEY", None,
        "master key for secrets at rest (urlsafe base64, 32 bytes); unset: generated once into "
        "`$TREG_HOME/secret.key` (mode 0600)", "secret")
    proxy_ssrf_check: bool = _setting("TREG_PROXY_SSRF_CHECK", True, "`1`/`0`: refuse internal upstream addresses", "bool")
    ssrf_allow: tuple[str, ...] = _setting(
        "TREG_SSRF_ALLOW", (), "comma-separated CIDRs exempt from the SSRF guard (local development, tests)", "cidrs")
    dns_nameservers: tuple[str, ...] = _setting(
        "TREG_DNS_NAMESERVERS", (), "comma-separated `ip` or `ip:port` the upstream resolver asks instead of the system's",
        "list")
    plugins_dir: Path | None = _setting("TREG_PLUGINS_DIR", None, "a folder whose `*.py` files are loaded as plugins", "path")
    trace_plugins: bool = _setting(
        "TREG_TRACE_PLUGINS", False, "`1`: log every plugin hook call with its plugin and time (never its values)",
        "bool")
    host: str = _setting("TREG_HOST", "127.0.0.1", "address `treg serve` listens on")
    port: int = _setting("TREG_PORT", 8080, "port `treg serve` listens on", "int")
    log_level: str = _setting("TREG_LOG_LEVEL", "INFO", "logging level (DEBUG, INFO, WARNING, ERROR)")
    log_format: str = _setting(
        "TREG_LOG_FORMAT", "text",
        "`text` or `json` (every stderr line one JSON object: `ts`, `level`, `logger`, `msg`; access lines add "
        "the call's fields)")
    shutdown_grace_s: float = _setting(
        "TREG_SHUTDOWN_GRACE_S", 30.0,
        "on SIGTERM, seconds calls in flight (streams included) may take to finish before they are cut "
        "(and audited as cancelled)", "float")
    db_pool_min: int = _setting("TREG_DB_POOL_MIN", 1, "database pool: connections kept open", "int")
    db_pool_max: int = _setting("TREG_DB_POOL_MAX", 10, "database pool: most connections at once", "int")
    db_statement_connections: int = _setting(
        "TREG_DB_STATEMENT_CONNECTIONS", 4, "connections of their own, beside the pool, for the one-statement round "
        "trips of the hot path (a money hold, hold closes, an audit batch); opened when first needed", "int")
    db_timeout_s: float = _setting("TREG_DB_TIMEOUT_S", 10.0, "seconds to wait for a pooled connection", "float")
    upstream_connect_timeout_s: float = _setting(
        "TREG_UPSTREAM_CONNECT_TIMEOUT_S", 10.0, "seconds to connect to an upstream", "float")
    upstream_read_timeout_s: float = _setting(
        "TREG_UPSTREAM_READ_TIMEOUT_S", 300.0, "seconds an upstream may stay silent mid-answer", "float")
    upstream_pool_size: int = _setting("TREG_UPSTREAM_POOL_SIZE", 256, "most upstream connections at once", "int")
    redirect_ttl_s: int = _setting(
        "TREG_REDIRECT_TTL_S", 300,
        "seconds a `/redirect/…` link (a relayed redirect to another host) stays valid, for the member who got it",
        "int")
    body_decode_max_bytes: int = _setting(
        "TREG_BODY_DECODE_MAX_BYTES", 16 * 1024 * 1024,
        "largest body `X-Treg-Body-Encoding` may decode to (and largest encoded body accepted)", "int")
    json_body_max_bytes: int = _setting(
        "TREG_JSON_BODY_MAX_BYTES", 16 * 1024 * 1024, "largest body a JSON binding buffers", "int")
    deny_body_max_bytes: int = _setting(
        "TREG_DENY_BODY_MAX_BYTES", 1024 * 1024,
        "largest streamed form, multipart or JSON body the deny check reads for a `_method` field when a "
        "method rule could otherwise apply; a larger one is refused (`deny_body_uninspectable`)", "int")
    evidence_retention_days: int = _setting(
        "TREG_EVIDENCE_RETENTION_DAYS", 30, "failed-call evidence older than this is pruned", "int")
    cache_ttl_s: float = _setting(
        "TREG_CACHE_TTL_S", 30.0,
        "longest an in-process cache (tokens, tools, deny rules) may serve data another process changed "
        "when LISTEN/NOTIFY is unavailable", "float")
    audit_flush_ms: int = _setting("TREG_AUDIT_FLUSH_MS", 200, "audit rows are written in batches at most this late", "int")
    audit_queue_max: int = _setting(
        "TREG_AUDIT_QUEUE_MAX", 100_000,
        "audit rows kept in memory while the database cannot be reached (written once it is back); beyond "
        "it the oldest are dropped, and logged", "int")
    audit_close_s: float = _setting(
        "TREG_AUDIT_CLOSE_S", 5.0,
        "seconds a shutdown keeps trying to write the audit rows still queued while the database cannot be "
        "reached; what is left then is logged as lost", "float")
    tool_platform_settings: tuple[str, ...] = _setting(
        "TREG_TOOL_PLATFORM_SETTINGS", (),
        "`TREG_PLATFORM_*` names an org tool's binding may inject (`platform_setting`); the operator's opt-in, "
        "since the value goes to whatever host the tool targets", "list")
    anonymous_providers: tuple[str, ...] = _setting(
        "TREG_ANONYMOUS_PROVIDERS", (), "providers whose `platform_auth: anonymous` endpoints may be called keyless",
        "list")
    hold_ttl_s: int = _setting(
        "TREG_HOLD_TTL_S", 3600,
        "seconds a money hold (and an in-progress Idempotency-Key claim) may stay open before the reaper "
        "releases it in the caller's favour; must exceed the longest billed call", "int")
    money_lease_calls: int = _setting(
        "TREG_MONEY_LEASE_CALLS", 64,
        "calls' worth of credit a serving process leases at once (the first and smallest lease) for a busy (org, "
        "member, tag) on the platform tier, its calls' holds then taken from the lease without a round trip "
        "(docs/money.md \"Credit leases\"); 0: every hold placed by its own statement", "int")
    money_lease_max_calls: int = _setting(
        "TREG_MONEY_LEASE_MAX_CALLS", 1024,
        "the largest credit lease, in calls' worth: a key still busy when half its lease is spent has the next one "
        "placed ahead, sized for a quarter of TREG_MONEY_LEASE_S at its rate, from TREG_MONEY_LEASE_CALLS up to this "
        "(docs/money.md \"Credit leases\")", "int")
    money_lease_after: int = _setting(
        "TREG_MONEY_LEASE_AFTER", 16,
        "holds one (org, member, tag) places within a second before its calls take them from a credit lease", "int")
    money_lease_s: float = _setting(
        "TREG_MONEY_LEASE_S", 1.0,
        "seconds a credit lease serves new calls, at most a tenth of TREG_HOLD_TTL_S; then what is left of it is "
        "returned (how long a lease's credit may stay parked in one process)", "float")
    reaper_interval_s: float = _setting(
        "TREG_REAPER_INTERVAL_S", 60.0,
        "seconds between reaper runs (expired holds released, expired idempotency entries pruned); 0: only at "
        "startup", "float")
    trial_micro: int = _setting(
        "TREG_TRIAL_MICRO", 0,
        "free allowance (micro-USD) granted once to each org, the first time its account is touched", "int")
    metrics_token: SecretStr | None = _setting(
        "TREG_METRICS_TOKEN", None,
        "`GET /metrics` needs `Authorization: Bearer <this>`; unset: answered only to loopback addresses", "secret")
    public_url: str | None = _setting(
        "TREG_PUBLIC_URL", None, "the URL browsers and callers reach treg at (`https://gw.example.com/treg` behind "
        "a proxy): treg's own origin (the login's and MCP's Origin checks), the path prefix of the URLs it builds, "
        "and `Secure` on the session cookie when https; unset: `http://<listen address>:<port>`", "url")
    trusted_proxies: tuple[str, ...] = _setting(
        "TREG_TRUSTED_PROXIES", (), "comma-separated addresses or CIDRs of reverse proxies whose `X-Forwarded-For` "
        "and `X-Forwarded-Proto` treg believes (the client address of the logs and of the public demo's hourly "
        "limit); from any other peer they are ignored", "cidrs")
    host_cookies: tuple[str, ...] = _setting(
        "TREG_HOST_COOKIES", (), "comma-separated names of cookies that belong to treg's host, not to an upstream "
        "(a login proxy's in front of treg), taken out of every caller's `Cookie` before it goes upstream, besides "
        "the built-in ones (docs/clients.md); a trailing `*` matches a prefix", "cookie_names")
    mcp_allowed_origins: tuple[str, ...] = _setting(
        "TREG_MCP_ALLOWED_ORIGINS", (), "comma-separated browser origins (`https://app.example`) allowed to POST "
        "to `/mcp` besides treg's own", "list")
    mcp_max_text_bytes: int = _setting(
        "TREG_MCP_MAX_TEXT_BYTES", 64 * 1024, "an MCP tool result's body is cut at this many bytes (saying so)", "int")
    # -- /table/ and the public demo (docs/sharing.md) ----------------------------------------------
    table_max_rows: int = _setting(
        "TREG_TABLE_MAX_ROWS", 10_000, "most rows a `/table/` answer carries; the rest are cut and the answer says "
        "`truncated: true` (CSV: `X-Treg-Table-Truncated: true`)", "int")
    demo_endpoints: tuple[str, ...] = _setting(
        "TREG_DEMO_ENDPOINTS", (), "comma-separated catalog endpoint ids a public demo's `demo`-scoped token may "
        "call (GET only, on the platform or anonymous tier); empty: none", "list")
    demo_calls_per_hour: int = _setting(
        "TREG_DEMO_CALLS_PER_HOUR", 20, "demo calls one client address may make in any sliding hour (refused calls "
        "do not count), across every process", "int")
    demo_daily_budget_micro: int = _setting(
        "TREG_DEMO_DAILY_BUDGET_MICRO", 1_000_000, "most a public demo org spends per UTC day (micro-USD), counted "
        "when a demo call's hold is placed: a demo call whose hold would pass it is refused", "int")
    # -- resilience of the platform tier (docs/resilience.md) --------------------------------------
    capacity_strike_gap_s: float = _setting(
        "TREG_CAPACITY_STRIKE_GAP_S", 15.0, "a second balance/quota strike counts only this many seconds after the "
        "first (a burst of concurrent failures is one strike)", "float")
    capacity_strike_window_s: float = _setting(
        "TREG_CAPACITY_STRIKE_WINDOW_S", 600.0, "two strikes within this many seconds (no 2xx between) lock the key",
        "float")
    capacity_max_hold_s: float = _setting(
        "TREG_CAPACITY_MAX_HOLD_S", 21600.0, "longest a capacity lock lasts, whatever reset the vendor stated", "float")
    capacity_guess_hold_s: float = _setting(
        "TREG_CAPACITY_GUESS_HOLD_S", 3600.0, "how long a capacity lock lasts when the vendor stated no reset", "float")
    capacity_probe_interval_s: float = _setting(
        "TREG_CAPACITY_PROBE_INTERVAL_S", 60.0, "while a key is locked, one real call per this many seconds per "
        "process goes through as a probe", "float")
    smoothing_max_wait_ms: int = _setting(
        "TREG_SMOOTHING_MAX_WAIT_MS", 2000, "longest the spacer delays a platform-tier call before it proceeds anyway",
        "int")
    smoothing_retry_max_s: float = _setting(
        "TREG_SMOOTHING_RETRY_MAX_S", 5.0, "a platform-tier GET/HEAD answered by a burst 429 with a Retry-After up to "
        "this is re-sent once", "float")
    overflow_mode: str = _setting(
        "TREG_OVERFLOW_MODE", "off", "`off`, `shadow` (call the aggregator, log it, relay the vendor's answer) or "
        "`on` (overflow to aggregators)", "choice:off,shadow,on")
    overflow_unhealthy_s: float = _setting(
        "TREG_OVERFLOW_UNHEALTHY_S", 900.0, "how long an aggregator (or one vendor through it) stays marked unhealthy",
        "float")
    overflow_poll_max_s: float = _setting(
        "TREG_OVERFLOW_POLL_MAX_S", 60.0, "longest treg polls an aggregator's asynchronous run (Monid's 202)", "float")
    #: ``TREG_OVERFLOW_KEY_<NAME>``: treg's key at each aggregator, by upper-case aggregator name
    overflow_keys: Mapping[str, SecretStr] = field(default_factory=dict, metadata={
        "env": "TREG_OVERFLOW_KEY_*", "kind": "prefixed:secret",
        "help": "treg's key at aggregator `<NAME>` (never logged); unset: that aggregator is skipped"})
    overflow_urls: Mapping[str, str] = field(default_factory=dict, metadata={
        "env": "TREG_OVERFLOW_URL_*", "kind": "prefixed:str",
        "help": "aggregator `<NAME>`'s base URL; unset: its public API"})
    overflow_budgets: Mapping[str, int] = field(default_factory=dict, metadata={
        "env": "TREG_OVERFLOW_DAILY_BUDGET_MICRO_*", "kind": "prefixed:int",
        "help": f"most treg spends at aggregator `<NAME>` per UTC day (micro-USD); unset: {10_000_000} (USD 10)"})
    # -- OAuth connections (docs/oauth.md) ---------------------------------------------------------
    oauth_connect_ttl_s: int = _setting(
        "TREG_OAUTH_CONNECT_TTL_S", 600, "seconds a connection's `connect_url` stays valid (single-use), and its "
        "`state` after the consent page's button was pressed", "int")
    oauth_refresh_skew_s: float = _setting(
        "TREG_OAUTH_REFRESH_SKEW_S", 60.0, "a call whose connection's access token expires within this many seconds "
        "refreshes it first", "float")
    oauth_refresh_lease_s: float = _setting(
        "TREG_OAUTH_REFRESH_LEASE_S", 30.0, "how long one process's refresh of a connection holds its PostgreSQL "
        "lease (the others wait at most this long for its new token); the token endpoint is given half of it",
        "float")
    #: ``TREG_OAUTH_CLIENT_ID_<PROVIDER>`` / ``TREG_OAUTH_CLIENT_SECRET_<PROVIDER>``: the deployment's OAuth app
    oauth_client_ids: Mapping[str, str] = field(default_factory=dict, metadata={
        "env": "TREG_OAUTH_CLIENT_ID_*", "kind": "prefixed:str",
        "help": "the deployment's OAuth client id at provider `<PROVIDER>` (upper-case, `-` → `_`), used by every "
                "org that registered no app of its own"})
    oauth_client_secrets: Mapping[str, SecretStr] = field(default_factory=dict, metadata={
        "env": "TREG_OAUTH_CLIENT_SECRET_*", "kind": "prefixed:secret",
        "help": "the deployment's OAuth client secret at provider `<PROVIDER>` (never logged)"})
    ui_session_ttl_s: int = _setting(
        "TREG_UI_SESSION_TTL_S", 12 * 3600, "seconds a dashboard login (`treg_session` cookie) stays valid", "int")
    # -- the archive of catalog answers (docs/lifecycle.md § Result classifiers and the archive) -----
    archive_max_bytes: int = _setting(
        "TREG_ARCHIVE_MAX_BYTES", 1024 * 1024, "largest catalog answer (bytes) the archive stores; a larger one is "
        "relayed and not stored", "int")
    archive_rollout_pct: int = _setting(
        "TREG_ARCHIVE_ROLLOUT_PCT", 100, "share (0-100) of (org, endpoint) pairs the archive serves and fills, "
        "picked by a stable hash; the others take the normal relay and money path", "int")
    archive_prune_interval_s: float = _setting(
        "TREG_ARCHIVE_PRUNE_INTERVAL_S", 300.0, "seconds between sweeps deleting expired archive entries (bounded "
        "batches); 0: only at startup", "float")
    # -- hub tools (docs/sharing.md "Hub") -----------------------------------------------------------
    hub_max_runs_per_team: int = _setting(
        "TREG_HUB_MAX_RUNS_PER_TEAM", 4, "most hub calls of one publishing org's tools running at once, across every "
        "process; one more is 429 `hub_busy` (never queued)", "int")
    hub_lease_s: float = _setting(
        "TREG_HUB_LEASE_S", 30.0, "a hub call's slot is a PostgreSQL lease of this many seconds, renewed by its "
        "process every third of it while the call runs: the slots of a process that died are free again within "
        "it", "float")
    #: ``TREG_PLATFORM_*`` values (platform keys and platform-setting bindings), by upper-case name.
    platform: Mapping[str, SecretStr] = field(default_factory=dict, metadata={"env": "TREG_PLATFORM_*", "kind": "platform",
        "help": "treg's own credentials: `TREG_PLATFORM_KEY_<PROVIDER>` (tier 4) and values platform-setting "
                "bindings name"})

    # -- derived -------------------------------------------------------------------------------
    @property
    def pg_dir(self) -> Path:
        return self.home / "pg"

    def platform_value(self, name: str) -> SecretStr | None:
        return self.platform.get(name.upper())

    def overflow_key(self, aggregator: str) -> SecretStr | None:
        return self.overflow_keys.get(prefixed_name(aggregator))

    def overflow_url(self, aggregator: str, default: str) -> str:
        return self.overflow_urls.get(prefixed_name(aggregator)) or default

    def overflow_budget_micro(self, aggregator: str) -> int:
        return self.overflow_budgets.get(prefixed_name(aggregator), OVERFLOW_DAILY_BUDGET_MICRO)

    def oauth_client(self, provider: str) -> tuple[str, SecretStr] | None:
        """The deployment's OAuth app at ``provider`` (``TREG_OAUTH_CLIENT_ID_<P>`` and
        ``TREG_OAUTH_CLIENT_SECRET_<P>``, both set), else None."""
        name = prefixed_name(provider)
        client_id, secret = self.oauth_client_ids.get(name), self.oauth_client_secrets.get(name)
        return (client_id, secret) if client_id and secret else None

    def replace(self, **changes: Any) -> "Settings":
        return dataclasses.replace(self, **changes)


def table() -> list[tuple[str, str, str, str]]:
    """(env, kind, default, help) rows: the settings table of the README and ``treg settings``."""
    rows = []
    for f in dataclasses.fields(Settings):
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        if isinstance(default, bool):
            default = "1" if default else "0"  # as the environment spells it
        elif isinstance(default, tuple):
            default = ",".join(default)
        rows.append((f.metadata["env"], f.metadata["kind"], "" if default in (None, {}) else str(default),
                     f.metadata["help"]))
    return rows


def markdown_table() -> str:
    """The README's settings table (``treg settings --markdown``)."""
    lines = ["| variable | meaning | default |", "| --- | --- | --- |"]
    for env, _, default, help_ in table():
        lines.append(f"| `{env}` | {help_} | {f'`{default}`' if default else '—'} |")
    return "\n".join(lines)


def _convert(name: str, kind: str, raw: Any) -> Any:
    try:
        if kind == "path":
            return Path(str(raw)).expanduser() if str(raw) else None
        if kind == "secret":
            return SecretStr(str(raw)) if str(raw) else None
        if kind == "url":  # treg's own public URL (treg/origin.py)
            return origin.check(str(raw)) if str(raw).strip() else None
        if kind == "bool":
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(f"expected 1/0, got {raw!r}")
        if kind == "int":
            return int(raw)
        if kind == "float":
            return float(raw)
        if kind.startswith("choice:"):
            choices = kind.partition(":")[2].split(",")
            text = str(raw).strip().lower()
            if text not in choices:
                raise ValueError(f"expected one of {', '.join(choices)}, got {raw!r}")
            return text
        if kind in ("list", "cidrs", "cookie_names"):
            items = raw if isinstance(raw, (list, tuple)) else str(raw).split(",")
            items = tuple(str(i).strip() for i in items if str(i).strip())
            if kind == "cidrs":
                for item in items:
                    ipaddress.ip_network(item, strict=False)
            if kind == "cookie_names":
                for item in items:  # a name (an RFC 9110 token), or a prefix and a trailing *
                    if not TOKEN.match(item.removesuffix("*")):
                        raise ValueError(f"{item!r} is not a cookie name (an RFC 9110 token: letters, digits "
                                         f"and the token's punctuation), nor one followed by * for a prefix")
            return items
        return str(raw)
    except ValueError as exc:
        raise ConfigError(f"setting {name}: {exc}", code="bad_setting") from exc


def load(environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Build the settings from a config file and the environment (the environment wins)."""
    env = dict(os.environ if environ is None else environ)
    fields = {f.metadata["env"]: f for f in dataclasses.fields(Settings)
              if f.metadata["kind"] != "platform" and not f.metadata["kind"].startswith("prefixed:")}
    # TREG_OVERFLOW_KEY_<NAME> and its kin: one mapping per prefix, like TREG_PLATFORM_*
    prefixed = {f.metadata["env"][:-1]: f for f in dataclasses.fields(Settings)
                if f.metadata["kind"].startswith("prefixed:")}
    prefixed_values: dict[str, dict[str, Any]] = {f.name: {} for f in prefixed.values()}

    def take_prefixed(env_name: str, raw: Any) -> bool:
        for prefix, f in prefixed.items():
            if env_name.startswith(prefix) and len(env_name) > len(prefix):
                if str(raw):
                    prefixed_values[f.name][env_name[len(prefix):]] = _convert(
                        env_name, f.metadata["kind"].partition(":")[2], raw)
                return True
        return False

    home = Path(env.get("TREG_HOME") or "~/.local/share/treg").expanduser()
    config_path = Path(env["TREG_CONFIG"]).expanduser() if env.get("TREG_CONFIG") else home / "treg.toml"
    values: dict[str, Any] = {}
    platform: dict[str, SecretStr] = {}
    if config_path.is_file():
        try:
            data = tomllib.loads(config_path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"config file {config_path}: {exc}", code="bad_config") from exc
        for key, raw in data.items():
            env_name = key.upper() if key.upper().startswith("TREG_") else "TREG_" + key.upper()
            if env_name.startswith("TREG_PLATFORM_"):
                platform[env_name] = SecretStr(str(raw))
            elif take_prefixed(env_name, raw):
                pass
            elif env_name in fields:
                values[fields[env_name].name] = _convert(env_name, fields[env_name].metadata["kind"], raw)
            else:
                raise ConfigError(f"config file {config_path}: unknown setting {key!r}", code="bad_config")
    for env_name, f in fields.items():
        if env_name in env:
            values[f.name] = _convert(env_name, f.metadata["kind"], env[env_name])
    for key, raw in env.items():
        if key.startswith("TREG_PLATFORM_") and raw:
            platform[key] = SecretStr(raw)
        elif key not in fields:
            take_prefixed(key, raw)
    values["home"] = values.get("home") or home
    values["platform"] = platform
    values.update(prefixed_values)
    values.update(overrides)
    return Settings(**values)
