"""OAuth connections (docs/oauth.md): a person grants access once in a browser, treg holds the grant as a
*connection* (a credential like a secret), refreshes it, and injects its access token exactly as a secret
is injected. The agent only ever holds its treg token.

One module per concern, plain Python below the web edge:

* ``errors``       — the refusals (``connection_needs_reauth``, ``oauth_refresh_failed``, …);
* ``apps``         — the OAuth client of a provider: an org's own (``/api/v1/oauth-apps``), else the
  deployment's (``TREG_OAUTH_CLIENT_ID_<P>`` / ``TREG_OAUTH_CLIENT_SECRET_<P>``);
* ``links``        — the opaque parts of a consent: connect links, the page's form token, state, PKCE,
  the browser's ``treg_oauth_state`` cookie (HMACs under purpose keys of the master key, SHA-256 at rest);
* ``store``        — connection rows: created, listed, deleted, cached per org beside the secret rows;
* ``token_client`` — the token endpoint: code exchange, refresh, RFC 7009 revocation, over one vetted
  session (``treg/oauth_runtime.py``), with no database connection held while it is awaited;
* ``consent``      — the consent flow: the link's page, its button, the callback;
* ``refresh``      — refresh before expiry under a PostgreSQL lease, one per connection across processes;
* ``credentials``  — the thin hooks the call pipeline and the catalog ladder call.

Two parts live below the services instead, so the layers below can hold them: a provider row's
``oauth`` block, its frozen type and its startup check, is the catalog's (``treg/catalog/oauth.py``, as
every row descriptor), and what one process keeps for OAuth (its token session, its refreshes in
flight) is ``treg/oauth_runtime.py``, a field of the services.
"""
