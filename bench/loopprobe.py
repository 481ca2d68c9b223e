"""``--loop-probe FILE``: runs ``treg serve`` with instruments, and writes what they saw to FILE at exit.

Not part of treg: a measuring aid of the benchmark (docs/performance.md, round 4). In treg's process:

* every event-loop callback is timed in CPU time of the loop's thread (``time.thread_time``: on a
  shared machine, wall time mostly measures the other load); the ones over 0.3 ms are counted by what
  ran (a task by its coroutine and the line it stopped at), with their total and maximum;
* every garbage collection is timed (``gc.callbacks``), those while serving (after ``gc.freeze()``)
  apart from startup's;
* the call handler (wall time), the upstream send (wall time), the audit batch encoding
  (``insert_sql``) and the console's batched writes (CPU time, with the lines per batch).

``PROBE_NO_AUDIT=1`` turns the audit rows off (an experiment: what the audit path costs the tail).
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
def _run(self):
    t0 = clock()
    orig_run(self)
    d = clock() - t0
    if d > 0.0003:
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
handle_t, send_t = [], []
_orig_handle, _orig_send = _call.handle, _up.send
async def handle(request, surface):
    t0 = _wall()
    try:
        return await _orig_handle(request, surface)
    finally:
        handle_t.append(_wall() - t0)
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
atexit.register(lambda: LAT.update({"handle": pcts(handle_t), "send": pcts(send_t), "n": len(handle_t), "insert_sql": [pcts(ins_t), sum(ins_rows) / max(len(ins_rows), 1), len(ins_t)], "write_lines": [pcts(wl_t), sum(wl_n) / max(len(wl_n), 1), len(wl_t)]}))
sys.argv = ["treg", *sys.argv[1:]]
from treg.cli import main
raise SystemExit(main())
