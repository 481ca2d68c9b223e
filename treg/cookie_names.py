"""Which cookies of a caller's ``Cookie`` are treg's or its host's, and so never go upstream.

A value (no I/O): the relay's header filter reads it (treg/call/headers.py) and ``Services`` holds the
one built from ``TREG_HOST_COOKIES`` (docs/clients.md, "Cookies of treg's host stay there").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

#: treg's own cookies: scrubbed from a caller's Cookie, and an upstream may not set them
TREG_COOKIES = frozenset({"treg_session", "treg_login", "treg_oauth_state"})
#: cookies of treg's host that no upstream set: a browser sends every cookie of the host with a Try-it
#: call, a followed ``/redirect/`` or a ``/table/`` link, and the login proxy in front of treg (the usual
#: guard of a dashboard) keeps its session there. Relayed, that session reached every vendor called.
#: ``__Host-`` cookies are the host's by construction: one must have ``Path=/``, and every upstream cookie
#: treg relays is scoped to its call's root (treg/call/cookies.py), so no upstream's ``__Host-`` cookie is
#: ever kept. The rest are the session cookies of the common login proxies (Cloudflare Access,
#: oauth2-proxy, Pomerium, Authelia, an AWS ALB's OIDC, traefik-forward-auth, Vouch, mod_auth_openidc,
#: Shibboleth, authentik); ``TREG_HOST_COOKIES`` adds an operator's own. A trailing ``*`` is a prefix.
HOST_COOKIES = ("__Host-*", "CF_Authorization", "CF_AppSession", "_oauth2_proxy*", "_pomerium*",
                "authelia_session", "AWSELBAuthSessionCookie*", "_forward_auth*", "VouchCookie*",
                "mod_auth_openidc_session*", "_shibsession_*", "authentik_proxy_*")


@dataclass(frozen=True)
class HostCookies:
    """The names of the cookies a caller's ``Cookie`` loses before it goes upstream: treg's own and its
    host's (:data:`HOST_COOKIES` and ``TREG_HOST_COOKIES``). Compared case-insensitively: browsers read
    the ``__Host-`` prefix so, and a name that differs from a login proxy's only in case is not worth a
    leak."""

    names: frozenset[str]
    prefixes: tuple[str, ...]

    @classmethod
    def of(cls, extra: Iterable[str] = ()) -> HostCookies:
        names, prefixes = set(TREG_COOKIES), []
        for item in (*HOST_COOKIES, *extra):
            if item.endswith("*"):
                prefixes.append(item[:-1].lower())
            else:
                names.add(item.lower())
        return cls(frozenset(names), tuple(prefixes))

    def owns(self, name: str) -> bool:
        folded = name.lower()
        return folded in self.names or folded.startswith(self.prefixes)


#: treg's own cookies and the built-in host cookies (a settings-less caller: evidence of what was sent)
BUILTIN_HOST_COOKIES = HostCookies.of()
