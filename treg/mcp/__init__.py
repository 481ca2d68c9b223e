"""treg's MCP surface (``POST /mcp``, ``POST /catalog/mcp``), as plain Python.

* :mod:`treg.mcp.protocol`: the JSON-RPC envelope over streamable HTTP, both protocol revisions in use
  (``2025-11-25`` with its ``initialize`` handshake, ``2026-07-28`` with per-request ``_meta`` and its
  mirrored headers), and method dispatch;
* :mod:`treg.mcp.tools`: the tool list a caller gets (names, JSON Schemas, order) and the mapping of a
  ``tools/call`` to the call pipeline's :class:`~treg.call.types.CallInput`;
* :mod:`treg.mcp.results`: a pipeline outcome or refusal as a ``CallToolResult`` a model can act on;
* :mod:`treg.mcp.search`: catalog search by words or capability (``catalog_search``, and the
  ``did_you_mean`` of every not-found answer);
* :mod:`treg.mcp.backend`: the glue that runs a tool call through the one call pipeline.

Only :mod:`treg.web.mcp` knows about aiohttp.
"""
