"""Fake vendors over real sockets on 127.0.0.1, each with the provider rows (or third-party plugin file)
declaring it, one module per feature under test. Import them by module: their constants share names
(``PLATFORM_KEY``, ``write_plugin``, ``Vendor``) on purpose, one set per vendor.

* ``archive``    — a people-search vendor and a result-classifier plugin file (the archive);
* ``async_jobs`` — ``vidgen``, an async video vendor: submit, poll, fetch with ranges (async jobs);
* ``capacity``   — ``vend``, a scripted vendor with capacity signature rows; ``strike_lock`` (capacity);
* ``hub``        — ``hub_pair``: a publishing org whose tool injects ``SECRET`` into a raw upstream, published
  as a hub tool, and a calling org; ``echo_answer``, an upstream that echoes the credential (hub tools);
* ``oauth``      — ``FakeOAuth``, a scripted OAuth 2.0 provider counting its token requests, and
  ``consent_by_http``, a person's consent as plain HTTP (OAuth connections);
* ``overflow``   — a vendor with overflow routes, a fake Orthogonal and a fake Monid (overflow);
* ``resources``  — ``hooky``, a vendor of durable webhooks (owned resources);
* ``tables``     — ``crm``, a contacts vendor with formula-injection cells, table rows (``/table/``, the
  public demo).
"""
