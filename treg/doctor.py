"""``treg doctor``: the operator's checklist, one :class:`Check` per line (docs/operations.md).

Read-only on purpose: a doctor that created the master key, initialised the embedded data folder or
migrated the database would hide the very problems it is asked about. The checks run in a fixed
order; one that needs the database reports that it could not run when the database is unreachable.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from treg.errors import TregError
from treg.settings import Settings

#: how long the database and the resolver may take to answer before the check fails
TIMEOUT_S = 5.0
#: the name the DNS check asks for: any answer (NXDOMAIN included) proves the resolver answers
PROBE_NAME = "treg-doctor.example.com."


@dataclass(frozen=True)
class Check:
    check: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"ok {self.check}" if self.ok else f"FAIL {self.check}: {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return {"check": self.check, "ok": self.ok, "detail": self.detail}


@dataclass(frozen=True)
class _Db:
    """What the database checks learnt: a DSN that answered, or why none did."""

    dsn: str | None
    problem: str = ""


def _connect(dsn: str) -> Any:
    import psycopg2

    return psycopg2.connect(dsn, connect_timeout=int(TIMEOUT_S))


def _describe_target(settings: Settings) -> str:
    # never the URL itself: it may carry a password
    return "TREG_DATABASE_URL" if settings.database_url is not None else f"the embedded PostgreSQL in {settings.pg_dir}"


def check_database(settings: Settings) -> tuple[Check, _Db]:
    import psycopg2

    name = "database reachable"
    if settings.database_url is None:
        if not (settings.pg_dir / "PG_VERSION").exists():
            problem = (f"no embedded PostgreSQL in {settings.pg_dir} yet: run `treg db upgrade` (or `treg serve`) "
                       "once to create it, or set TREG_DATABASE_URL")
            return Check(name, False, problem), _Db(None, problem)
        from treg.infra import embedded_pg

        try:
            server = embedded_pg.start(settings.pg_dir)  # reuses a running server; stops with this process if last
        except TregError as exc:
            problem = f"{exc.detail} — check {settings.pg_dir / 'log'}"
            return Check(name, False, problem), _Db(None, problem)
        dsn = server.dsn()
    else:
        dsn = settings.database_url.reveal()
    try:
        _connect(dsn).close()
    except psycopg2.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        problem = (f"cannot connect to {_describe_target(settings)} ({reason}): check that the server runs and "
                   "the URL, user and password are right")
        if settings.database_url is None:
            problem = f"cannot connect to {_describe_target(settings)} ({reason}): run `treg db upgrade` once"
        return Check(name, False, problem), _Db(None, problem)
    return Check(name, True, f"connected to {_describe_target(settings)}"), _Db(dsn)


def check_migrations(db: _Db) -> Check:
    from treg.infra import migrate

    name = "migrations current"
    if db.dsn is None:
        return Check(name, False, "not checked: the database is not reachable (see above)")
    try:
        current, head = migrate.current_and_head(db.dsn)
    except Exception as exc:  # noqa: BLE001 (psycopg2 or SQLAlchemy: the server went away since)
        return Check(name, False, f"could not read the schema revision ({type(exc).__name__}): check the database")
    if current == head:
        return Check(name, True, f"at revision {head}")
    if current is None:
        return Check(name, False, f"the database has no schema yet (this treg expects revision {head}): "
                                  "run `treg db upgrade`")
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(migrate._alembic_config())
    try:
        known = script.get_revision(current) is not None
    except Exception:  # noqa: BLE001 (alembic raises several kinds for an unknown revision)
        known = False
    if not known:
        return Check(name, False, f"the database is at revision {current}, which this treg does not know "
                                  f"(a newer treg migrated it): run that treg version or newer")
    return Check(name, False, f"the database is at revision {current}, this treg expects {head}: "
                              "run `treg db upgrade`")


def check_master_key(settings: Settings, db: _Db) -> Check:
    from treg.infra import crypto

    name = "master key"
    if settings.secret_key is None and not crypto.key_file(settings).exists():
        return Check(name, False, f"TREG_SECRET_KEY is unset and {crypto.key_file(settings)} is missing: `treg serve` "
                                  "creates a key on its first start; if secrets were stored before, restore the key "
                                  "they were encrypted with")
    try:
        box = crypto.load_box(settings, create=False)
    except TregError as exc:
        return Check(name, False, f"{exc.detail}: set TREG_SECRET_KEY (or {crypto.key_file(settings)}) to the "
                                  "urlsafe base64 of 32 bytes")
    if db.dsn is None:
        return Check(name, False, f"key {box.key_id} present, but no stored secret could be tried: the database "
                                  "is not reachable (see above)")
    import psycopg2

    try:
        conn = _connect(db.dsn)
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT to_regclass('secrets') IS NOT NULL")
                if not cur.fetchone()[0]:
                    return Check(name, True, f"key {box.key_id} present; no secrets table yet")
                # one secret per key id in use: a rotation cut short leaves blobs under two keys
                cur.execute("SELECT DISTINCT ON (key_id) key_id, id, org_id, blob FROM secrets ORDER BY key_id, id")
                rows = cur.fetchall()
        finally:
            conn.close()
    except psycopg2.Error as exc:
        return Check(name, False, f"key {box.key_id} present, but the stored secrets could not be read "
                                  f"({type(exc).__name__}): check the database")
    for key_id, secret_id, org_id, blob in rows:
        try:
            box.decrypt(bytes(blob), org_id=org_id, secret_id=secret_id)
        except crypto.DecryptError:
            return Check(name, False, f"the master key (key {box.key_id}) cannot decrypt a stored secret written "
                                      f"under key {key_id}: set TREG_SECRET_KEY (or {crypto.key_file(settings)}) to "
                                      "the key the secrets were encrypted with (keep previous keys in "
                                      f"{crypto.previous_file(settings)})")
    if not rows:
        return Check(name, True, f"key {box.key_id} present; no stored secret to try yet")
    return Check(name, True, f"key {box.key_id} decrypts a stored secret of each of {len(rows)} key id(s)")


def check_plugins(settings: Settings) -> Check:
    import treg.startup
    from treg import plugins

    name = "plugins loaded"
    try:  # every registry, as `treg serve` collects it
        startup = treg.startup.invoke_startup(settings)
    except TregError as exc:
        return Check(name, False, f"{exc.detail}: fix or remove the plugin (`treg plugins`, `treg catalog`)")
    return Check(name, True, f"{len(plugins.describe(startup.pm))} plugin(s), "
                             f"{len(startup.catalog.providers)} provider(s)")


def check_ssrf(settings: Settings) -> Check:
    name = "SSRF guard on"
    if not settings.proxy_ssrf_check:
        return Check(name, False, "TREG_PROXY_SSRF_CHECK=0 lets tools reach internal addresses (metadata services, "
                                  "the database): unset it, and exempt only what you need with TREG_SSRF_ALLOW")
    allowed = ", ".join(settings.ssrf_allow)
    return Check(name, True, f"internal addresses refused (exempt: {allowed})" if allowed else "internal addresses refused")


async def _dns_answers(settings: Settings) -> str:
    import dns.asyncresolver
    import dns.exception
    import dns.nameserver
    import dns.resolver

    from treg.infra.dns import parse_nameservers

    servers = parse_nameservers(settings.dns_nameservers)
    if servers:
        resolver = dns.asyncresolver.Resolver(configure=False)
        resolver.nameservers = [dns.nameserver.Do53Nameserver(ip, port) for ip, port in servers]
        where = "TREG_DNS_NAMESERVERS"
    else:
        try:
            resolver = dns.asyncresolver.Resolver()
        except (dns.resolver.NoResolverConfiguration, OSError, ValueError):
            # what treg itself does then (treg.infra.dns): getaddrinfo, whose answer proves nothing here
            loop = asyncio.get_running_loop()
            try:
                await asyncio.wait_for(loop.getaddrinfo(PROBE_NAME.rstrip("."), 443), TIMEOUT_S)
            except OSError:
                pass  # "no such name" is an answer
            return "the system resolver (getaddrinfo; no usable /etc/resolv.conf)"
        where = "/etc/resolv.conf"
    resolver.lifetime = resolver.timeout = TIMEOUT_S
    try:
        await resolver.resolve(PROBE_NAME, "A")
    except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
        pass  # an answer all the same
    return f"the nameservers of {where} answer"


def check_dns(settings: Settings) -> Check:
    import dns.exception

    name = "DNS resolver answering"
    try:
        detail = asyncio.run(_dns_answers(settings))
    except TregError as exc:
        return Check(name, False, f"{exc.detail}")
    except (dns.exception.DNSException, asyncio.TimeoutError, OSError) as exc:
        return Check(name, False, f"no answer from the upstream resolver ({type(exc).__name__}): check "
                                  "TREG_DNS_NAMESERVERS or /etc/resolv.conf; tools' hosts cannot resolve")
    return Check(name, True, detail)


def run(settings: Settings) -> list[Check]:
    """Every check, in order."""
    database, db = check_database(settings)
    return [database, check_migrations(db), check_master_key(settings, db), check_plugins(settings),
            check_ssrf(settings), check_dns(settings)]
