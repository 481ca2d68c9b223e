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

Then 512 MiB are streamed each way through treg (upload to an upstream that discards it, download
from one that generates it) while treg's peak RSS (``VmHWM`` of ``/proc/<pid>/status``) is read
before and after.

Every server is its own process (upstream, baseline relay, treg); the load generator is this
process, a raw keep-alive HTTP/1.1 client by default (``--client aiohttp`` for aiohttp's, with a
connector limit equal to the concurrency). All traffic stays on 127.0.0.1. Every loop is bounded by a
request count and a time cap. The figures print as a table, then as one JSON object on the last line.

``--pin auto`` moves PostgreSQL's processes too, but only those of a server the benchmark started
itself (no ``--dsn``, no ``TREG_DATABASE_URL``): a server it was given may be shared.

Modules: ``servers`` (the upstream and the bare relay), ``procs`` (processes and their /proc figures),
``load`` (the load generators), ``phases`` (one measured phase), ``database``, ``through_treg``
(treg's API and the streaming), ``pinning`` (CPU placement), ``run`` (the run and its report).

Internal: ``python -m bench --serve upstream|baseline`` runs one of the helper servers and
prints ``READY <port>`` once it listens.
"""
