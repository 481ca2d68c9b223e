"""The run: start every server, measure, stream, report (a table, then one JSON object)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import secrets as pysecrets
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import platform_case as plat
from bench.archive import archive_case, write_plugin as write_archive_plugin
from bench.database import bench_database, count_calls
from bench.phases import Phase, Target, run_phase
from bench.pinning import cpu_plan, database_pinned, pin
from bench.procs import Server, free_port, machine_ticks, proc_mem_kib, run_cli, start_helper, start_treg
from bench.servers import MiB, TARGETS, serve
from bench.slow import raise_nofile, slow_streams
from bench.through_treg import setup_treg_data, stream_through

PARTS = ("tail", "stream", "slow", "archive", "platform")

DESCRIPTION = "The relay benchmark: direct, a bare aiohttp relay and treg on one upstream."


def machine_text() -> str:
    import aiohttp

    model = platform.processor() or ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return (f"{os.cpu_count()} CPUs ({model}), Linux {platform.release()}, Python {platform.python_version()}, "
            f"aiohttp {aiohttp.__version__}")


async def bench(opts: argparse.Namespace) -> dict[str, Any]:
    concurrencies = [int(c) for c in opts.concurrency.split(",")]
    only = set(PARTS) if opts.only == "all" else set(opts.only.split(","))
    if only - set(PARTS):
        raise SystemExit(f"--only takes {', '.join(PARTS)} or all")
    platform_concurrencies = concurrencies if "platform" in only and opts.platform_requests > 0 else []
    if "tail" not in only:
        concurrencies = []
    nofile = raise_nofile()  # before any server starts: they inherit it
    servers: list[Server] = []
    result: dict[str, Any] = {"machine": machine_text(), "client": opts.client, "rounds": opts.rounds,
                              "treg_log_level": opts.treg_log_level, "parts": sorted(only),
                              "open_files_limit": nofile[0], "load_average": list(os.getloadavg())}
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if not opts.quiet else (lambda *a: None)
    # other load on the machine skews every figure: measure it before anything of ours runs
    busy0, total0 = machine_ticks()
    await asyncio.sleep(1.0)
    busy1, total1 = machine_ticks()
    result["machine_busy_before_pct"] = round((busy1 - busy0) / max(total1 - total0, 1) * 100, 1)
    plan = cpu_plan(opts.pin)
    result["pinning"] = (f"relay under test on CPU {sorted(plan[0])}, everything else on CPUs {sorted(plan[1])}"
                         if plan else "off")
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="treg-bench-"))
        db = stack.enter_context(bench_database(opts, Path(tmp)))
        dsn = db.dsn
        if plan is not None:
            result["pinning"] += ("; PostgreSQL (the run's own server) with everything else" if db.owned
                                  else "; PostgreSQL not moved (a server given to the run may be shared)")
            # the relay under test (baseline or treg, one at a time) alone on its CPU; the load
            # generator, the upstream and PostgreSQL on the others: both relays then run in the same
            # conditions instead of wherever the scheduler puts them (docs/performance.md)
            os.sched_setaffinity(0, plan[1])  # this process, and the helpers it starts inherit it
            stack.enter_context(database_pinned(db, plan[1]))
        try:
            up = await start_helper("upstream")
            servers.append(up)
            upstream_url = f"http://127.0.0.1:{up.port}"
            base = await start_helper("baseline", upstream_url)
            servers.append(base)
            if plan is not None:
                pin(base.pid, plan[0])
            env = {k: v for k, v in os.environ.items() if not k.startswith("TREG_")}
            env.update(TREG_HOME=str(Path(tmp) / "home"), TREG_DATABASE_URL=dsn, TREG_SSRF_ALLOW="127.0.0.0/8",
                       TREG_HOST="127.0.0.1", TREG_PORT=str(free_port()), TREG_LOG_LEVEL=opts.treg_log_level)
            # an experiment's setting (``--treg-setting``); the run's own ones above are not overridden
            env.update((k, v) for k, v in opts.treg_setting if k not in env)
            if opts.treg_setting:
                result["treg_settings"] = {k: env[k] for k, _ in opts.treg_setting}
            if "slow" in only:
                # one upstream connection per held stream, plus room for the short calls: at the default
                # pool size (256) the rest would queue for a free connection (an operator's setting)
                env["TREG_UPSTREAM_POOL_SIZE"] = str(max(256, opts.slow_streams + 64))
                result["treg_upstream_pool_size"] = int(env["TREG_UPSTREAM_POOL_SIZE"])
            if "archive" in only:
                # the archive case's provider, installed as an operator would: a plugin file (bench/archive.py)
                env["TREG_PLUGINS_DIR"] = str(write_archive_plugin(Path(tmp) / "plugins", upstream_url))
            if platform_concurrencies:
                # the platform case's provider (bench/platform_case.py), beside the archive's, and treg's key for it
                env["TREG_PLUGINS_DIR"] = str(plat.write_plugin(Path(tmp) / "plugins", upstream_url))
                plat.environment(env)
            say("creating the org (treg init) …")
            slug = "bench-" + pysecrets.token_hex(4)
            org = json.loads(await run_cli(env, "init", "--org", slug, "--email", f"{slug}@bench.test"))
            token = org["token"]
            log_path = Path(opts.treg_log) if opts.treg_log else Path(tmp) / "treg.log"
            say("starting treg serve …")
            wrapper = opts.treg_wrapper
            if opts.loop_probe:
                wrapper = str(Path(__file__).resolve().parent / "loopprobe.py")
                env["PROBE_OUT"] = str(Path(opts.loop_probe).resolve())
            treg = await start_treg(env, log_path, wrapper)
            servers.append(treg)
            if plan is not None:
                pin(treg.pid, plan[0])
            await setup_treg_data(treg.port, token, upstream_url)
            without = None
            if platform_concurrencies:
                # credits for the platform tier's holds
                await run_cli(env, "credits", "grant", "--org", slug, "--micro", str(plat.CREDIT_MICRO),
                              "--note", "benchmark")
            if platform_concurrencies and opts.platform_reference:
                # issue 11's reference: the same treg on the same database without that issue's call-path
                # stages (bench/without_capacity.py)
                say("starting treg serve without the capacity stages …")
                without = await start_treg(dict(env, TREG_PORT=str(free_port())), Path(tmp) / "treg-without.log",
                                           plat.WRAPPER)
                servers.append(without)
                if plan is not None:
                    pin(without.pid, plan[0])
            spy = None
            if opts.py_spy:
                # sample treg's own process while it serves (profiling aid; py-spy from PyPI)
                spy = await asyncio.create_subprocess_exec(
                    shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(treg.pid), "--rate", "200", "--format", "raw",
                    "--nonblocking", "-o", opts.py_spy, stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.DEVNULL)
                servers.append(Server("py-spy", spy, 0))
                await asyncio.sleep(1.0)

            targets = {
                "direct": Target("direct", up.port, "/small", {}, None),
                "baseline": Target("baseline", base.port, "/small", {}, base.pid),
                "treg": Target("treg", treg.port, "/call/bench/small", {"X-Treg-Token": token}, treg.pid),
            }
            phases = {(t, c): Phase(t, c) for c in concurrencies for t in TARGETS}
            sent_to_treg = 0
            for rnd in range(opts.rounds):
                for c in concurrencies:
                    for name in TARGETS:
                        say(f"round {rnd + 1}/{opts.rounds}: {name} at concurrency {c} …")
                        sent = await run_phase(opts, targets[name], c, up.pid, phases[(name, c)],
                                               dsn if name == "treg" else None)
                        if name == "treg":
                            sent_to_treg += sent
            result["throughput"] = [phases[(t, c)].figures() for c in concurrencies for t in TARGETS]

            # the ratios the targets are stated in
            by = {(f["target"], f["concurrency"]): f for f in result["throughput"]}
            ratios: dict[str, Any] = {}
            for c in concurrencies:
                # each round interleaves the targets: its own ratio shows how much the machine moved
                ratios[f"rps_treg_over_baseline_c{c}_per_round"] = [
                    round(t / b, 3) if b else None
                    for t, b in zip(phases[("treg", c)].round_rps, phases[("baseline", c)].round_rps)]
                ratios[f"rps_treg_over_baseline_c{c}"] = round(
                    by[("treg", c)]["rps"] / by[("baseline", c)]["rps"], 3) if by[("baseline", c)]["rps"] else None
                ratios[f"added_p50_ms_vs_baseline_c{c}"] = round(by[("treg", c)]["p50_ms"] - by[("baseline", c)]["p50_ms"], 3)
                ratios[f"added_p50_ms_vs_direct_c{c}"] = round(by[("treg", c)]["p50_ms"] - by[("direct", c)]["p50_ms"], 3)
                ratios[f"p99_treg_over_baseline_c{c}_per_round"] = [
                    round(t / b, 2) if b else None
                    for t, b in zip(phases[("treg", c)].round_p99, phases[("baseline", c)].round_p99)]
                ratios[f"p99_treg_over_baseline_c{c}"] = round(
                    by[("treg", c)]["p99_ms"] / by[("baseline", c)]["p99_ms"], 2) if by[("baseline", c)]["p99_ms"] else None
                ratios[f"p999_treg_over_baseline_c{c}"] = round(
                    by[("treg", c)]["p999_ms"] / by[("baseline", c)]["p999_ms"], 2) if by[("baseline", c)]["p999_ms"] else None
            lo, hi = min(concurrencies), max(concurrencies)
            if lo != hi:  # how far each relay scales on this machine (the platform case's 4x is read beside it)
                for name in ("baseline", "treg"):
                    low = by[(name, lo)]["rps"]
                    ratios[f"rps_{name}_c{hi}_over_c{lo}"] = round(by[(name, hi)]["rps"] / low, 2) if low else None
            result["ratios"] = ratios
            targets_met: dict[str, Any] = {}
            if 32 in concurrencies:
                # issue 23's floor (issue 10's was 0.63) and its aim
                targets_met["rps_ratio_c32_ge_0.70"] = ratios["rps_treg_over_baseline_c32"] is not None and \
                    ratios["rps_treg_over_baseline_c32"] >= 0.70
                targets_met["rps_ratio_c32_ge_0.80"] = ratios["rps_treg_over_baseline_c32"] is not None and \
                    ratios["rps_treg_over_baseline_c32"] >= 0.80
            if 1 in concurrencies:
                targets_met["added_p50_c1_le_1ms"] = ratios["added_p50_ms_vs_baseline_c1"] <= 1.0
                targets_met["p99_c1_le_1.5x_baseline"] = ratios["p99_treg_over_baseline_c1"] is not None and \
                    ratios["p99_treg_over_baseline_c1"] <= 1.5

            # streaming through each relay in turn (interleaved rounds), with the relay's CPU per transfer
            # and treg's own peak RSS read before and after
            if "stream" in only and opts.stream_mib > 0:
                relays = {"baseline": (base.port, "", {}, base.pid),
                          "treg": (treg.port, "/call/bench", {"X-Treg-Token": token}, treg.pid)}
                runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "treg": []}
                for name, (port, prefix, headers, pid) in relays.items():
                    # not measured: the first large transfer of a process pays its buffers' page faults
                    await stream_through(port, prefix, headers, 16 * MiB, opts.stream_timeout, pid)
                sent_to_treg += 2
                mem_before = proc_mem_kib(treg.pid)
                for rnd in range(opts.stream_rounds):
                    # the order alternates: neither relay always runs on the other's heels
                    order = list(relays.items()) if rnd % 2 == 0 else list(reversed(relays.items()))
                    for name, (port, prefix, headers, pid) in order:
                        say(f"stream round {rnd + 1}/{opts.stream_rounds}: {opts.stream_mib} MiB each way "
                            f"through {name} …")
                        runs[name].append(await stream_through(port, prefix, headers, opts.stream_mib * MiB,
                                                               opts.stream_timeout, pid))
                        if name == "treg":
                            sent_to_treg += 2
                mem_after = proc_mem_kib(treg.pid)
                stream = summarize_streams(runs, opts.stream_mib * MiB)
                stream["rss_kib_before"] = mem_before
                stream["rss_kib_after"] = mem_after
                growth = (mem_after["VmHWM"] - mem_before["VmHWM"]) / 1024
                stream["peak_rss_growth_mib"] = round(growth, 1)
                result["streaming"] = stream
                targets_met["rss_growth_lt_30mib"] = growth < 30
                r = stream["ratios"]
                targets_met["download_mib_s_ge_0.9x_baseline"] = r["download_mib_s_treg_over_baseline"] >= 0.9
                targets_met["download_cpu_per_gib_le_1.15x_baseline"] = (
                    r["download_cpu_per_gib_treg_over_baseline"] is not None
                    and r["download_cpu_per_gib_treg_over_baseline"] <= 1.15)

            if "slow" in only and opts.slow_streams > 0:
                say(f"slow streams: {opts.slow_streams} event streams held through treg for ~{opts.slow_events} s …")
                slow = await slow_streams(treg.port, token, treg.pid, streams=opts.slow_streams,
                                          events=opts.slow_events, short_requests=opts.requests_c1,
                                          short_cap=opts.slow_short_cap, warmup=opts.warmup)
                sent_to_treg += opts.slow_streams + slow["short_calls_sent"]
                result["slow_streams"] = slow
                targets_met["slow_streams_all_held"] = slow["ok"]
                targets_met["slow_streams_rss_growth_lt_100mib"] = slow["rss_growth_mib"] < 100
                targets_met["slow_streams_added_p50_le_1ms"] = slow["added_p50_ms"] <= 1.0
            if "archive" in only and opts.archive_calls > 0:
                say(f"archive: {opts.archive_calls} vendor calls ({opts.archive_vendor_ms:g} ms each) and "
                    f"{opts.archive_calls} archive hits through treg …")
                arch = await archive_case(treg.port, token, upstream_url, calls=opts.archive_calls,
                                          vendor_ms=opts.archive_vendor_ms, time_cap=opts.time_cap)
                sent_to_treg += arch["sent"]
                result["archive"] = arch
                targets_met["archive_hit_p50_lt_vendor_p50"] = arch["ok"] and arch["hit_p50_ms"] < arch["vendor_p50_ms"]
            if platform_concurrencies:
                ports = {"own": (treg.port, treg.pid), "platform": (treg.port, treg.pid)}
                if without is not None:
                    ports[plat.REFERENCE] = (without.port, without.pid)
                figures, sent = await plat.measure(opts, ports, token, platform_concurrencies, up.pid, dsn, say)
                sent_to_treg += sent
                if without is not None:
                    await without.stop()  # a clean shutdown writes its audit rows
                figures["money"] = plat.money(dsn, org["org_id"])
                result["platform"] = figures
                targets_met.update(plat.targets_met(figures, platform_concurrencies))
                if without is not None:
                    for c in platform_concurrencies:
                        r = figures["ratios"]
                        # issue 11: a platform call costs no more CPU than before that stages
                        cpu = r.get(f"cpu_per_call_platform_over_without_c{c}")
                        targets_met[f"platform_cpu_per_call_le_1.05x_without_c{c}"] = cpu is not None and cpu <= 1.05
            result["targets_met"] = targets_met

            if spy is not None and spy.returncode is None:
                spy.send_signal(signal.SIGINT)
                await asyncio.wait_for(spy.wait(), 60)
            # a clean shutdown flushes the audit queue: every call sent must have its row
            await treg.stop()
            if opts.loop_probe:
                with contextlib.suppress(OSError, ValueError):
                    result["loop_probe"] = json.loads(Path(opts.loop_probe).read_text())
            result["audit"] = {"calls_sent_to_treg": sent_to_treg, "calls_recorded": count_calls(dsn, org["org_id"])}
        finally:
            for server in reversed(servers):
                await server.stop()
    return result


def summarize_streams(runs: dict[str, list[dict[str, Any]]], total: int) -> dict[str, Any]:
    """Each relay's transfers over all rounds (MiB/s of the summed seconds, CPU seconds per GiB of the
    summed CPU), treg's over the bare relay's, overall and per round. treg's last transfer's own figures
    stay at the top level (statuses, byte counts)."""
    out: dict[str, Any] = dict(runs["treg"][-1])
    per: dict[str, Any] = {}
    gib = total / (1024 * MiB)
    for name, rs in runs.items():
        fig: dict[str, Any] = {"rounds": len(rs), "ok": all(r["ok"] for r in rs)}
        for way in ("upload", "download"):
            secs = sum(r[f"{way}_s"] for r in rs) or 1e-9
            cpu = sum(r[f"{way}_cpu_s"] for r in rs)
            fig[f"{way}_mib_s"] = round(total / MiB * len(rs) / secs, 1)
            fig[f"{way}_cpu_s_per_gib"] = round(cpu / (gib * len(rs)), 3)
            fig[f"{way}_sys_share_pct"] = round(sum(r[f"{way}_sys_s"] for r in rs) / cpu * 100, 1) if cpu else None
            fig[f"{way}_mib_s_per_round"] = [r[f"{way}_mib_s"] for r in rs]
            fig[f"{way}_cpu_s_per_gib_per_round"] = [r[f"{way}_cpu_s_per_gib"] for r in rs]
        per[name] = fig
    out["relays"] = per
    ratios: dict[str, Any] = {}
    t, b = per["treg"], per["baseline"]
    for way in ("upload", "download"):
        ratios[f"{way}_mib_s_treg_over_baseline"] = round(t[f"{way}_mib_s"] / b[f"{way}_mib_s"], 3)
        ratios[f"{way}_mib_s_treg_over_baseline_per_round"] = [
            round(x / y, 3) if y else None for x, y in zip(t[f"{way}_mib_s_per_round"], b[f"{way}_mib_s_per_round"])]
        ratios[f"{way}_cpu_per_gib_treg_over_baseline"] = (
            round(t[f"{way}_cpu_s_per_gib"] / b[f"{way}_cpu_s_per_gib"], 3) if b[f"{way}_cpu_s_per_gib"] else None)
        ratios[f"{way}_cpu_per_gib_treg_over_baseline_per_round"] = [
            round(x / y, 3) if y else None
            for x, y in zip(t[f"{way}_cpu_s_per_gib_per_round"], b[f"{way}_cpu_s_per_gib_per_round"])]
    out["ratios"] = ratios
    out["ok"] = t["ok"] and b["ok"]
    return out


def render(result: dict[str, Any]) -> str:
    lines = [f"machine: {result['machine']}; busy {result['machine_busy_before_pct']}% before the run "
             "(other load)",
             f"load generator: {result['client']} client in its own process; {result['rounds']} round(s) "
             f"interleaved; treg log level {result['treg_log_level']}; pinning: {result.get('pinning', 'off')}",
             f"load average at the start: {', '.join(f'{x:.2f}' for x in result['load_average'])}; parts: "
             f"{', '.join(result['parts'])}", ""]
    if result.get("treg_settings"):  # an experiment: say so above the figures
        lines.insert(-1, "treg settings (not as shipped): "
                     + ", ".join(f"{k}={v}" for k, v in result["treg_settings"].items()))
    head = (f"{'target':<9} {'conc':>4} {'requests':>8} {'errors':>6} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
            f"{'p99.9 ms':>8} {'max ms':>8} {'srv µs/req':>10} {'srv CPU%':>8} {'up CPU%':>7} {'gen CPU%':>8} "
            f"{'busy%':>6}")
    lines.append(head)
    lines.append("-" * len(head))
    for f in result.get("throughput", []):
        us = f["server_cpu_us_per_req"]
        lines.append(f"{f['target']:<9} {f['concurrency']:>4} {f['requests']:>8} {f['errors']:>6} {f['rps']:>9.1f} "
                     f"{f['p50_ms']:>8.3f} {f['p99_ms']:>8.3f} {f['p999_ms']:>8.3f} {f['max_ms']:>8.2f} "
                     f"{('-' if us is None else f'{us:.0f}'):>10} "
                     f"{f['server_cpu_pct']:>8.1f} {f['upstream_cpu_pct']:>7.1f} {f['loadgen_cpu_pct']:>8.1f} "
                     f"{(f['machine_busy_pct'] or 0):>6.1f}")
    for f in result.get("throughput", []):
        if f.get("db_transactions") is not None:
            per = f["db_transactions"] / f["requests"] * 1000 if f["requests"] else 0.0
            lines.append(f"treg at concurrency {f['concurrency']}: {f['db_transactions']} database transactions for "
                         f"{f['requests']} measured calls ({per:.1f} per 1000 calls)")
    lines.append("")
    for key, value in result.get("ratios", {}).items():
        lines.append(f"{key}: {value}")
    s = result.get("streaming")
    if s:
        lines.append("")
        lines.append(f"streaming {s['bytes'] // MiB} MiB each way, {s['relays']['treg']['rounds']} round(s) "
                     f"interleaved (CPU: the relay's process)")
        lines.append(f"{'relay':<9} {'up MiB/s':>9} {'up CPU s/GiB':>12} {'down MiB/s':>10} {'down CPU s/GiB':>14}  ok")
        for name, f in s["relays"].items():
            lines.append(f"{name:<9} {f['upload_mib_s']:>9.1f} {f['upload_cpu_s_per_gib']:>12.3f} "
                         f"{f['download_mib_s']:>10.1f} {f['download_cpu_s_per_gib']:>14.3f}  {f['ok']}")
        for key, value in s["ratios"].items():
            lines.append(f"{key}: {value}")
        lines.append(f"treg's last transfers: upload status {s['upload_status']}, upstream received "
                     f"{s['upload_received']}; download status {s['download_status']}, received "
                     f"{s['download_received']}")
        b, a = s["rss_kib_before"], s["rss_kib_after"]
        lines.append(f"treg RSS: peak (VmHWM) {b['VmHWM'] / 1024:.1f} MiB before, {a['VmHWM'] / 1024:.1f} MiB after "
                     f"(growth {s['peak_rss_growth_mib']} MiB); VmRSS {b['VmRSS'] / 1024:.1f} → "
                     f"{a['VmRSS'] / 1024:.1f} MiB")
    w = result.get("slow_streams")
    if w:
        q, b = w["short_without_streams"], w["short_with_streams"]
        lines.append("")
        lines.append(f"slow streams: {w['streams']} event streams ({w['events_per_stream']} events, one a second) "
                     f"through treg: {w['opened']} opened, all streaming after {w['seconds_until_all_streaming']} s, "
                     f"{w['held_during_short_calls']} held while the short calls ran, {w['completed']} ended whole, "
                     f"{w['failed']} failed {w['errors'] or ''}")
        lines.append(f"short calls (c=1) p50 {q['p50_ms']} ms without the streams, {b['p50_ms']} ms with them "
                     f"(added {w['added_p50_ms']} ms; p99 {q['p99_ms']} → {b['p99_ms']} ms; {b['requests']} calls, "
                     f"{b['errors']} errors)")
        lines.append(f"treg RSS {w['rss_kib_before'] / 1024:.1f} MiB before, peak {w['rss_kib_peak'] / 1024:.1f} MiB "
                     f"while held (growth {w['rss_growth_mib']} MiB), {w['rss_kib_after'] / 1024:.1f} MiB after")
    pf = result.get("platform")
    if pf:
        lines.append("")
        lines.append(f"platform tier beside an own tool, one treg ({pf['price_micro']} µUSD a platform call, held "
                     "and closed; db round trips: treg's own count per call, all / the money path's / the audit "
                     "writer's)")
        for f in pf["throughput"]:
            us = f["server_cpu_us_per_req"]
            lines.append(f"{f['target']:<16} {f['concurrency']:>4} {f['requests']:>8} {f['errors']:>6} "
                         f"{f['rps']:>9.1f} p50 {f['p50_ms']:>7.3f} p99 {f['p99_ms']:>7.3f} ms "
                         f"srv {('-' if us is None else f'{us:.0f}'):>5} µs/call, db round trips "
                         f"{f['db_round_trips_per_call_all']} / {f['db_round_trips_per_call_money']} / "
                         f"{f['db_round_trips_per_call_audit']}, {f['db_transactions_per_call']} transactions")
        for key, value in pf["ratios"].items():
            lines.append(f"{key}: {value}")
        m = pf["money"]
        lines.append(f"money: {m['holds_settled']} holds settled ({m['settled_holds_micro']} µUSD, the balance says "
                     f"{m['balance_settled_micro']}), {m['holds_open']} open, {m['holds_released']} released; "
                     f"{m['leases']} credit leases, charged {m['leases_charged_micro']}")
    a = result.get("archive")
    if a:
        lines.append("")
        lines.append(f"archive: {a['vendor_calls']} calls to a vendor answering in {a['vendor_delay_ms']:g} ms "
                     f"(X-Treg-Cache: bypass) p50 {a['vendor_p50_ms']} ms, p99 {a['vendor_p99_ms']} ms; "
                     f"{a['hit_calls']} archive hits p50 {a['hit_p50_ms']} ms, p99 {a['hit_p99_ms']} ms "
                     f"(hit/vendor p50 {a['hit_p50_over_vendor_p50']}); the vendor saw "
                     f"{a['vendor_lookups_during_hits']} of the hits; {a['errors']} errors")
    probe = result.get("loop_probe")
    if probe:
        lines.append("")
        lines.append("loop probe (CPU time of treg's loop thread): callbacks over 0.3 ms — what, count, "
                     "count over 1 ms, total ms, max ms")
        for row in probe["slow_callbacks"][:10]:
            lines.append(f"  {row}")
        lines.append(f"  garbage collections: {probe['gc']}")
        for key in ("insert_sql", "write_lines"):
            if key in probe:
                lines.append(f"  {key}: CPU ms percentiles {probe[key][0]}, {probe[key][1]:.0f} rows/lines "
                             f"per batch, {probe[key][2]} batches")
    lines.append("")
    lines.append(f"audit: {result['audit']['calls_recorded']} call rows recorded for "
                 f"{result['audit']['calls_sent_to_treg']} calls sent to treg (warm-ups included)")
    for key, ok in result["targets_met"].items():
        lines.append(f"target {key}: {'MET' if ok else 'MISSED'}")
    return "\n".join(lines)


def _setting_arg(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.startswith("TREG_"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected TREG_NAME=VALUE")
    return name, value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=DESCRIPTION)
    p.add_argument("--requests", type=int, default=10000, help="measured requests per round at concurrency > 1")
    p.add_argument("--requests-c1", type=int, default=1500, help="measured requests per round at concurrency 1")
    p.add_argument("--warmup", type=int, default=300, help="unmeasured requests before each phase")
    p.add_argument("--concurrency", default="1,32", help="comma-separated concurrencies (default 1,32)")
    p.add_argument("--rounds", type=int, default=4, help="rounds; direct/baseline/treg interleave in each")
    p.add_argument("--time-cap", type=float, default=30.0, help="seconds one phase may run at most")
    p.add_argument("--stream-mib", type=int, default=512, help="MiB streamed each way through treg (0: skip)")
    p.add_argument("--stream-timeout", type=float, default=600.0, help="seconds one streaming transfer may take")
    p.add_argument("--stream-rounds", type=int, default=2, help="streaming rounds (baseline then treg in each)")
    p.add_argument("--slow-streams", type=int, default=1000, help="event streams held through treg at once (0: skip)")
    p.add_argument("--slow-events", type=int, default=15, help="events per slow stream, one a second")
    p.add_argument("--slow-short-cap", type=float, default=4.0, help="seconds the short calls beside them may take")
    p.add_argument("--archive-calls", type=int, default=200, help="archive case: vendor calls, then as many archive "
                                                                "hits (0: skip)")
    p.add_argument("--archive-vendor-ms", type=float, default=20.0, help="archive case: the vendor's latency (ms)")
    p.add_argument("--platform-requests", type=int, default=5000, help="platform case: measured calls per round "
                                                                     "at concurrency > 1 (0: skip)")
    p.add_argument("--platform-reference", action="store_true", help="platform case: also through a treg without "
                                                                     "issue 11's call-path stages")
    p.add_argument("--only", default="all", help="comma-separated parts to run: tail (the req/s and latency "
                                                  "phases), stream (512 MiB each way), slow (slow streams), "
                                                  "archive (hits against a slow vendor), platform (a platform-tier "
                                                  "call beside an own tool's); all")
    p.add_argument("--client", choices=("raw", "aiohttp"), default="raw", help="load generator")
    p.add_argument("--pin", choices=("auto", "off"), default="auto",
                   help="auto: with 2+ CPUs, the relay under test alone on one CPU, the rest on the others")
    p.add_argument("--treg-log-level", default="INFO", help="TREG_LOG_LEVEL of the treg server (INFO: as shipped)")
    p.add_argument("--treg-setting", metavar="NAME=VALUE", action="append", default=[], type=_setting_arg,
                   help="a TREG_ setting of the treg server (repeatable; an experiment: the figures are of "
                        "treg as shipped without it)")
    p.add_argument("--dsn", help="database for treg (default: TREG_DATABASE_URL, else an embedded server "
                                 "of the run's own; only that one is pinned)")
    p.add_argument("--treg-log", metavar="FILE", help="keep treg's log (stderr) in FILE")
    p.add_argument("--treg-wrapper", metavar="SCRIPT", help=argparse.SUPPRESS)
    p.add_argument("--loop-probe", metavar="FILE", help="run treg under bench/loopprobe.py (loop callbacks and "
                                                       "garbage collections timed; JSON to FILE, summary printed)")
    p.add_argument("--py-spy", metavar="FILE", help="record treg's process with py-spy (collapsed stacks to FILE)")
    p.add_argument("--json-only", action="store_true", help="print only the JSON object")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--serve", choices=("upstream", "baseline"), help=argparse.SUPPRESS)
    p.add_argument("--upstream", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    if opts.serve:
        asyncio.run(serve(opts.serve, opts.upstream))
        return 0
    result = asyncio.run(bench(opts))
    if not opts.json_only:
        print(render(result))
    print(json.dumps(result, separators=(",", ":")))
    return 0
