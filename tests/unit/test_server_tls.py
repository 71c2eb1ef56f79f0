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
import trustme
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from cryptography.x509.verification import PolicyBuilder, Store
from OpenSSL import SSL

from trio_kubelet.config import AgentOptions, KubeletConfiguration
from trio_kubelet.server.self_signed import generate_self_signed
from trio_kubelet.server.tls import (
    ServingCertificate,
    TLSConfigError,
    ensure_serving_certificate,
    server_tls_context,
)

UTC = datetime.UTC


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
