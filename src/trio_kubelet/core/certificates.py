"""Node certificates from the cluster (TLS bootstrap and rotation): what to request, when to renew,
what a CertificateSigningRequest's status says.

Follows client-go's certificate manager and the kubelet's bootstrap: renewal at a jittered 70-90 %
of the certificate's life (at once when the certificate no longer fits what the node would ask
for), retries 2 s doubling to 32 s, the bootstrap CSR named after a digest of what it asks so a
restarted node finds the request it already sent. Pure: time and the random draw are arguments.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The signers the kubelet's requests name (certificates.k8s.io/v1).
CLIENT_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
SERVING_SIGNER = "kubernetes.io/kubelet-serving"
NODES_GROUP = "system:nodes"

DIGITAL_SIGNATURE = "digital signature"
KEY_ENCIPHERMENT = "key encipherment"
CLIENT_AUTH = "client auth"
SERVER_AUTH = "server auth"

# Retries of a failed renewal: client-go's backoff (2 s, doubling, 5 steps) and then a try
# every 32 s for as long as it takes.
RETRY_INITIAL = 2.0
RETRY_MAX = 32.0
RETRY_JITTER = 0.1


@dataclass(frozen=True)
class CertificateTemplate:
    """What the node asks for: the subject and, for a serving certificate, its SANs."""

    common_name: str
    organizations: tuple[str, ...] = (NODES_GROUP,)
    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = ()


@dataclass(frozen=True)
class CertificateFacts:
    """What the node reads from a certificate it holds (the shell parses the PEM)."""

    not_before: datetime.datetime
    not_after: datetime.datetime
    common_name: str
    organizations: tuple[str, ...] = ()
    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = ()


def node_user(node_name: str) -> str:
    return f"system:node:{node_name}"


def client_template(node_name: str) -> CertificateTemplate:
    """The node's client certificate: CN system:node:<name>, O system:nodes, no SANs."""
    return CertificateTemplate(common_name=node_user(node_name))


def serving_template(
    node_name: str, addresses: Sequence[tuple[str, str]]
) -> CertificateTemplate | None:
    """The serving certificate for the node's status addresses ``(type, address)``.

    As Go's kubelet: Hostname and InternalDNS/ExternalDNS addresses become DNS names (a
    Hostname that is an IP, an IP), InternalIP/ExternalIP addresses IPs; both sorted and
    without repeats. None when there is no IP address: the kubelet-serving signer's approvers
    expect one (Go requests nothing then, its AllowDNSOnlyNodeCSR gate being off).
    """
    dns_names: set[str] = set()
    ips: set[str] = set()
    for kind, address in addresses:
        if not address:
            continue
        is_ip = _is_ip(address)
        if kind in ("InternalIP", "ExternalIP") and is_ip:
            ips.add(address)
        elif kind == "Hostname":
            (ips if is_ip else dns_names).add(address)
        elif kind in ("InternalDNS", "ExternalDNS"):
            dns_names.add(address)
    if not ips:
        return None
    return CertificateTemplate(
        common_name=node_user(node_name),
        dns_names=tuple(sorted(dns_names)),
        ip_addresses=tuple(sorted(ips, key=lambda ip: str(ipaddress.ip_address(ip)))),
    )


def _is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True


def client_usages(*, rsa_key: bool) -> tuple[str, ...]:
    """Key usages of a client CSR: key encipherment only for an RSA key (Go's are ECDSA)."""
    return (DIGITAL_SIGNATURE, KEY_ENCIPHERMENT, CLIENT_AUTH) if rsa_key else (
        DIGITAL_SIGNATURE,
        CLIENT_AUTH,
    )


def serving_usages(*, rsa_key: bool) -> tuple[str, ...]:
    """Key usages of a serving CSR: key encipherment only for an RSA key."""
    return (DIGITAL_SIGNATURE, KEY_ENCIPHERMENT, SERVER_AUTH) if rsa_key else (
        DIGITAL_SIGNATURE,
        SERVER_AUTH,
    )


def satisfies(facts: CertificateFacts, template: CertificateTemplate) -> bool:
    """Whether a certificate still fits what the node would ask for now: the same CN and every
    asked-for DNS name, IP and organization present (extra ones do not matter)."""
    return (
        facts.common_name == template.common_name
        and set(template.dns_names) <= set(facts.dns_names)
        and {_canonical_ip(ip) for ip in template.ip_addresses}
        <= {_canonical_ip(ip) for ip in facts.ip_addresses}
        and set(template.organizations) <= set(facts.organizations)
    )


def _canonical_ip(address: str) -> str:
    return str(ipaddress.ip_address(address))


def unexpired(facts: CertificateFacts, now: datetime.datetime) -> bool:
    """Whether a certificate can still be used at ``now`` (Go only looks at its end)."""
    return now <= facts.not_after


def rotation_deadline(
    facts: CertificateFacts,
    template: CertificateTemplate | None,
    now: datetime.datetime,
    jitter: float,
) -> datetime.datetime:
    """When to ask for the next certificate: ``now`` if the current one no longer fits
    ``template``, else a point between 70 % and 90 % of its life, chosen by ``jitter`` in
    [0, 1) so that nodes made together do not all renew together."""
    if template is not None and not satisfies(facts, template):
        return now
    life = facts.not_after - facts.not_before
    return facts.not_before + life * (0.7 + 0.2 * jitter)


def retry_delay(failures: int, jitter: float) -> float:
    """Seconds before the next try after ``failures`` (≥ 1) failed ones in a row: 2 s doubling,
    up to 10 % more by ``jitter`` in [0, 1), then every 32 s."""
    if failures > 4:
        return RETRY_MAX
    return float(RETRY_INITIAL * 2 ** (failures - 1) * (1 + RETRY_JITTER * jitter))


def bootstrap_csr_name(
    public_key_der: bytes, template: CertificateTemplate, usages: Sequence[str]
) -> str:
    """``node-csr-<digest>``: the bootstrap CSR's name, a SHA-512/256 digest of the public key,
    subject and usages (each field unpadded URL-safe base64 then ``|``, as Go hashes them).

    The same key asking the same thing gets the same name, so a node that restarts while its
    request waits finds that request (the API server answers AlreadyExists) instead of making
    another.
    """
    digest = hashlib.new("sha512_256")
    for field in (
        public_key_der,
        template.common_name.encode(),
        *(org.encode() for org in template.organizations),
        *(usage.encode() for usage in usages),
    ):
        digest.update(_raw_url_b64(field).encode() + b"|")
    return f"node-csr-{_raw_url_b64(digest.digest())}"


def _raw_url_b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


@dataclass(frozen=True)
class Issued:
    """The CSR was approved and signed: the certificate (PEM)."""

    certificate: bytes


@dataclass(frozen=True)
class Waiting:
    """Not decided or not signed yet; ``approved`` once approval came."""

    approved: bool = False


@dataclass(frozen=True)
class Refused:
    """Denied, failed, or no longer the request that was sent: the reason, for the log."""

    reason: str


CSROutcome = Issued | Waiting | Refused


def csr_outcome(csr: Mapping[str, Any], uid: str) -> CSROutcome:
    """What a CertificateSigningRequest (as the API server shows it) says of the request with
    ``uid``: Denied or Failed conditions refuse it, Approved with a certificate issues it."""
    metadata = csr.get("metadata") or {}
    name = metadata.get("name", "")
    if metadata.get("uid") != uid:
        return Refused(f"csr {name!r} changed UIDs")
    status = csr.get("status") or {}
    approved = False
    for condition in status.get("conditions") or []:
        kind = condition.get("type")
        details = f"reason: {condition.get('reason', '')}, message: {condition.get('message', '')}"
        if kind == "Denied":
            return Refused(f"certificate signing request is denied, {details}")
        if kind == "Failed":
            return Refused(f"certificate signing request failed, {details}")
        if kind == "Approved":
            approved = True
    certificate = status.get("certificate")
    if approved and certificate:
        try:
            return Issued(base64.b64decode(certificate, validate=True))
        except ValueError:
            return Refused(f"csr {name!r}: status.certificate is not base64")
    return Waiting(approved=approved)
