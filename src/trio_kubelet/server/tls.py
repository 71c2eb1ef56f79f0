"""TLS of the 10250 server: the serving certificate (given, or self-signed once) and its context.

Without ``tlsCertFile``/``tlsPrivateKeyFile`` the Go kubelet generates a
self-signed pair under ``<root-dir>/pki`` (``kubelet.crt``, ``kubelet.key``): a
throwaway CA ``<host>-ca@<unix time>`` that signs the serving certificate
``<host>@<unix time>``, both valid for a year from an hour ago, the file holding
the serving certificate followed by its CA. We do the same, add the node's IPs
as subject alternative names (Go adds none), and replace the pair when it has
expired or cannot be read (Go only checks that the files are readable).
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from trio_kubelet.config import AgentOptions

log = logging.getLogger(__name__)

__all__ = [
    "ALPN_PROTOCOLS",
    "ServingCertificate",
    "TLSConfigError",
    "ensure_serving_certificate",
    "generate_self_signed",
    "server_ssl_context",
]

ALPN_PROTOCOLS = ["h2", "http/1.1"]
# TLS 1.2 suites: forward secret AEAD only (what HTTP/2 requires); TLS 1.3 suites are all fine.
_TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
_VALIDITY = datetime.timedelta(days=365)
_BACKDATE = datetime.timedelta(hours=1)  # tolerate clock skew between node and clients


class TLSConfigError(Exception):
    """The serving certificate or client CA cannot be used; ``str()`` names the field."""


@dataclass(frozen=True)
class ServingCertificate:
    cert_file: Path
    key_file: Path
    generated: bool = False


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
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_encipherment=True, key_cert_sign=True,
            content_commitment=False, data_encipherment=False, key_agreement=False,
            crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(f"{host}@{stamp}")).issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before).not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_encipherment=True, key_cert_sign=False,
            content_commitment=False, data_encipherment=False, key_agreement=False,
            crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(_subject_alt_names(host, ips)),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    chain = cert.public_bytes(serialization.Encoding.PEM) + ca_cert.public_bytes(
        serialization.Encoding.PEM)
    key_pem = key.private_bytes(serialization.Encoding.PEM,
                                serialization.PrivateFormat.TraditionalOpenSSL,
                                serialization.NoEncryption())
    return chain, key_pem


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


def _node_ips(options: AgentOptions) -> list[str]:
    return [ip for ip in (options.node_ip or "").split(",") if ip]


def ensure_serving_certificate(options: AgentOptions) -> ServingCertificate:
    """The configured certificate pair, or the self-signed one in ``--cert-dir``
    (default ``<root-dir>/pki``).

    Blocking (file I/O, RSA key generation): call it through ``trio.to_thread``.
    """
    config = options.config
    if config.tls_cert_file or config.tls_private_key_file:
        if not (config.tls_cert_file and config.tls_private_key_file):
            missing = "tlsPrivateKeyFile" if config.tls_cert_file else "tlsCertFile"
            raise TLSConfigError(f"{missing}: required when the other of tlsCertFile and "
                                 "tlsPrivateKeyFile is set")
        return ServingCertificate(Path(config.tls_cert_file), Path(config.tls_private_key_file))

    pki = options.cert_dir if options.cert_dir is not None else options.root_dir / "pki"
    cert_file, key_file = pki / "kubelet.crt", pki / "kubelet.key"
    now = datetime.datetime.now(datetime.UTC)
    if _usable(cert_file, key_file, now):
        return ServingCertificate(cert_file, key_file)
    chain, key = generate_self_signed(options.node_name, _node_ips(options), now=now)
    try:
        pki.mkdir(mode=0o755, parents=True, exist_ok=True)
        _write(key_file, key, 0o600)
        _write(cert_file, chain, 0o644)
    except OSError as exc:
        raise TLSConfigError(f"cannot write the self-signed serving certificate to {pki}: "
                             f"{exc.strerror or exc}") from None
    log.info("Generated a self-signed serving certificate for %s in %s", options.node_name, pki)
    return ServingCertificate(cert_file, key_file, generated=True)


def server_ssl_context(cert: ServingCertificate, client_ca_file: str | None = None
                       ) -> ssl.SSLContext:
    """The server context: TLS ≥ 1.2, h2 + http/1.1, and client certificates requested
    (not required) and verified against ``client_ca_file`` when one is given.

    Only ``client_ca_file`` is trusted for client certificates, never the system
    store: a certificate that reaches the application has been verified against it.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION
    context.set_ciphers(_TLS12_CIPHERS)
    context.set_alpn_protocols(ALPN_PROTOCOLS)
    try:
        context.load_cert_chain(cert.cert_file, cert.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(f"tlsCertFile/tlsPrivateKeyFile: cannot load {cert.cert_file} and "
                             f"{cert.key_file}: {_reason(exc)}") from None
    if client_ca_file:
        try:
            context.load_verify_locations(cafile=client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise TLSConfigError(f"authentication.x509.clientCAFile: cannot load "
                                 f"{client_ca_file}: {_reason(exc)}") from None
        # Python's ssl has no verify callback, so an untrusted certificate fails the
        # handshake here instead of reaching the authenticator (Go answers 401).
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


def _reason(exc: OSError | ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    return exc.strerror or str(exc)
