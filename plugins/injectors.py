"""Built-in credential injectors: ``header``, ``query`` and ``json``.

Registered through the ``treg`` entry-point group like any third-party plugin, and ``trylast`` so a
plugin may override one by registering an injector for the same location.
"""

from __future__ import annotations

from urllib.parse import quote, unquote_plus

from treg import hookimpl
from treg.bindings import Binding, OutgoingRequest
# a header name must be a token (anything else could smuggle a second header), a value free of CTLs
from treg.http_grammar import CTL as _CTL, TOKEN as _TOKEN


class HeaderInjector:
    location = "header"
    needs_json_body = False

    def validate(self, binding: Binding) -> None:
        if not _TOKEN.match(binding.name):
            raise ValueError(f"header name {binding.name!r} is not a valid HTTP header name")
        if binding.name.lower().startswith("x-treg-"):
            raise ValueError("a binding cannot target an X-Treg-* header: those are treg's own and never relayed")
        if _CTL.search(binding.format):
            raise ValueError("a header format cannot contain control characters (CR, LF, …)")

    def inject(self, request: OutgoingRequest, binding: Binding, value: str) -> None:
        rendered = binding.render(value)
        if not rendered.isprintable() and _CTL.search(rendered):  # the C check first: the regex only on doubt
            # a secret with a newline would split the header: refuse rather than send garbage
            raise ValueError(f"the credential for header {binding.name!r} contains control characters")
        request.headers[binding.name] = rendered  # overwrites every caller value of that name


class QueryInjector:
    location = "query"
    needs_json_body = False

    def validate(self, binding: Binding) -> None:
        if not binding.name or any(c in binding.name for c in "&=#"):
            raise ValueError(f"query parameter name {binding.name!r} is not usable")

    def inject(self, request: OutgoingRequest, binding: Binding, value: str) -> None:
        # request.query holds the caller's raw (still percent-encoded) pairs, order and duplicates kept;
        # every pair whose decoded name is ours is replaced by one encoded pair at the end.
        kept = [(k, v) for k, v in request.query if unquote_plus(k) != binding.name]
        kept.append((quote(binding.name, safe=""), quote(binding.render(value), safe="")))
        request.query[:] = kept


class JsonInjector:
    location = "json"
    needs_json_body = True

    def validate(self, binding: Binding) -> None:
        if not binding.name.strip():
            raise ValueError("a json binding needs a top-level field name")

    def inject(self, request: OutgoingRequest, binding: Binding, value: str) -> None:
        if request.json_body is None:
            request.json_body = {}
        request.json_body[binding.name] = binding.render(value)


@hookimpl(trylast=True)
def treg_register_injectors():
    return [HeaderInjector(), QueryInjector(), JsonInjector()]
