"""The self-signed serving pair, Go kubelet style, made or checked by a child process.

Without ``tlsCertFile``/``tlsPrivateKeyFile`` the Go kubelet generates a self-signed pair under
``<root-dir>/pki`` (``kubelet.crt``, ``kubelet.key``): a throwaway CA ``<host>-ca@<unix time>``
that signs the serving certificate ``<host>@<unix time>``, both valid for a year from an hour
ago, the file holding the serving certificate followed by its CA. We do the same, add the
node's IPs as subject alternative names (Go adds none), and replace the pair when it has
expired or cannot be read (Go only checks that the files are readable).

This needs cryptography, whose library (its own OpenSSL) stays resident once loaded: ~9 MiB,
a tenth of the agent. Served by the standard ``ssl`` module (no client CA), the agent needs it
for nothing else, so ``tls.ensure_serving_certificate`` runs this module as a command
(``python -m trio_kubelet.server.self_signed CERT_FILE KEY_FILE HOST [IP ...]``) that prints
``generated`` or ``kept``, or exits 2 with the reason on stderr.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["ensure_self_signed", "generate_self_signed", "main"]

_VALIDITY = datetime.timedelta(days=365)
_BACKDATE = datetime.timedelta(hours=1)  # tolerate clock skew between node and clients


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _subject_alt_names(host: str, ips: Sequence[str]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    try:
        names.append(x509.IPAddress(ipaddress.ip_address(host)))
    except ValueError:
        names.append(x509.DNSName(host))
    for ip in ips:
        address = x509.IPAddress(ipaddress.ip_address(ip))
        if address not in names:
            names.append(address)
    return names


def generate_self_signed(host: str, ips: Sequence[str] = (), *,
                         now: datetime.datetime | None = None) -> tuple[bytes, bytes]:
    """A CA-signed serving certificate for ``host`` (and ``ips``), Go kubelet style.

    Returns ``(certificate chain PEM, private key PEM)``: the serving certificate
    followed by its CA, and the serving key (PKCS#1, as Go writes it).
    """
    now = now or datetime.datetime.now(datetime.UTC)
    stamp = int(now.timestamp())
    not_before, not_after = now - _BACKDATE, now + _VALIDITY

    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca_name = _name(f"{host}-ca@{stamp}")
    ca_cert = (
        _builder(ca_name, ca_name, ca_key, not_before, not_after, ca=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = (
        _builder(_name(f"{host}@{stamp}"), ca_name, key, not_before, not_after, ca=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(_subject_alt_names(host, ips)),
                       critical=False)
        # Key identifiers, as Go's x509 sets them: strict verifiers (Python 3.13's default
        # VERIFY_X509_STRICT) refuse a CA-issued certificate without the issuer's.
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    chain = cert.public_bytes(serialization.Encoding.PEM) + ca_cert.public_bytes(
        serialization.Encoding.PEM)
    key_pem = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.TraditionalOpenSSL,
                                serialization.NoEncryption())
    return chain, key_pem


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    key: rsa.RSAPrivateKey,
    not_before: datetime.datetime,
    not_after: datetime.datetime,
    *,
    ca: bool,
) -> x509.CertificateBuilder:
    """A certificate for ``key`` with the constraints and key usages Go's self-signed pair
    has: a CA may sign certificates, the serving certificate may not."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_encipherment=True, key_cert_sign=ca,
            content_commitment=False, data_encipherment=False, key_agreement=False,
            crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
    )


def _usable(cert_file: Path, key_file: Path, now: datetime.datetime) -> bool:
    """Whether a previously generated pair can be served again."""
    try:
        cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
        serialization.load_pem_private_key(key_file.read_bytes(), password=None)
    except (OSError, ValueError, TypeError):
        return False
    return cert.not_valid_before_utc <= now < cert.not_valid_after_utc


def _write(path: Path, data: bytes, mode: int) -> None:
    """Write atomically, so a crash never leaves half a key behind."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def ensure_self_signed(cert_file: Path, key_file: Path, host: str, ips: Sequence[str] = (), *,
                       now: datetime.datetime | None = None) -> bool:
    """Keep the pair if it can be served again, else write a new one (and its directory);
    whether a new one was written. Raises OSError when it cannot be written."""
    now = now or datetime.datetime.now(datetime.UTC)
    if _usable(cert_file, key_file, now):
        return False
    chain, key = generate_self_signed(host, ips, now=now)
    cert_file.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    key_file.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    _write(key_file, key, 0o600)
    _write(cert_file, chain, 0o644)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    cert_file, key_file, host, *ips = sys.argv[1:] if argv is None else argv
    try:
        generated = ensure_self_signed(Path(cert_file), Path(key_file), host, ips)
    except OSError as exc:
        print(f"cannot write the self-signed serving certificate to {Path(cert_file).parent}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 2
    print("generated" if generated else "kept")
    return 0


if __name__ == "__main__":
    sys.exit(main())
