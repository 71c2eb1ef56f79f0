"""server.tls and server.self_signed: the self-signed serving pair (generated once, reused,
renewed, by a child process) and the context."""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import ssl
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store
from OpenSSL import SSL

from tests.unit import test_openssl_stream
from tests.unit.test_openssl_stream import PKI, client_ctx, tcp_pair
from trio_kubelet.config import AgentOptions, KubeletConfiguration
from trio_kubelet.server.self_signed import generate_self_signed
from trio_kubelet.server.tls import (
    TLS12_CIPHERS,
    ServingCertificate,
    TLSConfigError,
    TLSSettings,
    ensure_serving_certificate,
    server_stream,
    server_tls_context,
)

UTC = datetime.UTC
pki = test_openssl_stream.pki  # the server certificate and client CA fixture


def options(root: Path, **wire: Any) -> AgentOptions:
    return AgentOptions(config=KubeletConfiguration.model_validate(wire), node_name="node-a",
                        root_dir=root, node_ip="10.0.0.5,fd00::5")


def test_generated_pair_is_a_serving_certificate_signed_by_its_own_ca() -> None:
    now = datetime.datetime(2026, 1, 1, tzinfo=UTC)
    chain, key = generate_self_signed("node-a", ["10.0.0.5"], now=now)
    leaf, ca = x509.load_pem_x509_certificates(chain)
    stamp = int(now.timestamp())
    assert leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == \
        f"node-a@{stamp}"
    assert ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == \
        f"node-a-ca@{stamp}"
    leaf.verify_directly_issued_by(ca)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["node-a"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.5")]
    usage = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(usage) == [ExtendedKeyUsageOID.SERVER_AUTH]
    assert leaf.not_valid_before_utc == now - datetime.timedelta(hours=1)
    assert leaf.not_valid_after_utc == now + datetime.timedelta(days=365)
    assert key.startswith(b"-----BEGIN RSA PRIVATE KEY-----")


def test_generated_pair_passes_strict_verification() -> None:
    """RFC 5280 as strict verifiers apply it (Python 3.13's default context): the leaf
    names its issuer's key, which the CA carries."""
    now = datetime.datetime(2026, 1, 1, tzinfo=UTC)
    chain, _ = generate_self_signed("node-a", ["10.0.0.5"], now=now)
    leaf, ca = x509.load_pem_x509_certificates(chain)
    verifier = PolicyBuilder().store(Store([ca])).time(now).build_server_verifier(
        x509.DNSName("node-a"))
    assert verifier.verify(leaf, []) == [leaf, ca]


def test_ip_node_name_becomes_an_ip_san() -> None:
    chain, _ = generate_self_signed("192.168.1.9")
    leaf = x509.load_pem_x509_certificates(chain)[0]
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("192.168.1.9")]


def test_self_signed_pair_is_generated_once_then_reused(tmp_path: Path) -> None:
    first = ensure_serving_certificate(options(tmp_path))
    assert first == ServingCertificate(tmp_path / "pki/kubelet.crt",
                                       tmp_path / "pki/kubelet.key", generated=True)
    assert (first.key_file.stat().st_mode & 0o777) == 0o600
    content = first.cert_file.read_bytes()
    second = ensure_serving_certificate(options(tmp_path))
    assert not second.generated
    assert second.cert_file.read_bytes() == content
    san = x509.load_pem_x509_certificates(content)[0].extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["10.0.0.5",
                                                                           "fd00::5"]


def test_cert_dir_holds_the_self_signed_pair_instead_of_the_root_dir(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    given = dataclasses.replace(options(tmp_path / "root"), cert_dir=certs)
    assert ensure_serving_certificate(given) == ServingCertificate(
        certs / "kubelet.crt", certs / "kubelet.key", generated=True)
    assert not (tmp_path / "root" / "pki").exists()


def test_expired_or_broken_pair_is_replaced(tmp_path: Path) -> None:
    pki = tmp_path / "pki"
    pki.mkdir()
    old = datetime.datetime.now(UTC) - datetime.timedelta(days=400)
    chain, key = generate_self_signed("node-a", now=old)
    (pki / "kubelet.crt").write_bytes(chain)
    (pki / "kubelet.key").write_bytes(key)
    assert ensure_serving_certificate(options(tmp_path)).generated
    (pki / "kubelet.key").write_text("not a key")
    assert ensure_serving_certificate(options(tmp_path)).generated


def test_configured_pair_is_used_as_is(tmp_path: Path) -> None:
    cert = ensure_serving_certificate(options(tmp_path, tlsCertFile="/etc/c.crt",
                                              tlsPrivateKeyFile="/etc/c.key"))
    assert cert == ServingCertificate(Path("/etc/c.crt"), Path("/etc/c.key"))
    with pytest.raises(TLSConfigError, match=r"^tlsPrivateKeyFile: required"):
        ensure_serving_certificate(options(tmp_path, tlsCertFile="/etc/c.crt"))
    assert not (tmp_path / "pki").exists()


def test_tls_context_requests_client_certificates_only_with_a_client_ca(tmp_path: Path) -> None:
    cert = ensure_serving_certificate(options(tmp_path))
    plain = server_tls_context(cert)
    assert isinstance(plain, ssl.SSLContext), "no client CA: the standard library serves"
    assert plain.verify_mode == ssl.CERT_NONE
    ca = trustme.CA()
    ca_file = tmp_path / "client-ca.crt"
    ca.cert_pem.write_to_path(str(ca_file))
    context = server_tls_context(cert, str(ca_file))
    assert isinstance(context, SSL.Context)
    assert context.get_verify_mode() == SSL.VERIFY_PEER, "requested, not required"


def test_tls_context_errors_name_the_field(tmp_path: Path) -> None:
    missing = ServingCertificate(tmp_path / "none.crt", tmp_path / "none.key")
    with pytest.raises(TLSConfigError, match=r"^tlsCertFile/tlsPrivateKeyFile: cannot load"):
        server_tls_context(missing)
    cert = ensure_serving_certificate(options(tmp_path))
    with pytest.raises(TLSConfigError, match=r"^authentication\.x509\.clientCAFile: cannot load"):
        server_tls_context(cert, str(tmp_path / "no-ca.crt"))


def test_the_agent_does_not_load_cryptography_without_a_client_ca(tmp_path: Path) -> None:
    """The pair is made by a child process and served by ``ssl``: cryptography (and
    pyOpenSSL), ~9 MiB resident once loaded, stay out of the agent's process."""
    script = f"""
import sys
from pathlib import Path
from trio_kubelet.config import AgentOptions, KubeletConfiguration
from trio_kubelet.server.serve import run_servers
from trio_kubelet.server.tls import ensure_serving_certificate, server_tls_context
options = AgentOptions(config=KubeletConfiguration(), node_name="node-a",
                       root_dir=Path({str(tmp_path)!r}), node_ip="10.0.0.5")
server_tls_context(ensure_serving_certificate(options))
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("cryptography", "OpenSSL"))
print(loaded)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"
    assert (tmp_path / "pki" / "kubelet.crt").exists()


def test_the_pair_cannot_be_written_names_the_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    given = dataclasses.replace(options(tmp_path), cert_dir=tmp_path / "file" / "pki")
    with pytest.raises(TLSConfigError,
                       match=r"^cannot write the self-signed serving certificate to .*file/pki"):
        ensure_serving_certificate(given)


# --- tlsMinVersion and tlsCipherSuites, on a real handshake with either TLS library ---------


def settings(**wire: Any) -> TLSSettings:
    return TLSSettings.of(KubeletConfiguration.model_validate(wire))


async def agreed(pki: PKI, tls: TLSSettings, client_certs: bool, *,
                 max_version: ssl.TLSVersion = ssl.TLSVersion.MAXIMUM_SUPPORTED,
                 ciphers: str | None = None) -> tuple[str, str] | None:
    """(protocol, suite) a client that goes up to ``max_version`` (and offers only
    ``ciphers`` below TLS 1.3) agrees on with the server; None if the handshake fails."""
    context = server_tls_context(ServingCertificate(pki.cert_file, pki.key_file),
                                 str(pki.client_ca_file) if client_certs else None, tls)
    client_context = client_ctx(pki)
    client_context.maximum_version = max_version
    if ciphers is not None:
        client_context.set_ciphers(ciphers)
    server_tcp, client_tcp = await tcp_pair()
    server = server_stream(server_tcp, context)
    client = trio.SSLStream(client_tcp, client_context, server_hostname="127.0.0.1")
    outcome: list[tuple[str, str] | None] = []

    async def serve() -> None:
        try:
            await server.do_handshake()
        except trio.BrokenResourceError:
            await server_tcp.aclose()  # as the server does with a failed handshake

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        try:
            with trio.fail_after(10):
                await client.do_handshake()
        except trio.BrokenResourceError:
            outcome.append(None)
        else:
            cipher = client.cipher()
            assert cipher is not None
            outcome.append((cipher[1], cipher[0]))
        await client_tcp.aclose()
        await server_tcp.aclose()
    return outcome[0]


@pytest.mark.parametrize("client_certs", [False, True], ids=["ssl", "pyopenssl"])
async def test_tls_min_version_is_the_floor(pki: PKI, client_certs: bool) -> None:
    tls12 = ssl.TLSVersion.TLSv1_2
    default = settings()
    assert (await agreed(pki, default, client_certs, max_version=tls12) or ("",))[0] == "TLSv1.2"
    floor13 = settings(tlsMinVersion="VersionTLS13")
    assert await agreed(pki, floor13, client_certs, max_version=tls12) is None
    assert (await agreed(pki, floor13, client_certs) or ("",))[0] == "TLSv1.3"


@pytest.mark.parametrize("client_certs", [False, True], ids=["ssl", "pyopenssl"])
async def test_tls_cipher_suites_are_the_only_ones_below_tls13(
    pki: PKI, client_certs: bool
) -> None:
    tls12 = ssl.TLSVersion.TLSv1_2
    aes128 = settings(tlsCipherSuites=["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
                                       "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"])
    protocol, suite = await agreed(pki, aes128, client_certs, max_version=tls12) or ("", "")
    assert protocol == "TLSv1.2" and suite.endswith("AES128-GCM-SHA256"), suite
    assert await agreed(pki, aes128, client_certs, max_version=tls12,
                        ciphers="ECDHE+AES256:ECDHE+CHACHA20") is None
    # TLS 1.3 keeps its own suites, as in Go.
    assert (await agreed(pki, aes128, client_certs) or ("",))[0] == "TLSv1.3"


def test_tls_settings_from_the_configuration() -> None:
    assert settings() == TLSSettings("VersionTLS12", TLS12_CIPHERS)
    assert settings(tlsCipherSuites=["TLS_RSA_WITH_AES_128_CBC_SHA", "TLS_AES_128_GCM_SHA256",
                                     "TLS_RSA_WITH_AES_128_CBC_SHA"]).ciphers == "AES128-SHA"
    assert settings(tlsCipherSuites=["TLS_AES_256_GCM_SHA384"]) == TLSSettings(
        "VersionTLS13", TLS12_CIPHERS), "TLS 1.3 suites only: only TLS 1.3 can be agreed on"
    with pytest.raises(ValueError, match=r"tlsCipherSuites\n.*\[1\]: unknown cipher suite"):
        KubeletConfiguration.model_validate(
            {"tlsCipherSuites": ["TLS_AES_128_GCM_SHA256", "TLS_NULL"]})
    with pytest.raises(ValueError, match=r"tlsMinVersion\n.*is not a TLS version"):
        KubeletConfiguration.model_validate({"tlsMinVersion": "TLS1.2"})
    with pytest.raises(ValueError, match="may not be set if tlsMinVersion is VersionTLS13"):
        KubeletConfiguration.model_validate(
            {"tlsMinVersion": "VersionTLS13", "tlsCipherSuites": ["TLS_RSA_WITH_AES_128_CBC_SHA"]})
