"""The frozen catalog one treg process runs with: providers and endpoints by id, built once at startup."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Iterable, Mapping

from treg.catalog.model import Endpoint, Provider, join_url


@dataclass(frozen=True)
class CatalogRegistry:
    providers: Mapping[str, Provider]
    endpoints: Mapping[str, Endpoint]
    #: capability → endpoint ids, in id order
    capabilities: Mapping[str, tuple[str, ...]]

    @classmethod
    def build(cls, providers: Iterable[Provider], endpoints: Iterable[Endpoint]) -> "CatalogRegistry":
        provs = {p.id: p for p in sorted(providers, key=lambda p: p.id)}
        eps = {e.id: e for e in sorted(endpoints, key=lambda e: e.id)}
        caps: dict[str, list[str]] = {}
        for ep in eps.values():
            if ep.capability:
                caps.setdefault(ep.capability, []).append(ep.id)
        return cls(MappingProxyType(provs), MappingProxyType(eps),
                   MappingProxyType({k: tuple(v) for k, v in caps.items()}))

    @classmethod
    def empty(cls) -> "CatalogRegistry":
        return cls.build((), ())

    def __len__(self) -> int:
        return len(self.endpoints)

    def get(self, endpoint_id: str) -> Endpoint | None:
        return self.endpoints.get(endpoint_id)

    def provider(self, provider_id: str) -> Provider | None:
        return self.providers.get(provider_id)

    def provider_of(self, endpoint: Endpoint) -> Provider:
        return self.providers[endpoint.provider]

    def endpoints_of(self, provider_id: str) -> tuple[Endpoint, ...]:
        provider = self.providers.get(provider_id)
        return tuple(self.endpoints[e] for e in provider.endpoint_ids) if provider else ()

    def with_capability(self, capability: str) -> tuple[Endpoint, ...]:
        return tuple(self.endpoints[e] for e in self.capabilities.get(capability, ()))

    def root_url(self, endpoint: Endpoint) -> str:
        """The approved root an endpoint's path is appended to: its catalog host or the provider's base URL."""
        return endpoint.host or self.providers[endpoint.provider].base_url

    def template_url(self, endpoint: Endpoint) -> str:
        """Root + the path template, slots unfilled (for display)."""
        return join_url(self.root_url(endpoint), endpoint.path)

    def search(self, *, provider: str | None = None, capability: str | None = None, q: str | None = None,
               status: str | None = None) -> list[Endpoint]:
        """Endpoints matching every given filter; ``q``: each word must appear (case-insensitive) in the id,
        capability, description or provider name."""
        words = [w for w in (q or "").lower().split() if w]
        out = []
        for ep in self.endpoints.values():
            if provider is not None and ep.provider != provider:
                continue
            if capability is not None and ep.capability != capability:
                continue
            if status is not None and ep.status != status:
                continue
            if words:
                prov = self.providers[ep.provider]
                text = " ".join(filter(None, (ep.id, ep.capability, ep.description, prov.name, ep.path))).lower()
                if not all(w in text for w in words):
                    continue
            out.append(ep)
        return out
