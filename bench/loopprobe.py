"""``--loop-probe FILE``: runs ``treg serve`` with instruments, and writes what they saw to FILE at exit.

Not part of treg: a measuring aid of the benchmark (docs/performance.md, round 4). In treg's process:

* every event-loop callback is timed in CPU time of the loop's thread (``time.thread_time``: on a
  shared machine, wall time mostly measures the other load); the ones over 0.3 ms are counted by what
  ran (a task by its coroutine and the line it stopped at), with their total and maximum;
* every garbage collection is timed (``gc.callbacks``), those while serving (after ``gc.freeze()``)
  apart from startup's;
* the call handler (wall time), the upstream send (wall time), the audit batch encoding
  (``insert_sql``) and the console's batched writes (CPU time, with the lines per batch);
* the audit statements' times: ``audit_overlap`` is the share of the calls over 1.5 ms whose time
  overlaps an audit statement's (or the 5 ms after it), beside that share for every call;
* ``slow_detail``: the 40 slowest calls, each with its wall time, the loop's CPU time meanwhile (at
  c=1 that is the call's own work and any background work), its upstream send's wall time, and the
  callbacks over 0.3 ms that ran during it (start in ms from the call's, CPU ms, what ran).

``PROBE_NO_AUDIT=1`` turns the audit rows off (an experiment: what the audit path costs the tail);
``PROBE_NO_AUDIT_DB=1`` builds, queues and encodes them but does not send the statement (what the
database's share of it costs); ``PROBE_CPROFILE=FILE`` profiles the serving process with cProfile
from its 2 000th call and writes the stats to FILE at exit (slow: an order of the costs, not their size);
``PROBE_LEAN_CALLS=1`` drops the ``calls`` table's foreign key and four filter indexes before serving
(an experiment on the benchmark's own database: what the indexes cost the tail, round 9);
``=fk`` drops the foreign key alone, ``=outcome`` that and makes the outcome index partial.
"""
import asyncio, atexit, gc, json, os, sys, time, collections

OUT = os.environ["PROBE_OUT"]
clock = time.thread_time
gc_log = []
_start = [0.0]
serving = [False]
def cb(phase, info):
    if phase == "start":
        _start[0] = clock()
    else:
        gc_log.append((info["generation"] + (10 if serving[0] else 0), clock() - _start[0]))
gc.callbacks.append(cb)
_freeze = gc.freeze
def _serving_freeze():
    _freeze()
    serving[0] = True
gc.freeze = _serving_freeze

slow = collections.defaultdict(lambda: [0, 0, 0.0, 0.0])  # >0.3ms, >1ms, total over 0.3, max
hist = collections.Counter()
orig_run = asyncio.events.Handle._run
def name_of(cbk):
    owner = getattr(cbk, "__self__", None)
    if isinstance(owner, asyncio.Task):
        coro = owner.get_coro()
        fr = getattr(coro, "cr_frame", None)
        where = f"@{fr.f_code.co_name}:{fr.f_lineno}" if fr else ""
        return f"task:{getattr(coro, '__qualname__', coro)}{where}"
    return getattr(cbk, "__qualname__", None) or repr(cbk)[:80]
slow_at = []  # (wall start, CPU, what) of callbacks over 0.3 ms: what ran during a slow call
def _run(self):
    t0, w0 = clock(), time.perf_counter()
    orig_run(self)
    d = clock() - t0
    if d > 0.0003:
        slow_at.append((w0, d, name_of(self._callback)))
        s = slow[name_of(self._callback)]
        s[0] += 1
        if d > 0.001:
            s[1] += 1
        s[2] += d
        s[3] = max(s[3], d)
asyncio.events.Handle._run = _run

def dump():
    by_gen = collections.defaultdict(list)
    for g, d in gc_log:
        by_gen[g].append(d)
    out = {"gc": {("serving gen %d" % (g - 10) if g >= 10 else "startup/shutdown gen %d" % g): {"n": len(v), "total_ms": round(sum(v) * 1000, 1), "max_ms": round(max(v) * 1000, 2),
                      "over_1ms": sum(1 for x in v if x > 0.001), "mean_ms": round(sum(v) / len(v) * 1000, 3)}
                  for g, v in by_gen.items()},
           "slow_callbacks": sorted(([k, v[0], v[1], round(v[2] * 1000, 1), round(v[3] * 1000, 2)] for k, v in slow.items()),
                                    key=lambda x: -x[1])}
    out.update(LAT)
    with open(OUT, "w") as fh:
        json.dump(out, fh, indent=1)
atexit.register(dump)

import treg.web.call as _call, treg.infra.upstream as _up
_wall = time.perf_counter
handle_t, send_t, handle_at, audit_at, slow_detail = [], [], [], [], []
_orig_handle, _orig_send = _call.handle, _up.send
async def handle(request, surface):
    t0, c0, s0 = _wall(), clock(), len(send_t)
    try:
        return await _orig_handle(request, surface)
    finally:
        handle_t.append(_wall() - t0)
        handle_at.append((t0, _wall()))
        if handle_t[-1] > 0.0015:  # at c=1 the loop's CPU meanwhile is this call's (and background work's)
            slow_detail.append((handle_t[-1], clock() - c0, send_t[-1] if len(send_t) > s0 else None, t0))
async def send(*a, **kw):
    t0 = _wall()
    try:
        return await _orig_send(*a, **kw)
    finally:
        send_t.append(_wall() - t0)
_call.handle, _up.send = handle, send
if os.environ.get("PROBE_NO_AUDIT"):
    import treg.call.audit as _audit
    _audit.AuditWriter.record = lambda self, rec: None
if os.environ.get("PROBE_NO_AUDIT_DB"):  # the rows built, queued and encoded, the statement not sent
    import treg.infra.db as _db
    _orig_run = _db.Database.run
    async def _run_but_audit(self, sql, params, *, path="other"):
        if path == "audit":
            await asyncio.sleep(0.001)
            return []
        return await _orig_run(self, sql, params, path=path)
    _db.Database.run = _run_but_audit
import treg.infra.db as _tdb
_orig_db_run = _tdb.Database.run
async def _timed_run(self, sql, params, *, path="other"):
    t0 = _wall()
    try:
        return await _orig_db_run(self, sql, params, path=path)
    finally:
        if path == "audit":
            audit_at.append((t0, _wall()))
_tdb.Database.run = _timed_run
def _overlap():
    """Of the calls over 1.5 ms (wall, in treg), the share whose time overlaps an audit statement's (or
    the 5 ms after it), beside that share for every call: the audit write's effect on the tail."""
    import bisect
    spans = sorted((a, b + 0.005) for a, b in audit_at)
    starts = [a for a, _ in spans]
    def hit(t0, t1):
        i = bisect.bisect_right(starts, t1)
        return any(b >= t0 for _, b in spans[max(0, i - 3):i])
    slow_calls = [(a, b) for a, b in handle_at if b - a > 0.0015]
    share = lambda v: round(sum(hit(a, b) for a, b in v) / len(v), 3) if v else None
    return {"audit_statements": len(spans), "slow_calls": len(slow_calls), "slow_overlapping_audit": share(slow_calls),
            "all_overlapping_audit": share(handle_at)}
import treg.call.audit as _au
ins_t, ins_rows, wl_t, wl_n = [], [], [], []
_orig_ins = _au.insert_sql
def insert_sql(batch):
    t0 = clock()
    try:
        return _orig_ins(batch)
    finally:
        ins_t.append(clock() - t0); ins_rows.append(len(batch))
_au.insert_sql = insert_sql
import treg.web.access_log as _access
_orig_wl = _access.AccessSink.take
def _write_lines(self):
    n = len(self._kept)
    t0 = clock()
    try:
        return _orig_wl(self)
    finally:
        if n:
            wl_t.append(clock() - t0); wl_n.append(n)
_access.AccessSink.take = _write_lines
def pcts(v):
    v = sorted(v)
    return {p: round(v[min(len(v) - 1, int(len(v) * p / 100))] * 1000, 3) for p in (50, 90, 99, 99.9)} if v else {}
LAT = {}
atexit.register(lambda: LAT.update({"handle": pcts(handle_t), "send": pcts(send_t), "n": len(handle_t), "insert_sql": [pcts(ins_t), sum(ins_rows) / max(len(ins_rows), 1), len(ins_t)], "write_lines": [pcts(wl_t), sum(wl_n) / max(len(wl_n), 1), len(wl_t)], "audit_overlap": _overlap(), "slow_detail": [(w, c, sn, [(round((a - t0) * 1000, 2), round(d * 1000, 2), n) for a, d, n in slow_at if t0 - 0.002 <= a <= t0 + w]) for w, c, sn, t0 in sorted(slow_detail, reverse=True)[:40]]}))
if os.environ.get("PROBE_CPROFILE"):  # a deterministic profile of the serving process, from its 2 000th call
    import cProfile
    _prof = cProfile.Profile()
    _seen = [0]
    _profiled_handle = _call.handle
    async def _profiling_handle(request, surface):
        _seen[0] += 1
        if _seen[0] == 2000:
            _prof.enable()
        return await _profiled_handle(request, surface)
    _call.handle = _profiling_handle
    atexit.register(lambda: (_prof.disable(), _prof.dump_stats(os.environ["PROBE_CPROFILE"])))
if os.environ.get("PROBE_LEAN_CALLS"):  # an experiment: `calls` with its key and (org_id, created_at) only
    import psycopg2
    from treg.infra import migrate as _migrate
    _migrate.upgrade(os.environ["TREG_DATABASE_URL"])
    _c = psycopg2.connect(os.environ["TREG_DATABASE_URL"]); _c.autocommit = True
    with _c.cursor() as _cur:
        _cur.execute("ALTER TABLE calls DROP CONSTRAINT IF EXISTS fk_calls_org_id_orgs")
        if os.environ["PROBE_LEAN_CALLS"] == "outcome":  # and the outcome index only for the rarer outcomes
            _cur.execute("DROP INDEX ix_calls_org_id_outcome_created_at")
            _cur.execute("CREATE INDEX ix_calls_org_id_outcome_created_at ON calls (org_id, outcome, created_at) "
                         "WHERE outcome <> 'ok'")
        for _ix in () if os.environ["PROBE_LEAN_CALLS"] in ("fk", "outcome") else (
                "ix_calls_org_id_member_id_created_at", "ix_calls_org_id_outcome_created_at",
                "ix_calls_org_id_tool_name_created_at", "ix_calls_org_id_created_at_upstream_failed"):
            _cur.execute(f"DROP INDEX IF EXISTS {_ix}")
    _c.close()
sys.argv = ["treg", *sys.argv[1:]]
from treg.cli import main
raise SystemExit(main())
