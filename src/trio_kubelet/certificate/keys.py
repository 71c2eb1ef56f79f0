"""Keys, certificate requests and certificate/key pairs in PEM, with ``cryptography``.

New keys are ECDSA P-256, as Go's kubelet makes them; keys given to us may also be RSA.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from trio_kubelet.core.certificates import CertificateFacts, CertificateTemplate

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


class PEMError(ValueError):
    """A key, request or certificate that cannot be read; the message says what is wrong."""


@dataclass(frozen=True)
class KeyPair:
    """A certificate (PEM, leaf first) with its private key (PEM) and the facts of the leaf."""

    certificate: bytes
    key: bytes
    facts: CertificateFacts


def new_private_key() -> bytes:
    """A new ECDSA P-256 key, PEM ("EC PRIVATE KEY", as Go writes it)."""
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


def load_private_key(pem: bytes) -> PrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as err:
        raise PEMError(f"not a PEM private key: {err}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise PEMError(f"unsupported private key type {type(key).__name__}")
    return key


def is_rsa(key: PrivateKey) -> bool:
    return isinstance(key, rsa.RSAPrivateKey)


def public_key_der(key: PrivateKey) -> bytes:
    """The public key as DER SubjectPublicKeyInfo (what the bootstrap CSR name digests)."""
    return key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def certificate_request(key: PrivateKey, template: CertificateTemplate) -> bytes:
    """A PEM CSR for ``template`` signed with ``key``: the subject in Go's order (O before CN)
    and the template's DNS names and IPs as subject alternative names."""
    subject = x509.Name(
        [
            *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in template.organizations),
            x509.NameAttribute(NameOID.COMMON_NAME, template.common_name),
        ]
    )
    builder = x509.CertificateSigningRequestBuilder().subject_name(subject)
    names: list[x509.GeneralName] = [x509.DNSName(name) for name in template.dns_names]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in template.ip_addresses]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


def request_matches_key(request_pem: bytes, key: PrivateKey) -> bool:
    """Whether a CSR (PEM) carries ``key``'s public key and a valid signature by it."""
    try:
        request = x509.load_pem_x509_csr(request_pem)
    except ValueError:
        return False
    return request.is_signature_valid and public_key_der(key) == request.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def request_subject(request_pem: bytes) -> x509.Name | None:
    try:
        return x509.load_pem_x509_csr(request_pem).subject
    except ValueError:
        return None


def certificate_facts(certificate: x509.Certificate) -> CertificateFacts:
    """The validity, subject and SANs of a certificate."""
    subject = certificate.subject
    try:
        sans = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        dns_names = tuple(sans.get_values_for_type(x509.DNSName))
        ips = tuple(str(ip) for ip in sans.get_values_for_type(x509.IPAddress))
    except x509.ExtensionNotFound:
        dns_names, ips = (), ()
    common_names = subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return CertificateFacts(
        not_before=certificate.not_valid_before_utc,
        not_after=certificate.not_valid_after_utc,
        common_name=str(common_names[0].value) if common_names else "",
        organizations=tuple(
            str(attribute.value)
            for attribute in subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
        ),
        dns_names=dns_names,
        ip_addresses=ips,
    )


def key_pair(certificate_pem: bytes, key_pem: bytes) -> KeyPair:
    """Check that the certificate chain and key go together; PEMError says why not."""
    try:
        chain = x509.load_pem_x509_certificates(certificate_pem)
    except ValueError as err:
        raise PEMError(f"no PEM certificate: {err}") from None
    key = load_private_key(key_pem)
    if public_key_der(key) != chain[0].public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    ):
        raise PEMError("the private key does not match the certificate")
    return KeyPair(certificate_pem, key_pem, certificate_facts(chain[0]))


def split_pem(pem: bytes) -> tuple[bytes, bytes]:
    """A combined PEM file (certificates then key, as the certificate store writes it) as
    ``(certificates, key)``; either part may be empty."""
    certificates: list[bytes] = []
    keys: list[bytes] = []
    block: list[bytes] = []
    for line in pem.splitlines(keepends=True):
        if line.startswith(b"-----BEGIN "):
            block = [line]
        elif block:
            block.append(line)
            if line.startswith(b"-----END "):
                target = certificates if b"CERTIFICATE" in block[0] else keys
                target.append(b"".join(block))
                block = []
    return b"".join(certificates), b"".join(keys[:1])
