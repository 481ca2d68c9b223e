"""The archive: 2xx catalog answers stored for a while and served again without the vendor.

``policy`` (the endpoint row's ``archive`` descriptor, validated at startup; the key; the rollout),
``store`` (the ``archive_entries`` table: lookup, store, the bounded prune). The call pipeline's half
is ``treg/call/archive.py``. Contract: docs/lifecycle.md § Result classifiers and the archive.
"""
