"""Asynchronous jobs on treg's own provider accounts (docs/lifecycle.md "Async jobs").

* ``spec.py``: the endpoint row's ``async`` descriptor and its poll/fetch utilities, validated with the
  catalog at startup (pure; the catalog loader calls it);
* ``store.py``: the ``async_jobs`` table: who owns a vendor job, the hold it keeps open, its state and
  the fetch ids learned from it;
* the call pipeline's half is ``treg/call/jobs.py``.

Nothing is imported here, so the catalog loader can import ``spec`` without the database layer.
"""
