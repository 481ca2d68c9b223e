"""A fake authoritative DNS server on 127.0.0.1, for ``TREG_DNS_NAMESERVERS``."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FakeDns:
    """An authoritative DNS server on 127.0.0.1 (UDP and TCP on one random port) answering A/AAAA from
    ``records`` ``{name: [(ip, ttl), ...]}`` (mutable while running), for ``TREG_DNS_NAMESERVERS``.

    Unknown names are NXDOMAIN; a known name without a record of the asked type is an empty answer with
    an SOA of ``negative_ttl`` (RFC 2308). ``cnames`` maps ``name -> (target, ttl)``. ``truncate_udp``
    answers every UDP query truncated (TC) so a client must retry over TCP; names in ``servfail`` get
    SERVFAIL, names in ``silent`` get no answer at all. Every query is recorded in ``queries`` as
    ``(name, type, transport)``.
    """

    records: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    cnames: dict[str, tuple[str, int]] = field(default_factory=dict)
    negative_ttl: int = 60
    truncate_udp: bool = False
    servfail: set[str] = field(default_factory=set)
    silent: set[str] = field(default_factory=set)
    queries: list[tuple[str, str, str]] = field(default_factory=list)
    _udp: asyncio.DatagramTransport | None = None
    _tcp: asyncio.AbstractServer | None = None

    @property
    def port(self) -> int:
        assert self._udp is not None
        return self._udp.get_extra_info("sockname")[1]

    @property
    def nameserver(self) -> str:
        """The ``ip:port`` to put in ``dns_nameservers``."""
        return f"127.0.0.1:{self.port}"

    def count(self, name: str, rdtype: str | None = None, transport: str | None = None) -> int:
        name = name.rstrip(".").lower()
        return sum(1 for n, t, tr in self.queries
                   if n == name and (rdtype is None or t == rdtype) and (transport is None or tr == transport))

    def answer(self, wire: bytes, transport: str) -> bytes | None:
        import dns.flags
        import dns.message
        import dns.rcode
        import dns.rdataclass
        import dns.rdatatype
        import dns.rrset

        query = dns.message.from_wire(wire)
        question = query.question[0]
        qname = question.name.to_text(omit_final_dot=True).lower()
        rdtype = dns.rdatatype.to_text(question.rdtype)
        self.queries.append((qname, rdtype, transport))
        if qname in self.silent:
            return None
        resp = dns.message.make_response(query)
        resp.flags |= dns.flags.AA
        if qname in self.servfail:
            resp.set_rcode(dns.rcode.SERVFAIL)
            return resp.to_wire()
        if transport == "udp" and self.truncate_udp:
            resp.flags |= dns.flags.TC
            return resp.to_wire()
        name = qname
        for _ in range(8):  # follow our own CNAMEs, bounded
            if name not in self.cnames:
                break
            target, ttl = self.cnames[name]
            resp.answer.append(dns.rrset.from_text(name + ".", ttl, "IN", "CNAME", target.rstrip(".") + "."))
            name = target.rstrip(".").lower()
        known = name in self.records
        want = 4 if question.rdtype == dns.rdatatype.A else 6 if question.rdtype == dns.rdatatype.AAAA else 0
        matching = [(ip, ttl) for ip, ttl in self.records.get(name, [])
                    if want and (":" in ip) == (want == 6)]
        if matching:
            ttl = min(t for _, t in matching)
            resp.answer.append(dns.rrset.from_text_list(name + ".", ttl, "IN", rdtype, [ip for ip, _ in matching]))
        else:
            if not known and not resp.answer:
                resp.set_rcode(dns.rcode.NXDOMAIN)
            zone = name.split(".", 1)[-1] + "." if "." in name else name + "."
            soa = f"ns.{zone} admin.{zone} 1 3600 600 86400 {self.negative_ttl}"
            resp.authority.append(dns.rrset.from_text(zone, self.negative_ttl, "IN", "SOA", soa))
        return resp.to_wire()

    async def start(self) -> "FakeDns":
        loop = asyncio.get_running_loop()
        fake = self

        class _Udp(asyncio.DatagramProtocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                self.transport = transport

            def datagram_received(self, data: bytes, addr: Any) -> None:
                try:
                    out = fake.answer(data, "udp")
                except Exception:  # a malformed query: no answer, like a real server under abuse
                    return
                if out is not None:
                    self.transport.sendto(out, addr)  # type: ignore[attr-defined]

        async def _tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    size = int.from_bytes(await reader.readexactly(2), "big")
                    out = fake.answer(await reader.readexactly(size), "tcp")
                    if out is None:
                        continue
                    writer.write(len(out).to_bytes(2, "big") + out)
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    writer.close()

        for _ in range(20):  # TCP must get the port UDP got; another process may hold it: try again
            transport, _proto = await loop.create_datagram_endpoint(_Udp, local_addr=("127.0.0.1", 0))
            self._udp = transport  # type: ignore[assignment]
            try:
                self._tcp = await asyncio.start_server(_tcp, "127.0.0.1", self.port)
                return self
            except OSError:
                transport.close()
        raise RuntimeError("FakeDns: no free port for UDP and TCP together")

    async def close(self) -> None:
        if self._udp is not None:
            self._udp.close()
        if self._tcp is not None:
            self._tcp.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._tcp.wait_closed(), 2)

    async def __aenter__(self) -> "FakeDns":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()
