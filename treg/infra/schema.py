"""The schema as SQLAlchemy Core tables. Every change here comes with an alembic migration."""

from __future__ import annotations

from sqlalchemy import (BigInteger, Boolean, CheckConstraint, Column, Date, DateTime, ForeignKey, Index, Integer,
                        LargeBinary, MetaData, PrimaryKeyConstraint, String, Table, Text, UniqueConstraint, func, text)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

#: the largest value a ``BigInteger`` column (PostgreSQL's bigint) holds: what a caller or a vendor says
#: (a declared length, a usage figure) is bounded by it before a statement carries it
BIGINT_MAX = 2**63 - 1
#: the largest value an ``Integer`` column (PostgreSQL's integer) holds: a call's duration in ms saturates
#: at it (24.8 days; a stream may stay open that long), since a row beyond it is refused whole
INT_MAX = 2**31 - 1
#: the longest method the audit row stores (``calls.method``, ``deny_rules.method``): longer than any method
#: llhttp, aiohttp's default parser, accepts; its pure-Python parser takes any token, and treg refuses the
#: longer ones at its edge (``invalid_method``) rather than relay a call whose row cannot be written
METHOD_MAX = 16

metadata = MetaData(naming_convention={
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
})


def _created() -> Column:
    return Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now())


orgs = Table(
    "orgs", metadata,
    Column("id", String(40), primary_key=True),
    Column("slug", String(64), nullable=False, unique=True),
    _created(),
    # false: the org opted out of overflow to aggregators (PATCH /api/v1/org, migration 0006)
    Column("platform_overflow", Boolean, nullable=False, server_default=text("true")),
    # true: the operator runs this org as a public demo (`treg demo enable`, migration 0018); while false,
    # its demo-scoped tokens answer 403 demo_disabled
    Column("public_demo", Boolean, nullable=False, server_default=text("false")),
)

users = Table(
    "users", metadata,
    Column("id", String(40), primary_key=True),
    Column("email", String(320), nullable=False, unique=True),  # stored lower-cased
    _created(),
)

projects = Table(
    "projects", metadata,
    Column("id", String(40), primary_key=True),
    Column("org_id", String(40), ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    Column("name", String(200), nullable=False),
    _created(),
    UniqueConstraint("org_id", "name"),
)

members = Table(
    "members", metadata,
    Column("id", String(40), primary_key=True),
    Column("org_id", String(40), ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    Column("user_id", String(40), ForeignKey("users.id", ondelete="CASCADE"), nullable=False),
    Column("role", String(16), nullable=False),
    # NULL: every project of the org; else the member's project scope.
    Column("project_ids", ARRAY(String(40)), nullable=True),
    _created(),
    # the member's cap on calls a UTC day, any tier, billed or not (NULL: none; docs/money.md "Call caps");
    # read with the identity, so a member without one costs no query (migration 0017)
    Column("calls_per_day", Integer, nullable=True),
    UniqueConstraint("org_id", "user_id"),
)

tokens = Table(
    "tokens", metadata,
    Column("id", String(40), primary_key=True),
    Column("member_id", String(40), ForeignKey("members.id", ondelete="CASCADE"), nullable=False),
    Column("org_id", String(40), ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    # sha256 of the token: a token is random (256 bits), so a fast hash is enough and lookups stay indexed.
    Column("token_hash", String(64), nullable=False, unique=True),
    Column("prefix", String(16), nullable=False),
    _created(),
    Column("last_used_at", DateTime(timezone=True), nullable=True),
    Column("revoked_at", DateTime(timezone=True), nullable=True),
    # what the token may do (migration 0018): `full` (every route its member may use), `table` (GETs of
    # /table/ only: a read-only token for spreadsheets), `demo` (the public demo's calls only)
    Column("scope", String(16), nullable=False, server_default=text("'full'")),
    CheckConstraint("scope IN ('full', 'table', 'demo')", name="scope"),
)

secrets = Table(
    "secrets", metadata,
    Column("id", String(40), primary_key=True),
    Column("org_id", String(40), ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    Column("name", String(200), nullable=False),
    Column("provider", String(64), nullable=True, index=True),
    # AES-256-GCM blob: version | key id | nonce | ciphertext+tag (see treg.infra.crypto)
    Column("blob", LargeBinary, nullable=False),
    Column("key_id", String(16), nullable=False),
    Column("is_json", Boolean, nullable=False, server_default=text("false")),
    _created(),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

tools = Table(
    "tools", metadata,
    Column("id", String(40), primary_key=True),
    Column("org_id", String(40), ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    Column("name", String(200), nullable=False),
    Column("base_url", Text, nullable=False),
    Column("host", String(300), nullable=False),  # netloc without user-info, lower-cased
    Column("bindings", JSONB, nullable=False),
    Column("project_id", String(40), ForeignKey("projects.id", ondelete="SET NULL"), nullable=True),
    Column("allowed_member_ids", ARRAY(String(40)), nullable=True),
    _created(),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    #: the whole base URL, sealed, when it carries user-info (``base_url`` then holds it masked)
    Column("base_url_sealed", LargeBinary, nullable=True),
    UniqueConstraint("org_id", "name"),
    Index("ix_tools_org_id_host", "org_id", "host"),
)

deny_rules = Table(
    "deny_rules", metadata,
    Column("id", String(40), primary_key=True),
    Column("org_id", String(40), ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False, index=True),
    Column("host", String(300), nullable=False),
    Column("path", Text, nullable=True),
    Column("method", String(METHOD_MAX), nullable=True),
    Column("member_id", String(40), ForeignKey("members.id", ondelete="CASCADE"), nullable=True),
    Column("project_id", String(40), ForeignKey("projects.id", ondelete="CASCADE"), nullable=True),
    Column("reason", Text, nullable=True),
    _created(),
)

calls = Table(
    "calls", metadata,
    # the key is (id, org_id): a hub call is one call id with two rows, the caller's org's and the
    # publishing org's (migration 0019, docs/sharing.md "Hub"); an overflow attempt's row is
    # `<call_id>:overflow` (0006)
    Column("id", String(64), nullable=False),
    Column("org_id", String(40), ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    Column("member_id", String(40), nullable=True),
    _created(),
    Column("surface", String(16), nullable=False),
    Column("method", String(METHOD_MAX), nullable=False),
    Column("target", Text, nullable=False),  # what the caller asked for (tool/path or URL), query stripped
    Column("upstream_url", Text, nullable=True),  # redacted
    Column("tool_id", String(40), nullable=True),
    Column("tool_name", String(200), nullable=True),
    Column("provider", String(300), nullable=True),
    Column("endpoint_id", String(200), nullable=True),
    Column("status", Integer, nullable=True),
    Column("outcome", String(32), nullable=False),
    Column("refused_by", String(32), nullable=True),
    Column("error_code", String(64), nullable=True),
    Column("blame", String(16), nullable=True),
    Column("credential_tier", String(32), nullable=True),  # `platform-overflow` (0006)
    Column("cost_micro", BigInteger, nullable=False, server_default=text("0")),
    Column("hold_state", String(16), nullable=True),
    Column("tag", String(200), nullable=True),
    Column("request_bytes", BigInteger, nullable=True),
    Column("response_bytes", BigInteger, nullable=True),
    Column("duration_ms", Integer, nullable=True),
    Column("ttfb_ms", Integer, nullable=True),
    Column("error_request", JSONB, nullable=True),
    Column("error_response", JSONB, nullable=True),
    # why treg itself failed when no error code says it (unexpected_exception, db_pool: the seed's exits)
    Column("failure_kind", String(32), nullable=True),
    # the call this one continues (a followed redirect, a routed endpoint's child)
    Column("parent_call_id", String(40), nullable=True),
    # the result classifier's verdict on a buffered 2xx (hit | miss | unknown) and what the archive did
    # (hit | stored | miss); NULL: no classifier, no archive (migration 0010)
    Column("result_state", String(16), nullable=True),
    Column("cache_state", String(16), nullable=True),
    # what kind of call: NULL an ordinary one; async_submit, async_poll, async_fetch (docs/lifecycle.md)
    Column("kind", String(16), nullable=True),
    # `overflow:<aggregator>` on an overflow attempt's row (migration 0006)
    Column("served_via", String(64), nullable=True),
    # the kind of credential injected (`oauth`, `secret`, `platform`; NULL: none) and, on `oauth`, the
    # connection whose token it was (migration 0016, docs/oauth.md)
    Column("credential_kind", String(16), nullable=True),
    Column("connection_id", String(40), nullable=True),
    # made with a `demo`-scoped token: the public demo gate admitted or refused it (migration 0018)
    Column("demo", Boolean, nullable=False, server_default=text("false")),
    # a hub call (migration 0019): the ref called (`<org-slug>.<name>`), on both rows; on the publishing
    # org's row the caller's org slug (never its member)
    Column("hub_ref", String(264), nullable=True),
    Column("hub_caller_org", String(64), nullable=True),
    # the credit lease the call's hold was taken from (migration 0020, docs/money.md "Credit leases"): the
    # reaper that releases a lease after a crash marks the calls whose close was never written
    Column("lease_id", String(200), nullable=True),
    PrimaryKeyConstraint("id", "org_id"),
    Index("ix_calls_org_id_created_at", "org_id", "created_at"),
    Index("ix_calls_org_id_member_id_created_at", "org_id", "member_id", "created_at"),
    # the dashboard's Activity filters (migration 0004)
    Index("ix_calls_org_id_outcome_created_at", "org_id", "outcome", "created_at"),
    Index("ix_calls_org_id_tool_name_created_at", "org_id", "tool_name", "created_at"),
    Index("ix_calls_org_id_created_at_upstream_failed", "org_id", "created_at",
          postgresql_where=text("blame = 'upstream'")),
    Index("ix_calls_lease_id", "lease_id", postgresql_where=text("lease_id IS NOT NULL")),
)

ui_sessions = Table(
    # the dashboard's sessions (treg/ui_sessions.py): the cookie holds a random id, the row its sha256
    "ui_sessions", metadata,
    Column("id_hash", String(64), primary_key=True),
    Column("org_id", String(40), ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    Column("member_id", String(40), ForeignKey("members.id", ondelete="CASCADE"), nullable=False),
    # the token the user logged in with: revoking it ends the session too
    Column("token_id", String(40), ForeignKey("tokens.id", ondelete="CASCADE"), nullable=False),
    Column("csrf", String(64), nullable=False),
    _created(),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("revoked_at", DateTime(timezone=True), nullable=True),
    Index("ix_ui_sessions_expires_at", "expires_at"),
)


# -- money (treg/money, docs/money.md) -----------------------------------------------------------------

org_balances = Table(
    # One row per org, updated in the same transaction as every hold/settle/release/grant: its row lock
    # serialises all money writes of the org, so two calls can never both spend the last credit.
    "org_balances", metadata,
    Column("org_id", String(40), ForeignKey("orgs.id", ondelete="CASCADE"), primary_key=True),
    Column("granted_micro", BigInteger, nullable=False, server_default=text("0")),  # grants + trial
    Column("settled_micro", BigInteger, nullable=False, server_default=text("0")),
    Column("held_micro", BigInteger, nullable=False, server_default=text("0")),  # sum of open holds
    Column("trial_micro", BigInteger, nullable=False, server_default=text("0")),  # the trial part of granted
    Column("daily_cap_micro", BigInteger, nullable=True),
    _created(),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("held_micro >= 0 AND settled_micro >= 0", name="non_negative"),
    CheckConstraint("granted_micro >= settled_micro + held_micro", name="covered"),
)

credit_grants = Table(
    "credit_grants", metadata,
    Column("id", String(40), primary_key=True),
    Column("org_id", String(40), ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    Column("kind", String(16), nullable=False),  # grant | trial | earning (a hub call's price, credited)
    Column("amount_micro", BigInteger, nullable=False),
    Column("actor", String(200), nullable=False),
    Column("note", Text, nullable=True),
    _created(),
    Index("ix_credit_grants_org_id_created_at", "org_id", "created_at"),
)

holds = Table(
    "holds", metadata,
    Column("id", String(200), primary_key=True),  # the call id
    Column("org_id", String(40), ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    Column("member_id", String(40), nullable=True),
    Column("tag", String(200), nullable=True),
    Column("day", Date, nullable=False),  # UTC day the hold was placed: the day its spend counts toward
    Column("amount_micro", BigInteger, nullable=False),
    Column("state", String(16), nullable=False, server_default=text("'held'")),
    Column("settled_micro", BigInteger, nullable=False, server_default=text("0")),
    _created(),
    Column("closed_at", DateTime(timezone=True), nullable=True),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    #: the org credited with what the hold is charged (a hub tool's publisher), in the same statement
    Column("credit_org_id", String(40), ForeignKey("orgs.id", ondelete="SET NULL"), nullable=True),
    #: a credit lease (migration 0020): a process's hold for many calls, which its calls' holds are taken
    #: from in memory; its amount is what is left of it (docs/money.md "Credit leases")
    Column("lease", Boolean, nullable=False, server_default=text("false")),
    CheckConstraint("state IN ('held', 'settled', 'released')", name="state"),
    CheckConstraint("(amount_micro > 0 OR lease) AND amount_micro >= 0 AND settled_micro >= 0 "
                    "AND settled_micro <= amount_micro", name="amounts"),
    Index("ix_holds_org_id_created_at", "org_id", "created_at"),
    Index("ix_holds_expires_at_open", "expires_at", postgresql_where=text("state = 'held'")),
)

money_daily = Table(
    # Spend per UTC day: scope '*' is the whole org, otherwise a member id (member caps).
    "money_daily", metadata,
    Column("org_id", String(40), ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    Column("day", Date, nullable=False),
    Column("scope", String(40), nullable=False),
    Column("spent_micro", BigInteger, nullable=False, server_default=text("0")),
    Column("held_micro", BigInteger, nullable=False, server_default=text("0")),
    PrimaryKeyConstraint("org_id", "day", "scope"),
)

member_caps = Table(
    "member_caps", metadata,
    Column("member_id", String(40), ForeignKey("members.id", ondelete="CASCADE"), primary_key=True),
    Column("org_id", String(40), ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    Column("daily_cap_micro", BigInteger, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

member_calls = Table(
    # The calls a capped member made on one UTC day (treg/call_caps.py): counted and checked by one
    # conditional upsert, so every process agrees (migration 0017)
    "member_calls", metadata,
    Column("member_id", String(40), ForeignKey("members.id", ondelete="CASCADE"), nullable=False),
    Column("day", Date, nullable=False),
    Column("org_id", String(40), ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    Column("calls", Integer, nullable=False),
    PrimaryKeyConstraint("member_id", "day"),
)

demo_calls = Table(
    # The public demo's sliding hour (migration 0018): one row per demo call a client address was admitted
    # for, kept an hour. Counted under a per-(org, client) advisory lock, so every process agrees; a call
    # refused later (before any vendor contact) deletes its row: refused calls do not count.
    "demo_calls", metadata,
    Column("call_id", String(64), primary_key=True),
    Column("org_id", String(40), ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    Column("client", String(64), nullable=False),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("ix_demo_calls_org_id_client_at", "org_id", "client", "at"),
    Index("ix_demo_calls_at", "at"),
)

tag_budgets = Table(
    # Lifetime spend per tag (X-Treg-Tag), and its budget when one is set.
    "tag_budgets", metadata,
    Column("org_id", String(40), ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    Column("tag", String(200), nullable=False),
    Column("budget_micro", BigInteger, nullable=True),
    Column("spent_micro", BigInteger, nullable=False, server_default=text("0")),
    Column("held_micro", BigInteger, nullable=False, server_default=text("0")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("org_id", "tag"),
)

idempotency_keys = Table(
    "idempotency_keys", metadata,
    Column("org_id", String(40), ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    Column("label", String(255), nullable=False),
    Column("digest", String(64), nullable=False),  # of method, endpoint, query and body bytes
    Column("state", String(16), nullable=False),  # in_progress | done
    Column("claim_id", String(40), nullable=False),  # who owns an in-progress claim
    Column("call_id", String(200), nullable=True),
    Column("status", Integer, nullable=True),
    Column("headers", JSONB, nullable=True),  # [[name, value], ...]
    Column("body", LargeBinary, nullable=True),
    _created(),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    PrimaryKeyConstraint("org_id", "label"),
    CheckConstraint("state IN ('in_progress', 'done')", name="state"),
    Index("ix_idempotency_keys_expires_at", "expires_at"),
)


# -- capacity and overflow (treg/capacity, treg/overflow, docs/resilience.md) ---------------------------

capacity_keys = Table(
    # One row per lock key (a provider id for `balance`, an endpoint id for `quota`): its pending strike
    # and its lock. Every write locks the row (INSERT … ON CONFLICT, then SELECT … FOR UPDATE), so two
    # processes striking at once agree on one outcome.
    "capacity_keys", metadata,
    Column("key", String(300), primary_key=True),
    Column("provider", String(100), nullable=False),
    Column("endpoint", String(200), nullable=True),  # NULL: the whole provider (balance)
    Column("kind", String(16), nullable=False),  # balance | quota
    Column("strikes", Integer, nullable=False, server_default=text("0")),
    Column("first_strike_at", DateTime(timezone=True), nullable=True),
    Column("last_strike_at", DateTime(timezone=True), nullable=True),
    Column("locked_since", DateTime(timezone=True), nullable=True),
    Column("locked_until", DateTime(timezone=True), nullable=True),
    Column("reset_stated", Boolean, nullable=False, server_default=text("false")),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    CheckConstraint("kind IN ('balance', 'quota')", name="kind"),
)

overflow_spend = Table(
    # What treg spent at each aggregator per UTC day (shadow mode counts too): the daily budget's meter.
    "overflow_spend", metadata,
    Column("aggregator", String(64), nullable=False),
    Column("day", Date, nullable=False),
    Column("spent_micro", BigInteger, nullable=False, server_default=text("0")),
    PrimaryKeyConstraint("aggregator", "day"),
)

overflow_health = Table(
    # `overflow:<name>` (the whole aggregator) or `overflow:<name>:<provider>` (one vendor through it)
    "overflow_health", metadata,
    Column("mark", String(200), primary_key=True),
    Column("until", DateTime(timezone=True), nullable=False),
    Column("reason", String(64), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)


# -- owned resources (treg/call/resources.py, docs/lifecycle.md "Owned resources") ---------------------

provider_resources = Table(
    # One row per object an org created on treg's own (platform) vendor account: who may update, use or
    # delete it there. The vendor's id is unique per (provider, kind): one owner per object.
    "provider_resources", metadata,
    Column("provider", String(100), nullable=False),
    Column("kind", String(64), nullable=False),
    Column("resource_id", String(512), nullable=False),  # the vendor's id, as its answer named it
    Column("org_id", String(40), ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    Column("state", String(16), nullable=False, server_default=text("'active'")),
    #: the creating call's pin (its X-Treg-Tag), the snapshot a pinned call must match; NULL: unpinned
    Column("tag", String(200), nullable=True),
    Column("call_id", String(200), nullable=False),  # the call that created it
    _created(),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    PrimaryKeyConstraint("provider", "kind", "resource_id"),
    CheckConstraint("state IN ('active', 'deleted')", name="state"),
    Index("ix_provider_resources_org_id_created_at", "org_id", "created_at"),
)


# -- the archive of catalog answers (treg/archive, docs/lifecycle.md) -----------------------------------

archive_entries = Table(
    # One stored 2xx catalog answer per key: a digest of (endpoint, method, sorted query, body hash, org),
    # never of a credential. org_id NULL: a `scope: global` entry shared by every org.
    "archive_entries", metadata,
    Column("key", String(64), primary_key=True),
    Column("endpoint", String(200), nullable=False),
    Column("org_id", String(40), ForeignKey("orgs.id", ondelete="CASCADE"), nullable=True),
    Column("status", Integer, nullable=False),
    Column("content_type", String(300), nullable=True),
    Column("body", LargeBinary, nullable=False),
    Column("stored_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Index("ix_archive_entries_expires_at", "expires_at"),
)


# -- async jobs (treg/jobs, docs/lifecycle.md "Async jobs") --------------------------------------------

async_jobs = Table(
    # One vendor job started on a platform-tier submission: who owns it (org, provider), the hold it keeps
    # open (the submission's call id) until a poll reads a terminal status, and the fetch ids learned.
    "async_jobs", metadata,
    Column("id", String(40), primary_key=True),
    Column("org_id", String(40), ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    Column("member_id", String(40), nullable=True),
    Column("provider", String(64), nullable=False),
    Column("endpoint_id", String(200), nullable=False),  # the submission
    Column("task_id", String(500), nullable=False),
    Column("call_id", String(200), nullable=False, unique=True),  # the submission's call (= its hold's id)
    # the utilities that may read it, frozen at submission (a later catalog change cannot widen them)
    Column("poll_endpoint", String(200), nullable=False),
    Column("fetch_endpoint", String(200), nullable=True),
    Column("state", String(16), nullable=False, server_default=text("'pending'")),
    Column("fetch_ids", ARRAY(String(500)), nullable=False, server_default=text("'{}'")),
    _created(),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("last_polled_at", DateTime(timezone=True), nullable=True),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    #: the submitting call's pin (its X-Treg-Tag): a pinned poll or fetch must carry the same; NULL: unpinned
    Column("tag", String(200), nullable=True),
    # what its polls read and settle by, frozen at submission (treg.catalog.async_jobs.JobTerms: task_param, status
    # path, done/failed, result_id_path, price); NULL: recorded before 0012 (the current catalog's apply)
    Column("terms", JSONB, nullable=True),
    CheckConstraint("state IN ('pending', 'done', 'failed', 'expired')", name="state"),
    # one vendor account: a task id names one job; the ownership lookup is (provider, task_id) then org
    UniqueConstraint("provider", "task_id"),
    Index("ix_async_jobs_fetch_ids", "fetch_ids", postgresql_using="gin"),
    Index("ix_async_jobs_org_id_created_at", "org_id", "created_at"),
)

async_job_utilities = Table(
    # Every way a recorded job may be read (a poll or fetch endpoint, the parameter carrying the id): the
    # endpoint stays owner-only on treg's key whatever a later catalog says (treg/call/jobs.py guard).
    # Tiny (one row per utility and parameter ever used), so every process keeps it in memory.
    "async_job_utilities", metadata,
    Column("endpoint_id", String(200), primary_key=True),
    Column("kind", String(8), primary_key=True),
    # '': a job recorded before 0012, whose parameter is unknown (every platform-tier call is refused)
    Column("task_param", String(100), primary_key=True),
    Column("by_result_id", Boolean, primary_key=True),
    _created(),
    CheckConstraint("kind IN ('poll', 'fetch')", name="kind"),
)


# -- OAuth connections (treg/oauth, docs/oauth.md; migration 0016) -------------------------------------

oauth_apps = Table(
    # an org's own OAuth client at a provider; the deployment's comes from TREG_OAUTH_CLIENT_ID_<P>
    "oauth_apps", metadata,
    Column("org_id", String(40), ForeignKey("orgs.id", ondelete="CASCADE"), primary_key=True),
    Column("provider", String(64), primary_key=True),
    Column("client_id", Text, nullable=False),
    # sealed with the secret box (associated data: the org and ``oauth-app:<provider>``)
    Column("client_secret_blob", LargeBinary, nullable=False),
    Column("key_id", String(16), nullable=False),
    _created(),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

oauth_connections = Table(
    # a grant a person made in a browser: a credential like a secret, its tokens sealed (associated data:
    # the org and ``oauth-connection:<id>``); the link, state and PKCE verifier of its consent in flight
    "oauth_connections", metadata,
    Column("id", String(40), primary_key=True),
    Column("org_id", String(40), ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    Column("provider", String(64), nullable=False),
    Column("name", String(200), nullable=False),
    Column("status", String(16), nullable=False),
    # the org's (the team tier) rather than its creator's (the own tier)
    Column("shared", Boolean, nullable=False, server_default=text("false")),
    Column("created_by", String(40), ForeignKey("members.id", ondelete="SET NULL"), nullable=True),
    # asked for until the grant, then the scopes granted
    Column("scopes", JSONB, nullable=False, server_default=text("'[]'::jsonb")),
    # the member the consent page names (who asked for the link in force)
    Column("asked_by", String(40), ForeignKey("members.id", ondelete="SET NULL"), nullable=True),
    Column("redirect_after", Text, nullable=True),
    # the redirect URI the authorization request named (the code exchange must name the same one)
    Column("redirect_uri", Text, nullable=True),
    # the connect link: its random part and the SHA-256 of its opaque (HMAC of both under a purpose key)
    Column("link_nonce", String(64), nullable=True),
    Column("link_hash", String(64), nullable=True, unique=True),
    Column("link_expires_at", DateTime(timezone=True), nullable=True),
    # the authorization request in flight: SHA-256 of its state and of the browser's treg_oauth_state
    # cookie, the PKCE verifier sealed (``oauth-verifier:<id>``)
    Column("state_hash", String(64), nullable=True, unique=True),
    Column("state_expires_at", DateTime(timezone=True), nullable=True),
    Column("browser_hash", String(64), nullable=True),
    Column("verifier_blob", LargeBinary, nullable=True),
    # {access_token, refresh_token, token_type} sealed; replaced whole (a rotated refresh token atomically)
    Column("tokens_blob", LargeBinary, nullable=True),
    Column("key_id", String(16), nullable=True),
    Column("expires_at", DateTime(timezone=True), nullable=True),
    # an upstream 401 answered the token: the next call refreshes first
    Column("stale", Boolean, nullable=False, server_default=text("false")),
    # bumped by every write of the tokens: a waiter knows the new token landed, a 401 marks only its own
    Column("token_version", Integer, nullable=False, server_default=text("0")),
    # the refresh lease: one refresh per connection at a time across every process
    Column("lease_holder", String(64), nullable=True),
    Column("lease_until", DateTime(timezone=True), nullable=True),
    _created(),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("last_refreshed_at", DateTime(timezone=True), nullable=True),
    Column("refresh_count", Integer, nullable=False, server_default=text("0")),
    CheckConstraint("status IN ('pending', 'active', 'needs_reauth', 'denied')", name="status"),
    Index("ix_oauth_connections_org_id_provider", "org_id", "provider"),
)

oauth_refreshes = Table(
    # each refresh of a connection and its outcome (the detail shows the last 20)
    "oauth_refreshes", metadata,
    Column("id", String(40), primary_key=True),
    Column("connection_id", String(40), ForeignKey("oauth_connections.id", ondelete="CASCADE"), nullable=False),
    Column("org_id", String(40), nullable=False),
    Column("at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("outcome", String(16), nullable=False),
    CheckConstraint("outcome IN ('ok', 'invalid_grant', 'failed')", name="outcome"),
    Index("ix_oauth_refreshes_connection_id_at", "connection_id", "at"),
)


# -- hub tools (treg/hub, docs/sharing.md "Hub") ---------------------------------------------------------

hub_tools = Table(
    # a tool an org published for members of every org on this treg to call as `<org-slug>.<name>`
    "hub_tools", metadata,
    Column("id", String(40), primary_key=True),
    Column("org_id", String(40), ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    Column("tool_id", String(40), ForeignKey("tools.id", ondelete="CASCADE"), nullable=False),
    Column("name", String(200), nullable=False),
    Column("description", Text, nullable=False, server_default=text("''")),
    Column("price_micro", BigInteger, nullable=False, server_default=text("0")),
    Column("max_runs", Integer, nullable=True),
    Column("created_by", String(40), nullable=True),
    _created(),
    UniqueConstraint("org_id", "name"),
    CheckConstraint("price_micro >= 0", name="price"),
    CheckConstraint("max_runs IS NULL OR max_runs >= 1", name="max_runs"),
)

hub_runs = Table(
    # the hub calls running now, one row each (its call id): a slot of its publishing org and tool,
    # taken in one statement before the relay, deleted once the answer finished streaming, and leased
    # (``expires_at``, renewed by its process while it runs) so a process that died frees its slots
    "hub_runs", metadata,
    Column("id", String(64), primary_key=True),
    Column("publisher_org_id", String(40), ForeignKey("orgs.id", ondelete="CASCADE"), nullable=False),
    Column("hub_tool_id", String(40), nullable=False),
    Column("caller_org_id", String(40), nullable=False),
    Column("holder", String(64), nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Index("ix_hub_runs_publisher_org_id", "publisher_org_id"),
)
