"""The relay benchmark: ``python -m bench`` from a checkout (figures and setup: docs/performance.md).

It lives beside ``treg/``, not in it: a benchmark is a tool of treg's developers, not part of what an
installed treg does, so the wheel does not ship it (setup.py finds packages under ``treg/``, ``plugins/``
and ``migrations/`` only). It drives treg from outside, as an operator would: ``python -m treg serve``
and ``python -m treg init`` in subprocesses, HTTP on 127.0.0.1.

One run, one upstream, three ways to reach it, each at concurrency 1 and 32:

* ``direct``   — the load generator calls the upstream itself;
* ``baseline`` — a bare aiohttp pass-through relay (``bench/servers.py``) (stream in → one shared
  ``ClientSession`` → upstream → ``StreamResponse``, keep-alive both sides): what any relay costs;
* ``treg``     — a real ``treg serve`` (its own process, its own database, auditing on as shipped)
  answering ``/call/bench/small`` for a tool with a header binding.

Every phase reports p50, p99, p99.9 and the slowest request, and treg's p99 over the bare relay's.

Then 512 MiB are streamed each way through the bare relay and through treg, in interleaved rounds
(upload to an upstream that discards it, download from one that generates it): MiB/s and the relay
process's CPU seconds per GiB (``/proc/<pid>/stat``), treg's over the bare relay's; treg's peak RSS
(``VmHWM`` of ``/proc/<pid>/status``) is read before and after.

Then the slow streams (``bench/slow.py``): 1,000 event streams (one ``data:`` event a second) held
through treg at once while short calls are timed against the same calls just before; treg's RSS
growth meanwhile.

Then the archive case (``bench/archive.py``): a catalog endpoint whose vendor answers in 20 ms, called
with ``X-Treg-Cache: bypass`` (the vendor every time) and then as archive hits (the vendor never, its
own count says so): p50/p99 of each. ``--only tail|stream|slow|archive`` (comma-separated) runs some
parts alone.

Every server is its own process (upstream, baseline relay, treg); the load generator is this
process, a raw keep-alive HTTP/1.1 client by default (``--client aiohttp`` for aiohttp's, with a
connector limit equal to the concurrency). All traffic stays on 127.0.0.1. Every loop is bounded by a
request count and a time cap. The figures print as a table, then as one JSON object on the last line.

``--pin auto`` moves PostgreSQL's processes too, but only those of a server the benchmark started
itself (no ``--dsn``, no ``TREG_DATABASE_URL``): a server it was given may be shared.

Modules: ``servers`` (the upstream and the bare relay), ``procs`` (processes and their /proc figures),
``load`` (the load generators), ``phases`` (one measured phase), ``database``, ``through_treg``
(treg's API and the streaming), ``slow`` (the slow streams), ``archive`` (the archive case), ``pinning`` (CPU placement), ``run`` (the run and its report).

Internal: ``python -m bench --serve upstream|baseline`` runs one of the helper servers and
prints ``READY <port>`` once it listens.
"""
