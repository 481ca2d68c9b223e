"""The archive: 2xx catalog answers stored for a while and served again without the vendor.

``store`` (the ``archive_entries`` table: lookup, store, the bounded prune). The endpoint row's
``archive`` descriptor (validated at startup; the key; the rollout) is the catalog's
(``treg/catalog/archive_policy.py``), the call pipeline's half ``treg/call/archive.py``. Contract: docs/lifecycle.md § Result classifiers and the archive.
"""
