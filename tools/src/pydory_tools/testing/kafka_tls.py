"""Certificates for the test broker's SSL listener, made at start-up, never shipped.

A throw-away certificate authority signs one server certificate for 127.0.0.1 (and
``localhost``), so a client that verifies the broker (librdkafka's default) succeeds
with only ``ssl.ca.location`` set to the CA file. ``cryptography`` is a test
dependency: it is imported only when a TLS listener is asked for.
"""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

__all__ = ["write_certificates"]

_VALID_FOR = datetime.timedelta(days=2)


def write_certificates(directory: Path) -> Path:
    """Write ``ca.pem`` and ``server.pem`` (key then chain, Kafka's PEM keystore) into
    ``directory``; return the CA file's path."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def name(common_name: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    def builder(
        subject: str, issuer: str, public_key: ec.EllipticCurvePublicKey
    ) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(name(subject))
            .issuer_name(name(issuer))
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _VALID_FOR)
        )

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        builder("pydory test CA", "pydory test CA", ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        builder("127.0.0.1", "pydory test CA", server_key.public_key())
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    key_pem = server_key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    ca_path = directory / "ca.pem"
    ca_path.write_bytes(ca_cert.public_bytes(pem))
    (directory / "server.pem").write_bytes(
        key_pem + server_cert.public_bytes(pem) + ca_cert.public_bytes(pem)
    )
    return ca_path
