"""A throwaway self-signed certificate for a TLS test server on 127.0.0.1 (``RawUpstream(ssl=...)``)."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SelfSigned:
    """A certificate for ``localhost`` and ``127.0.0.1`` (its own issuer) and its key, in PEM."""

    cert_pem: bytes
    key_pem: bytes

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        with tempfile.TemporaryDirectory() as tmp:  # load_cert_chain reads files only
            cert, key = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
            cert.write_bytes(self.cert_pem)
            key.write_bytes(self.key_pem)
            ctx.load_cert_chain(cert, key)
        return ctx

    def client_context(self) -> ssl.SSLContext:
        """A verifying client context that trusts this certificate only."""
        return ssl.create_default_context(cadata=self.cert_pem.decode())


def self_signed() -> SelfSigned:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "treg test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return SelfSigned(cert.public_bytes(serialization.Encoding.PEM),
                      key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                        serialization.NoEncryption()))
