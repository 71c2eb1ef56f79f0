"""TLS of the 10250 server: the serving certificate (given, or self-signed once) and its context.

Without ``authentication.x509.clientCAFile`` no client certificate is asked for (as in Go), and
the standard ``ssl`` module serves (``trio.SSLStream``). With it, client certificates are
requested and checked against that file, and one that does not verify must reach the
authenticator (401), as in Go, instead of failing the handshake: ``ssl`` has no verify callback,
so that context is pyOpenSSL's (``openssl_stream``), loaded only then. Either way the self-signed
pair is made by a child process (``self_signed``): cryptography, which both pyOpenSSL and the
certificate builder need, costs the process ~9 MiB for good once loaded.
"""

from __future__ import annotations

import logging
import os
import ssl
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import trio

import trio_kubelet
from trio_kubelet.config import TLS_CIPHER_SUITES, AgentOptions, KubeletConfiguration

if TYPE_CHECKING:
    from OpenSSL import SSL

    from trio_kubelet.server.openssl_stream import OpenSSLStream

log = logging.getLogger(__name__)

__all__ = [
    "ALPN_PROTOCOLS",
    "TLS12_CIPHERS",
    "ServerContext",
    "ServerStream",
    "ServingCertificate",
    "ServingContext",
    "TLSConfigError",
    "TLSSettings",
    "ensure_serving_certificate",
    "server_stream",
    "server_tls_context",
]

# TLS 1.2 suites: forward secret AEAD only (what HTTP/2 requires); TLS 1.3 suites are all fine.
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20"
# HTTP/1.1 only: the kubelet's server speaks no HTTP/2 (asgi_server); a client that offers h2
# falls back, as Go's does.
ALPN_PROTOCOLS = ("http/1.1",)



@dataclass(frozen=True)
class TLSSettings:
    """tlsMinVersion (Go's name) and the OpenSSL suite list tlsCipherSuites makes for
    TLS 1.2 and below; the defaults are the agent's without them."""

    min_version: str = "VersionTLS12"
    ciphers: str = TLS12_CIPHERS

    @classmethod
    def of(cls, config: KubeletConfiguration) -> TLSSettings:
        """From the configuration. Suites given but none below TLS 1.3: as in Go, only TLS 1.3
        can be agreed on, so that is the floor."""
        floor = config.tls_min_version or cls.min_version
        if not config.tls_cipher_suites:
            return cls(floor)
        ciphers = [TLS_CIPHER_SUITES[name] for name in config.tls_cipher_suites]
        openssl = ":".join(dict.fromkeys(name for name in ciphers if name))
        return cls(floor, openssl) if openssl else cls("VersionTLS13")


_STDLIB_VERSIONS = {
    "VersionTLS10": ssl.TLSVersion.TLSv1,
    "VersionTLS11": ssl.TLSVersion.TLSv1_1,
    "VersionTLS12": ssl.TLSVersion.TLSv1_2,
    "VersionTLS13": ssl.TLSVersion.TLSv1_3,
}

# The standard library's (no client certificates), or pyOpenSSL's (clientCAFile); and the
# streams they make.
ServerContext: TypeAlias = "ssl.SSLContext | SSL.Context"
ServerStream: TypeAlias = "trio.SSLStream[trio.abc.Stream] | OpenSSLStream"


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

    def __init__(self, context: ServerContext | None = None) -> None:
        self.context = context

    def replace(self, context: ServerContext) -> None:
        self.context = context


def _node_ips(options: AgentOptions) -> list[str]:
    return [ip for ip in (options.node_ip or "").split(",") if ip]


def ensure_serving_certificate(options: AgentOptions) -> ServingCertificate:
    """The configured certificate pair, or the self-signed one in ``--cert-dir``
    (default ``<root-dir>/pki``), generated if missing, unreadable or expired.

    Blocking (a child process generating RSA keys): call it through ``trio.to_thread``.
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
    # The child imports this very trio_kubelet, wherever the agent's came from.
    package_root = str(Path(trio_kubelet.__file__).resolve().parent.parent)
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([package_root, path] if path
                                                        else [package_root])}
    command = [sys.executable, "-m", "trio_kubelet.server.self_signed", str(cert_file),
               str(key_file), options.node_name, *_node_ips(options)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        raise TLSConfigError(lines[-1] if done.returncode == 2 else
                             f"cannot make the self-signed serving certificate: {lines[-1]}")
    cert = ServingCertificate(cert_file, key_file, generated=done.stdout.strip() == "generated")
    if cert.generated:
        log.info("Generated a self-signed serving certificate for %s in %s",
                 options.node_name, pki)
    return cert


def _stdlib_context(cert: ServingCertificate, settings: TLSSettings) -> ssl.SSLContext:
    """The same protocol floor, options, suites and ALPN as ``openssl_stream.server_context``;
    no client certificate is asked for."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = _STDLIB_VERSIONS[settings.min_version]
    context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_NO_RENEGOTIATION
    try:
        context.set_ciphers(settings.ciphers)
    except ssl.SSLError:
        raise TLSConfigError(f"tlsCipherSuites: this OpenSSL has none of {settings.ciphers}"
                             ) from None
    context.set_alpn_protocols(list(ALPN_PROTOCOLS))
    try:
        context.load_cert_chain(cert.cert_file, cert.key_file)
    except ssl.SSLError as exc:
        reason = exc.reason or str(exc)
    except OSError as exc:
        reason = exc.strerror or str(exc)
    else:
        return context
    raise TLSConfigError(f"tlsCertFile/tlsPrivateKeyFile: cannot load {cert.cert_file} and "
                         f"{cert.key_file}: {reason}")


def server_tls_context(cert: ServingCertificate, client_ca_file: str | None = None,
                       settings: TLSSettings = TLSSettings()) -> ServerContext:
    """The server context: ``settings``' TLS floor and suites, ALPN http/1.1, and client
    certificates requested (not required) and checked against ``client_ca_file`` when one
    is given.

    Only ``client_ca_file`` is trusted for client certificates, never the system store;
    the result of the check goes with the connection to the authenticator.
    """
    if not client_ca_file:
        return _stdlib_context(cert, settings)
    _stdlib_context(cert, settings)  # the pair and suites alone first: an error names the field
    # pyOpenSSL (and cryptography) only when client certificates are asked for: see above.
    from OpenSSL import SSL

    from trio_kubelet.server.openssl_stream import server_context

    try:
        return server_context(cert.cert_file, cert.key_file, client_ca_file=client_ca_file,
                              min_version=settings.min_version, ciphers=settings.ciphers)
    except (OSError, ValueError, SSL.Error) as exc:
        raise TLSConfigError(f"authentication.x509.clientCAFile: cannot load {client_ca_file}: "
                             f"{_reason(exc, SSL.Error)}") from None


def _reason(exc: Exception, openssl_error: type[Exception]) -> str:
    """OpenSSL's reason (its error queue holds (library, function, reason) triples)."""
    if isinstance(exc, openssl_error):
        queue = exc.args[0] if exc.args and isinstance(exc.args[0], list) else []
        reasons = [entry[-1] for entry in queue if isinstance(entry, tuple) and entry]
        return "; ".join(reasons) or str(exc)
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)


def server_stream(transport: trio.abc.Stream, context: ServerContext) -> ServerStream:
    """The server side of a TLS connection over ``transport`` with ``context``."""
    if isinstance(context, ssl.SSLContext):
        return trio.SSLStream(transport, context, server_side=True, https_compatible=True)
    # Loaded with the context (server_tls_context), so this costs nothing more.
    from trio_kubelet.server.openssl_stream import OpenSSLStream

    return OpenSSLStream(transport, context)
