"""The ``treg`` command line."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import signal
import sys
from typing import Any, Callable, Coroutine

from treg import __version__, logs
from treg.errors import TregError
from treg.settings import Settings, load


def _print_json(obj: Any) -> None:
    from treg.web.jsonio import dumps

    print(dumps(obj))


def _progress(label: str) -> Callable[[int, int], None]:
    def show(done: int, total: int) -> None:
        if logs.is_json():  # no carriage-return redraws among JSON lines: one object per step
            print(logs.json_line(logging.INFO, "treg", f"{label}: {done}/{total}"), file=sys.stderr, flush=True)
            return
        print(f"\r{label}: {done}/{total}", end="" if done < total else "\n", file=sys.stderr, flush=True)
    return show


async def _with_services(settings: Settings, fn: Callable[[Any], Coroutine[Any, Any, Any]]) -> Any:
    """Run ``fn(services)`` with a migrated database and no HTTP server (operator commands)."""
    import treg.startup
    from treg.factory import build_services
    from treg.infra import crypto, migrate
    from treg.infra.database_url import resolve_dsn
    from treg.infra.db import Database

    # plugins, their registries and the key first, as `treg serve` does: a bad plugin or row is
    # reported before any database work, and the command runs with the registries serve runs with
    startup = treg.startup.invoke_startup(settings)
    box = crypto.load_box(settings)
    loop = asyncio.get_running_loop()
    dsn = await loop.run_in_executor(None, resolve_dsn, settings)
    await loop.run_in_executor(None, migrate.upgrade, dsn)
    db = await Database(dsn, minsize=1, maxsize=2).open()
    try:
        svc = build_services(settings, db, startup=startup, box=box)
        return await fn(svc)
    finally:
        await db.close()


#: young-generation threshold of ``treg serve`` (CPython's default is 700)
GC_GEN0_THRESHOLD = 20_000


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from aiohttp import web

    from treg.app import create_app, make_runner
    from treg.web.access_log import AccessSink

    host = args.host or settings.host
    port = args.port if args.port is not None else settings.port
    app = create_app(settings)

    async def run() -> None:
        # SIGTERM: the listening socket closes at once (new connections refused), calls in flight get
        # TREG_SHUTDOWN_GRACE_S to finish; then aiohttp cancels them, and a cancelled call is audited
        # as cancelled (treg.web.call) before cleanup_ctx flushes the audit writer and closes the pool
        console = logs.console()
        # an access line per request: a sink of its own, written in batches (treg/web/access_log.py)
        sink = AccessSink(console, settings.log_format) if console is not None else None
        runner = make_runner(app, access_sink=sink, shutdown_timeout=settings.shutdown_grace_s)
        await runner.setup()
        site = web.TCPSite(runner, host, port, reuse_address=True)
        await site.start()
        # a call allocates many short-lived containers: at CPython's default young-generation threshold
        # (700) the collector ran every ~20 calls and took ~7% of treg's CPU under load
        # (docs/performance.md). Fewer, larger young collections; garbage is still collected.
        gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])
        # what startup built (modules, SQLAlchemy's tables, the catalog, plugins: ~100k objects) lives as
        # long as the process: out of the collector's way, so an occasional full collection walks only
        # what serving allocates (startup garbage collected first; frozen objects are never freed)
        gc.collect()
        gc.freeze()
        if console is not None:
            console.defer()  # INFO lines may wait for the next batch (treg/logs.py)
        logging.getLogger("treg").info("treg %s serving on http://%s:%s", __version__, host, port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        logging.getLogger("treg").info("shutting down: calls in flight get up to %ss to finish",
                                       settings.shutdown_grace_s)
        await runner.cleanup()  # drains in-flight requests, then cleanup_ctx closes pools and flushes audit
        logging.getLogger("treg").info("stopped")

    asyncio.run(run())
    return 0


def cmd_init(args: argparse.Namespace, settings: Settings) -> int:
    from treg import membership

    result = asyncio.run(_with_services(settings, lambda svc: membership.create_org(svc, slug=args.org, email=args.email)))
    _print_json(result)
    return 0


def cmd_db_upgrade(args: argparse.Namespace, settings: Settings) -> int:
    from treg.infra import migrate
    from treg.infra.database_url import resolve_dsn

    dsn = resolve_dsn(settings)
    migrate.upgrade(dsn)
    current, head = migrate.current_and_head(dsn)
    _print_json({"revision": current, "head": head})
    return 0


def _step(text: str) -> None:
    """A progress line of a long operator command, on stderr (a log line in ``json``)."""
    if logs.is_json():
        print(logs.json_line(logging.INFO, "treg", text), file=sys.stderr, flush=True)
    else:
        print(f"treg: {text}", file=sys.stderr, flush=True)


def cmd_db_backup(args: argparse.Namespace, settings: Settings) -> int:
    from pathlib import Path

    from treg.infra import backup
    from treg.infra.database_url import resolve_dsn

    _step("opening the database")
    size = backup.backup(resolve_dsn(settings), Path(args.file), _step)
    _print_json({"file": str(Path(args.file).expanduser()), "bytes": size})
    return 0


def cmd_db_restore(args: argparse.Namespace, settings: Settings) -> int:
    from pathlib import Path

    from treg.infra import backup
    from treg.infra.database_url import resolve_dsn

    _step("opening the database")
    dsn = resolve_dsn(settings)  # the embedded one is created empty on a fresh TREG_HOME
    backup.restore(dsn, Path(args.file), _step)
    from treg.infra import migrate

    current, head = migrate.current_and_head(dsn)
    if current != head:
        _step(f"the backup is at revision {current}, this treg expects {head}: run `treg db upgrade`")
    _print_json({"restored": str(Path(args.file).expanduser()), "revision": current, "head": head})
    return 0


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    from treg import doctor

    checks = doctor.run(settings)
    if args.json:
        _print_json([c.to_json() for c in checks])
    else:
        for c in checks:
            print(c.line(), flush=True)
    return 0 if all(c.ok for c in checks) else 1


def cmd_plugins(args: argparse.Namespace, settings: Settings) -> int:
    from treg import plugins

    pm = plugins.create_manager(settings.plugins_dir, trace=settings.trace_plugins)
    injectors = plugins.collect_injectors(pm)
    rows = [{"name": p.name, "source": p.source, "hooks": list(p.hooks)} for p in plugins.describe(pm)]
    if args.json:
        _print_json({"plugins": rows, "injectors": sorted(injectors)})
    else:
        for row in rows:
            print(f"{row['name']:<28} {row['source']:<10} {', '.join(row['hooks'])}")
        print(f"injector locations: {', '.join(sorted(injectors))}")
    return 0


def cmd_catalog(args: argparse.Namespace, settings: Settings) -> int:
    """List the catalog every plugin declares, validating it as startup does (exit 1 when invalid)."""
    import treg.startup
    from treg.catalog.errors import CatalogError
    from treg.catalog.tiers import offer_tier

    try:  # validated as startup does: the catalog, then the signature and classifier rows naming it
        registry = treg.startup.invoke_startup(settings).catalog
    except CatalogError as exc:
        if args.json:
            _print_json({"valid": False, "problems": [p.to_json() for p in exc.problems]})
        for problem in exc.problems:
            print(f"invalid catalog: {problem}", file=sys.stderr)
        return 1
    if args.provider and args.provider not in registry.providers:
        print(f"no provider {args.provider!r}; known: {', '.join(registry.providers)}", file=sys.stderr)
        return 1
    endpoints = registry.search(provider=args.provider or None)
    providers = [p for p in registry.providers.values() if not args.provider or p.id == args.provider]
    if args.json:
        _print_json({"valid": True, "providers": [p.to_json() for p in providers],
                     "endpoints": [{**e.to_json(), "offered_tier": offer_tier(registry.provider_of(e), e, None,
                                                                              settings)} for e in endpoints]})
        return 0
    for e in endpoints:
        tier = offer_tier(registry.provider_of(e), e, None, settings) if e.is_live else None
        print(f"{e.id:<40} {e.method:<6} {e.price.kind:<8} {e.price.list_micro:>9} {e.status:<8} "
              f"{e.capability or '-':<22} {tier or '-'}")
    print(f"{len(endpoints)} endpoint(s) of {len(providers)} provider(s); catalog valid "
          "(prices in micro-USD; last column: the tier offered without a team credential)")
    return 0


def cmd_rotate_key(args: argparse.Namespace, settings: Settings) -> int:
    from treg import secrets_store
    from treg.infra import crypto

    old = crypto.load_box(settings)
    new_text = args.new_key or crypto.new_key_text()
    new_key = crypto.decode_key(new_text)
    new_box = crypto.SecretBox(new_key, previous=(old.current, *old.previous))
    # The new key is kept BEFORE any blob moves: a rotation cut short (crash, Ctrl-C) leaves blobs under
    # both keys, and both stay readable. Rerunning the command finishes the job.
    if settings.secret_key is None:
        path, prev = crypto.key_file(settings), crypto.previous_file(settings)
        known = prev.read_text().split() if prev.exists() else []
        old_text = path.read_text().strip()
        if old_text not in known:
            fd = os.open(prev, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(fd, "a") as fh:
                fh.write(old_text + "\n")
        tmp = path.with_suffix(".new")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(new_text + "\n")
        os.replace(tmp, path)  # running tregs reload the files and follow (treg.infra.crypto.SecretBox)
    else:
        note = "new TREG_SECRET_KEY (set it on every treg process; keep the old one until this finishes)"
        print(logs.json_line(logging.WARNING, "treg", note, new_key=new_text) if logs.is_json() else f"{note}: {new_text}",
              file=sys.stderr, flush=True)
    moved = asyncio.run(_with_services(settings, lambda svc: secrets_store.rotate_key(
        svc, new_box, progress=_progress("re-encrypting secrets"))))
    out: dict[str, Any] = {"reencrypted": moved, "key_id": new_box.key_id, "previous_key_id": old.key_id}
    if settings.secret_key is None:
        out["key_file"] = str(crypto.key_file(settings))
    else:
        out["note"] = "set TREG_SECRET_KEY to the new key printed on stderr on every treg process"
    _print_json(out)
    return 0


def cmd_settings(args: argparse.Namespace, settings: Settings) -> int:
    from treg.settings import markdown_table, table

    if args.markdown:
        print(markdown_table())
        return 0
    for env, kind, default, help_ in table():
        print(f"{env:<34} {kind:<7} {default or '-':<22} {help_}")
    return 0


def cmd_credits_grant(args: argparse.Namespace, settings: Settings) -> int:
    import getpass

    from treg import money

    amount = args.micro if args.micro is not None else money.usd_to_micro(args.usd)
    try:
        who = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        who = str(os.getuid())
    actor = f"cli:{os.environ.get('SUDO_USER') or who}"
    result = asyncio.run(_with_services(settings, lambda svc: money.grant_by_slug(
        svc, slug=args.org, amount_micro=amount, actor=actor, note=args.note)))
    _print_json(result)
    return 0


def cmd_capacity_list(args: argparse.Namespace, settings: Settings) -> int:
    from treg.capacity.breaker import BreakerStore

    rows = asyncio.run(_with_services(settings, lambda svc: BreakerStore(svc.db, svc.settings).rows()))
    _print_json([{k: v for k, v in row.items() if k != "locked"} for row in rows])
    return 0


def cmd_capacity_clear(args: argparse.Namespace, settings: Settings) -> int:
    from treg.capacity.breaker import BreakerStore

    provider, _, endpoint = args.target.partition("/")
    # PROVIDER/ENDPOINT: the endpoint by its operation (acme/items-get) or its full id (acme/acme.items-get)
    key = provider if not endpoint else endpoint if endpoint.startswith(provider + ".") else f"{provider}.{endpoint}"
    cleared = asyncio.run(_with_services(settings, lambda svc: BreakerStore(svc.db, svc.settings).clear(key)))
    _print_json({"key": key, "cleared": cleared})
    return 0 if cleared else 1


def cmd_demo_enable(args: argparse.Namespace, settings: Settings) -> int:
    from treg import public_demo

    _print_json(asyncio.run(_with_services(settings, lambda svc: public_demo.set_enabled(svc, args.org, True))))
    return 0


def cmd_demo_disable(args: argparse.Namespace, settings: Settings) -> int:
    from treg import public_demo

    _print_json(asyncio.run(_with_services(settings, lambda svc: public_demo.set_enabled(svc, args.org, False))))
    return 0


def cmd_demo_token(args: argparse.Namespace, settings: Settings) -> int:
    from treg import public_demo

    _print_json(asyncio.run(_with_services(settings, lambda svc: public_demo.issue_token(svc, args.org))))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="treg", description="treg: a credential-injecting API gateway")
    parser.add_argument("--version", action="version", version=f"treg {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="run the server (applies migrations first)")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.set_defaults(fn=cmd_serve)

    p = sub.add_parser("init", help="create an org and its owner; prints the owner's token once")
    p.add_argument("--org", required=True)
    p.add_argument("--email", required=True)
    p.set_defaults(fn=cmd_init)

    db = sub.add_parser("db", help="database commands").add_subparsers(dest="db_command", required=True)
    p = db.add_parser("upgrade", help="apply alembic migrations")
    p.set_defaults(fn=cmd_db_upgrade)
    p = db.add_parser("backup", help="a consistent dump of the database (pg_dump's custom format) into FILE")
    p.add_argument("file", metavar="FILE")
    p.set_defaults(fn=cmd_db_backup)
    p = db.add_parser("restore", help="restore a `treg db backup` FILE into the configured, empty database")
    p.add_argument("file", metavar="FILE")
    p.set_defaults(fn=cmd_db_restore)

    p = sub.add_parser("doctor", help="check the installation: one `ok`/`FAIL` line per check; exit 1 on any FAIL")
    p.add_argument("--json", action="store_true", help="print [{check, ok, detail}]")
    p.set_defaults(fn=cmd_doctor)

    p = sub.add_parser("plugins", help="list loaded plugins and the hooks each implements")
    p.add_argument("--json", action="store_true")
    p.set_defaults(fn=cmd_plugins)

    p = sub.add_parser("catalog", help="list and validate the endpoint catalog the plugins declare")
    p.add_argument("--json", action="store_true")
    p.add_argument("--provider", help="only this provider's endpoints")
    p.set_defaults(fn=cmd_catalog)

    sec = sub.add_parser("secrets", help="secrets at rest").add_subparsers(dest="secrets_command", required=True)
    p = sec.add_parser("rotate-key", help="re-encrypt every secret under a new master key")
    p.add_argument("--new-key", help="urlsafe base64 of 32 bytes (default: generate one)")
    p.set_defaults(fn=cmd_rotate_key)

    credits = sub.add_parser("credits", help="org credits (operator)").add_subparsers(dest="credits_command",
                                                                                       required=True)
    p = credits.add_parser("grant", help="add credits to an org; prints {org, granted_micro, balance_micro}")
    p.add_argument("--org", required=True, help="the org's slug")
    amount = p.add_mutually_exclusive_group(required=True)
    amount.add_argument("--micro", type=int, help="amount in micro-USD (1 USD = 1000000)")
    amount.add_argument("--usd", help="amount in USD, at most 6 decimals")
    p.add_argument("--note", help="why (kept on the audited grant row)")
    p.set_defaults(fn=cmd_credits_grant)

    cap = sub.add_parser("capacity", help="the platform tier's capacity locks (operator)").add_subparsers(
        dest="capacity_command", required=True)
    p = cap.add_parser("list", help="print the locks and pending strikes as a JSON array")
    p.set_defaults(fn=cmd_capacity_list)
    p = cap.add_parser("clear", help="remove one lock (and its strikes): PROVIDER or PROVIDER/ENDPOINT")
    p.add_argument("target")
    p.set_defaults(fn=cmd_capacity_clear)

    demo = sub.add_parser("demo", help="the public demo (operator; docs/sharing.md)").add_subparsers(
        dest="demo_command", required=True)
    p = demo.add_parser("enable", help="run the org as a public demo (its demo tokens work); prints {org, public_demo}")
    p.add_argument("--org", required=True, help="the org's slug")
    p.set_defaults(fn=cmd_demo_enable)
    p = demo.add_parser("disable", help="stop the public demo: its demo tokens answer 403 demo_disabled until "
                                        "enabled again; prints {org, public_demo}")
    p.add_argument("--org", required=True, help="the org's slug")
    p.set_defaults(fn=cmd_demo_disable)
    p = demo.add_parser("token", help="a new demo-scoped token for a web page, printed once as {token, org, "
                                      "public_demo}")
    p.add_argument("--org", required=True, help="the org's slug")
    p.set_defaults(fn=cmd_demo_token)

    p = sub.add_parser("settings", help="print the settings table")
    p.add_argument("--markdown", action="store_true", help="as the README's Markdown table")
    p.set_defaults(fn=cmd_settings)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = load()
        logs.configure(settings.log_level, settings.log_format)
        return args.fn(args, settings)
    except TregError as exc:
        body = {"error": exc.code, "detail": exc.detail, "blame": exc.blame}
        if logs.is_json():  # every stderr line a log object: the error body's keys beside the log's own
            print(logs.json_line(logging.ERROR, "treg", exc.detail, **body), file=sys.stderr)
        else:
            print(json.dumps(body), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
