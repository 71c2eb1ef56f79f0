"""TLS of the 10250 server: the serving certificate (given, or self-signed once) and its context.

The context is pyOpenSSL's (``openssl_stream``): client certificates are requested and
checked against ``clientCAFile``, and one that does not verify reaches the authenticator
(401), as in Go, instead of failing the handshake.

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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from OpenSSL import SSL

from trio_kubelet.config import AgentOptions
from trio_kubelet.server.openssl_stream import server_context

log = logging.getLogger(__name__)

__all__ = [
    "ServingCertificate",
    "ServingContext",
    "TLSConfigError",
    "ensure_serving_certificate",
    "generate_self_signed",
    "server_tls_context",
]

_VALIDITY = datetime.timedelta(days=365)
_BACKDATE = datetime.timedelta(hours=1)  # tolerate clock skew between node and clients


class TLSConfigError(Exception):
    """The serving certificate or client CA cannot be used; ``str()`` names the field."""


@dataclass(frozen=True)
class ServingCertificate:
    cert_file: Path
    key_file: Path
    generated: bool = False


class ServingContext:
    """The 10250 server's TLS context, replaceable: a new (rotated) serving certificate applies
    to the connections accepted after the switch, while open ones go on with the old one.

    ``context`` is None while there is no certificate yet (serverTLSBootstrap before the cluster
    has issued one): handshakes are refused then, as Go's kubelet refuses them ("no serving
    certificate available for the kubelet").
    """

    def __init__(self, context: SSL.Context | None = None) -> None:
        self.context = context

    def replace(self, context: SSL.Context) -> None:
        self.context = context


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


def server_tls_context(cert: ServingCertificate, client_ca_file: str | None = None
                       ) -> SSL.Context:
    """The server context: TLS ≥ 1.2, ALPN http/1.1, and client certificates requested
    (not required) and checked against ``client_ca_file`` when one is given.

    Only ``client_ca_file`` is trusted for client certificates, never the system store;
    the result of the check goes with the connection to the authenticator.
    """
    try:
        return server_context(cert.cert_file, cert.key_file, client_ca_file=client_ca_file or None)
    except (OSError, ValueError, SSL.Error) as exc:
        failure = exc
    try:  # which file is at fault: the pair alone, or else the client CA
        server_context(cert.cert_file, cert.key_file)
    except (OSError, ValueError, SSL.Error) as exc:
        raise TLSConfigError(f"tlsCertFile/tlsPrivateKeyFile: cannot load {cert.cert_file} and "
                             f"{cert.key_file}: {_reason(exc)}") from None
    raise TLSConfigError(f"authentication.x509.clientCAFile: cannot load {client_ca_file}: "
                         f"{_reason(failure)}") from None


def _reason(exc: OSError | ValueError | SSL.Error) -> str:
    """OpenSSL's reason (its error queue holds (library, function, reason) triples)."""
    if isinstance(exc, SSL.Error):
        queue = exc.args[0] if exc.args and isinstance(exc.args[0], list) else []
        reasons = [entry[-1] for entry in queue if isinstance(entry, tuple) and entry]
        return "; ".join(reasons) or str(exc)
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)
