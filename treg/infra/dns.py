"""treg's upstream resolver: what was vetted is what is dialled.

The seed re-resolves a host just before the send and checks the answer, which leaves a window: the
connector resolves again on its own and may get a different (internal) answer — DNS rebinding. Here
the resolver the shared ``ClientSession``'s connector uses *is* the check: :class:`VettingResolver`
resolves with dnspython (``TREG_DNS_NAMESERVERS``, else the system's resolv.conf), refuses the whole
name when any address is internal under the app's :class:`~treg.infra.ssrf.SsrfPolicy`, and hands the
connector only the addresses it checked, as numeric hosts. The connector runs with
``use_dns_cache=False``, so every new connection asks this resolver.

The relay calls :meth:`VettingResolver.vet` before *every* send as well: a kept-alive connection is
reused without asking the resolver, and a name that now points inside must not get one more request
through an old connection. Numeric hosts never reach a resolver in aiohttp (it dials the literal), so
``vet`` is their only check — and a literal cannot change between check and connect.

Answers are cached per (name, type) no longer than the record TTL (the smallest along a CNAME chain;
a negative answer as long as its SOA says, RFC 2308); a TTL of 0 is never cached. Concurrent lookups
of one name share one query. Errors raised inside ``resolve()`` are :class:`~treg.errors.TregError`
(not ``OSError``), so aiohttp lets them through unwrapped; :func:`unwrap_treg_error` still digs one out
of a wrapped chain for safety.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import aiohttp.abc
import dns.asyncresolver
import dns.exception
import dns.name
import dns.nameserver
import dns.rdatatype
import dns.resolver

from treg.errors import ConfigError, GatewayFailed, SsrfRefused, TregError
from treg.infra.ssrf import (IPAddress, SsrfPolicy, loopback_name, normalize_host, parse_numeric_host,
                             site_local_name)
from treg.memo import BoundedMemo
from treg.settings import Settings

log = logging.getLogger(__name__)

#: longest a whole resolution (A and AAAA together, all nameservers and retries) may take
LIFETIME_S = 5.0
#: longest one nameserver may take to answer one query before the next is tried
ATTEMPT_TIMEOUT_S = 2.0
#: cache entries kept at most (least recently used dropped first)
CACHE_SIZE = 4096
#: no answer is kept longer than this, whatever its TTL says
MAX_TTL_S = 3600.0

_LOOPBACK = (ipaddress.IPv4Address("127.0.0.1"), ipaddress.IPv6Address("::1"))
_NUMERIC_FLAGS = socket.AI_NUMERICHOST | socket.AI_NUMERICSERV


def unwrap_treg_error(exc: BaseException) -> TregError | None:
    """The TregError an aiohttp exception wraps (via ``__cause__``/``__context__``), if any."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, TregError):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def parse_nameservers(values: tuple[str, ...] | list[str]) -> list[tuple[str, int]]:
    """``TREG_DNS_NAMESERVERS`` entries as (ip, port): ``ip``, ``ip:port``, ``[v6]`` or ``[v6]:port``."""
    out: list[tuple[str, int]] = []
    for raw in values:
        text = raw.strip()
        host, port_text = text, None
        if text.startswith("["):
            host, sep, rest = text[1:].partition("]")
            if not sep or (rest and not rest.startswith(":")):
                host = ""  # unbalanced bracket or junk after it
            elif rest:
                port_text = rest[1:]
        elif text.count(":") == 1:
            host, port_text = text.split(":")
        try:
            addr = ipaddress.ip_address(host)
            if port_text is not None and not (port_text.isascii() and port_text.isdigit()):
                raise ValueError("bad port")
            port = int(port_text) if port_text is not None else 53
            if not 0 < port < 65536:
                raise ValueError("bad port")
        except ValueError as exc:
            raise ConfigError(f"setting TREG_DNS_NAMESERVERS: {raw!r} is not an `ip` or `ip:port` "
                              "(IPv6 with a port as `[::1]:53`)", code="bad_setting") from exc
        out.append((str(addr), port))
    return out


@dataclass(frozen=True)
class _Entry:
    addresses: tuple[IPAddress, ...]
    expires: float


class VettingResolver(aiohttp.abc.AbstractResolver):
    """The resolver of treg's upstream connector and of its call-time SSRF check.

    Public API: :meth:`vet` (resolve + refuse, before every send), :meth:`addresses` (resolve only,
    for registration-time checks), :meth:`resolve` (aiohttp's interface), :meth:`close`.
    """

    def __init__(self, settings: Settings, policy: SsrfPolicy, *, lifetime: float = LIFETIME_S,
                 attempt_timeout: float = ATTEMPT_TIMEOUT_S, cache_size: int = CACHE_SIZE,
                 clock: Callable[[], float] = time.monotonic, resolv_conf: str = "/etc/resolv.conf") -> None:
        self._policy = policy
        self._check = settings.proxy_ssrf_check and policy.enabled
        self._lifetime = lifetime
        self._clock = clock
        self._cache: OrderedDict[tuple[str, int], _Entry] = OrderedDict()
        self._cache_size = cache_size
        self._verdicts: BoundedMemo[IPAddress, bool] = BoundedMemo(cache_size)
        self._names: BoundedMemo[str, tuple[str, tuple[IPAddress, ...] | None]] = BoundedMemo(cache_size)
        #: a host that needs no DNS (numeric, localhost) → the addresses :meth:`vet` allowed: its answer cannot
        #: change while the process runs (a refusal is never kept: it raises and logs each time). A speed
        #: trick, with the two memos below: the policy's walk on every send cost ~8 k instructions a call
        #: (docs/performance.md, round 16)
        self._fixed_vetted: BoundedMemo[str, tuple[IPAddress, ...]] = BoundedMemo(cache_size)
        #: the same for a name DNS answers, by the answer judged: (the very tuple :meth:`_lookup` returned,
        #: the addresses allowed). A new answer (a refreshed or expired record) is a new tuple, judged again
        self._answer_vetted: BoundedMemo[str, tuple[tuple[IPAddress, ...], tuple[IPAddress, ...]]] = \
            BoundedMemo(cache_size)
        #: name → (its A entry, its AAAA entry, their addresses joined): one tuple per pair of fresh records,
        #: so the answer's identity says it is the one judged before
        self._joined: BoundedMemo[str, tuple[_Entry, _Entry, tuple[IPAddress, ...]]] = BoundedMemo(cache_size)
        self._inflight: dict[tuple[str, int], asyncio.Future[tuple[IPAddress, ...]]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._dns: dns.asyncresolver.Resolver | None
        servers = parse_nameservers(settings.dns_nameservers)
        if servers:
            self._dns = dns.asyncresolver.Resolver(configure=False)
            self._dns.nameservers = [dns.nameserver.Do53Nameserver(ip, port) for ip, port in servers]
        else:
            try:
                self._dns = dns.asyncresolver.Resolver(filename=resolv_conf, configure=True)
            except (dns.resolver.NoResolverConfiguration, OSError, ValueError) as exc:
                # no usable resolv.conf (containers, some platforms): the system resolver answers
                # instead, without TTLs, so nothing from it is cached
                log.info("no usable %s (%s): upstream names resolve through getaddrinfo", resolv_conf, exc)
                self._dns = None
        if self._dns is not None:
            self._dns.cache = None  # ours honours TTL 0 and is bounded
            self._dns.timeout = attempt_timeout
            self._dns.lifetime = lifetime
            self._dns.retry_servfail = False

    @property
    def uses_system_resolver(self) -> bool:
        """True when names go through getaddrinfo (no resolv.conf and no TREG_DNS_NAMESERVERS)."""
        return self._dns is None

    # -- public -------------------------------------------------------------------------------------

    async def vet(self, host: str) -> list[IPAddress]:
        """The addresses ``host`` may be dialled at now; refuses when any is internal.

        Raises :class:`SsrfRefused` (502, ``ssrf_refused``) when the policy refuses an address and
        :class:`~treg.errors.GatewayFailed` (502, ``dns_failed``) when the name does not resolve.
        With ``TREG_PROXY_SSRF_CHECK=0`` nothing is refused.
        """
        vetted = self._fixed_vetted.get(host)
        if vetted is not None:
            return list(vetted)
        name, fixed = self._normalize(host)
        if fixed is not None:
            return list(self._fixed_vetted.put(host, tuple(self._vetted(name, fixed))))
        addrs = await self._lookup(name)
        known = self._answer_vetted.get(name)
        if known is not None and known[0] is addrs:  # this very answer was judged (and allowed) before
            return list(known[1])
        allowed = self._vetted(name, addrs)
        self._answer_vetted.put(name, (addrs, tuple(allowed)))
        return allowed

    def _vetted(self, name: str, addrs: tuple[IPAddress, ...]) -> list[IPAddress]:
        if not self._check:
            return list(addrs)
        refused = tuple(a for a in addrs if not self._allowed(a))
        if not refused and site_local_name(name):
            # *.local / *.internal name a network's inside whatever they resolve to: only exempted ones
            refused = tuple(a for a in addrs if not self._policy.exempt(a))
        if refused:
            if _is_localhost(name) and len(refused) < len(addrs):
                # localhost is a fixed mapping, not an answer anyone controls: dial the loopback
                # addresses TREG_SSRF_ALLOW permits (127.0.0.0/8 without ::1 is the common setup)
                return [a for a in addrs if a not in refused]
            log.warning("ssrf: refused upstream host %s (resolves to %s)", name,
                        ", ".join(map(str, refused)))
            raise SsrfRefused(f"the upstream host {name} resolves to an internal address; treg only relays "
                              "to public hosts (TREG_SSRF_ALLOW exempts CIDRs for local development)",
                              addresses=refused)
        return list(addrs)

    def _normalize(self, host: str) -> tuple[str, tuple[IPAddress, ...] | None]:
        # parsing numeric spellings costs more than the cached lookup itself: remember (bounded)
        known = self._names.get(host)
        return known if known is not None else self._names.put(host, _normalize(host))

    def _allowed(self, addr: IPAddress) -> bool:
        # the policy's verdict for an address never changes while the process runs; ipaddress's
        # is_private/is_global walk tables (docs/performance.md), so remember verdicts (bounded)
        verdict = self._verdicts.get(addr)
        return verdict if verdict is not None else self._verdicts.put(addr, self._policy.allowed(addr))

    async def addresses(self, host: str) -> list[IPAddress]:
        """Every address ``host`` resolves to now, internal ones included (no policy applied).

        Raises :class:`~treg.errors.GatewayFailed` (``dns_failed``) when the name does not resolve.
        """
        name, fixed = self._normalize(host)
        return list(fixed) if fixed is not None else list(await self._lookup(name))

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[aiohttp.abc.ResolveResult]:
        """aiohttp's interface: only vetted addresses, as numeric hosts, so the connector dials
        exactly what :meth:`vet` checked."""
        out: list[aiohttp.abc.ResolveResult] = []
        for addr in await self.vet(host):
            fam = socket.AF_INET6 if addr.version == 6 else socket.AF_INET
            if family not in (socket.AF_UNSPEC, fam):
                continue
            out.append({"hostname": host, "host": str(addr), "port": port, "family": fam, "proto": 0,
                        "flags": _NUMERIC_FLAGS})
        if not out:
            want = "IPv6" if family == socket.AF_INET6 else "IPv4"
            raise GatewayFailed(f"the upstream host {host} has no {want} address", code="dns_failed")
        return out

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._cache.clear()

    # -- resolution ---------------------------------------------------------------------------------

    async def _lookup(self, name: str) -> tuple[IPAddress, ...]:
        if self._dns is None:
            return await self._system_lookup(name)
        # the hot path (every relayed call vets): both answers fresh in the cache, no task, no await
        now = self._clock()
        a, aaaa = self._cache.get((name, dns.rdatatype.A)), self._cache.get((name, dns.rdatatype.AAAA))
        if a is not None and aaaa is not None and now < a.expires and now < aaaa.expires:
            if a.addresses or aaaa.addresses:
                joined = self._joined.get(name)
                if joined is None or joined[0] is not a or joined[1] is not aaaa:
                    joined = self._joined.put(name, (a, aaaa, a.addresses + aaaa.addresses))
                return joined[2]
        results = await asyncio.gather(self._cached(name, dns.rdatatype.A), self._cached(name, dns.rdatatype.AAAA),
                                       return_exceptions=True)
        addrs: list[IPAddress] = []
        errors: list[BaseException] = []
        for res in results:
            if isinstance(res, BaseException):
                if isinstance(res, asyncio.CancelledError):
                    raise res
                errors.append(res)
            else:
                addrs.extend(res)
        if addrs:
            # a family whose query failed is simply not dialled: everything returned was answered
            return tuple(addrs)
        for err in errors:
            if isinstance(err, TregError):
                raise err
        for err in errors:  # pragma: no cover - _query maps every dnspython error
            raise GatewayFailed(f"the upstream host {name} could not be resolved", code="dns_failed") from err
        raise GatewayFailed(f"the upstream host {name} has no address (no A or AAAA record)", code="dns_failed")

    async def _cached(self, name: str, rdtype: int) -> tuple[IPAddress, ...]:
        key = (name, rdtype)
        entry = self._cache.get(key)
        if entry is not None:
            if self._clock() < entry.expires:
                self._cache.move_to_end(key)
                return entry.addresses
            del self._cache[key]
        pending = self._inflight.get(key)
        if pending is None:
            # one query per (name, type) however many callers wait; a task so one caller's
            # cancellation does not cancel the others' lookup
            task = asyncio.ensure_future(self._query(name, rdtype))
            self._tasks.add(task)
            self._inflight[key] = task
            task.add_done_callback(lambda t, k=key: self._done(k, t))
            pending = task
        return await asyncio.shield(pending)

    def _done(self, key: tuple[str, int], task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if self._inflight.get(key) is task:
            del self._inflight[key]
        if not task.cancelled():
            task.exception()  # retrieved: a failure nobody awaited must not be logged as lost

    async def _query(self, name: str, rdtype: int) -> tuple[IPAddress, ...]:
        assert self._dns is not None
        started = self._clock()
        try:
            answer = await asyncio.wait_for(
                self._dns.resolve(dns.name.from_text(name), rdtype, raise_on_no_answer=False,
                                  lifetime=self._lifetime),
                self._lifetime + 0.5)
        except dns.resolver.NXDOMAIN as exc:
            raise GatewayFailed(f"the upstream host {name} does not exist (NXDOMAIN)", code="dns_failed") from exc
        except (dns.exception.Timeout, asyncio.TimeoutError) as exc:
            raise GatewayFailed(f"resolving the upstream host {name} timed out after {self._lifetime:g}s",
                                code="dns_failed") from exc
        except dns.resolver.NoNameservers as exc:
            raise GatewayFailed(f"no nameserver could resolve the upstream host {name} (SERVFAIL or refused)",
                                code="dns_failed") from exc
        except (dns.name.NameTooLong, dns.name.LabelTooLong, dns.name.EmptyLabel) as exc:
            raise GatewayFailed(f"the upstream host {name!r} is not a valid DNS name", code="dns_failed",
                                blame="caller") from exc
        except (dns.exception.DNSException, OSError, ValueError) as exc:
            raise GatewayFailed(f"resolving the upstream host {name} failed ({type(exc).__name__})",
                                code="dns_failed") from exc
        addrs: tuple[IPAddress, ...] = ()
        if answer.rrset is not None:
            addrs = tuple(ipaddress.ip_address(rd.address) for rd in answer.rrset)
        ttl = min(float(answer.chaining_result.minimum_ttl), MAX_TTL_S)
        if ttl > 0:
            self._cache[(name, rdtype)] = _Entry(addrs, started + ttl)
            self._cache.move_to_end((name, rdtype))
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return addrs

    async def _system_lookup(self, name: str) -> tuple[IPAddress, ...]:
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(self._getaddrinfo(loop, name), self._lifetime)
        except asyncio.TimeoutError as exc:
            raise GatewayFailed(f"resolving the upstream host {name} timed out after {self._lifetime:g}s",
                                code="dns_failed") from exc
        except (OSError, UnicodeError) as exc:
            raise GatewayFailed(f"the upstream host {name} could not be resolved ({exc})", code="dns_failed") from exc
        out: list[IPAddress] = []
        for family, *_rest, sockaddr in infos:
            if family in (socket.AF_INET, socket.AF_INET6):
                addr = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
                if addr not in out:
                    out.append(addr)
        if not out:
            raise GatewayFailed(f"the upstream host {name} has no address", code="dns_failed")
        return tuple(out)

    def _getaddrinfo(self, loop: asyncio.AbstractEventLoop, name: str) -> Awaitable[list[Any]]:
        return loop.getaddrinfo(name, None, type=socket.SOCK_STREAM)


class VettingConnector(aiohttp.TCPConnector):
    """A connector that vets every request's host with the :class:`VettingResolver` before handing out a
    connection: a pooled one (kept alive while the name moved inside) and a numeric host (which aiohttp
    dials without asking a resolver) included; a new connection to a name dials only the addresses the
    resolver checked. For a session whose requests do not pass the relay's own check before each send
    (the aggregator session, treg/call/overflow_stage.py): an operator's URL is vetted like an upstream."""

    def __init__(self, resolver: VettingResolver, **kwargs: Any) -> None:
        super().__init__(resolver=resolver, use_dns_cache=False, **kwargs)
        self._vetting = resolver

    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:
        await self._vetting.vet(req.url.raw_host or "")  # SsrfRefused / dns_failed pass through unwrapped
        return await super().connect(req, traces, timeout)


def _is_localhost(name: str) -> bool:
    """``localhost``, ``*.localhost`` (RFC 6761), ``localhost.localdomain`` and ``ip6-localhost`` are
    loopback by definition: never asked of DNS (the registration check reads them the same way)."""
    return loopback_name(name)


def _normalize(host: str) -> tuple[str, tuple[IPAddress, ...] | None]:
    """(the name as the registration check normalises it, fixed addresses when no DNS is needed)."""
    name = normalize_host(host)
    numeric = parse_numeric_host(name)
    if numeric is not None:
        return str(numeric), (numeric,)
    if _is_localhost(name):
        return name, _LOOPBACK
    if not name:
        raise GatewayFailed("the upstream host is empty", code="dns_failed", blame="caller")
    return name, None


class NullResolver:
    """The resolver of a process that dials nothing (a CLI command, a domain test, an app before its
    resolver starts or after it stopped): a registration check gets no address, so it leaves the name
    to the call-time guard as it does a name that does not resolve now; :meth:`vet` refuses
    (``shutting_down``), so nothing is ever dialled unvetted. No use site asks whether one is there."""

    async def vet(self, host: str) -> list[IPAddress]:
        raise GatewayFailed("treg takes no new call: it is shutting down, or this process serves none",
                            code="shutting_down", blame="treg")

    async def addresses(self, host: str) -> list[IPAddress]:
        return []

    async def close(self) -> None:
        pass


async def setup(app: Any, svc: Any) -> Callable[[], Awaitable[None]]:
    """Component: install the vetting resolver on ``svc.resolver`` (the upstream connector uses it);
    the null resolver is put back once it is closed."""
    resolver = VettingResolver(svc.settings, svc.ssrf)
    svc.resolver = resolver

    async def close() -> None:
        svc.resolver = NullResolver()
        await resolver.close()

    return close
