"""Asynchronous jobs on treg's own provider accounts (docs/lifecycle.md "Async jobs").

* the endpoint row's ``async`` descriptor and its poll/fetch utilities, validated with the catalog at
  startup, are the catalog's (pure: ``treg/catalog/async_jobs.py``);
* ``store.py``: the ``async_jobs`` table: who owns a vendor job, the hold it keeps open, its state and
  the fetch ids learned from it;
* the call pipeline's half is ``treg/call/jobs.py``.
"""
