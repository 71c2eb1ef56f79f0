"""Certificate signing requests as a kubelet sends them, for tests that talk to the CSR API
themselves (the agent makes its own in trio_kubelet.certificate)."""

from __future__ import annotations

import base64
import ipaddress
import time
from typing import Any

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
CLIENT_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
JSON = dict[str, Any]


def node_csr(
    node: str, name: str, signer: str = CLIENT_SIGNER, ips: tuple[str, ...] = ()
) -> tuple[JSON, ec.EllipticCurvePrivateKey]:
    """A CSR object for CN=system:node:NODE, O=system:nodes (ECDSA P-256, client usages; IP
    subject alternative names if given) and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}"),
        ]
    )
    builder = x509.CertificateSigningRequestBuilder().subject_name(subject)
    if ips:
        sans = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    request = builder.sign(key, hashes.SHA256())
    pem = request.public_bytes(serialization.Encoding.PEM)
    body = {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {
            "request": base64.b64encode(pem).decode(),
            "signerName": signer,
            "usages": ["digital signature", "client auth"],
        },
    }
    return body, key


def wait_issued(client: httpx.Client, name: str, timeout: float = 30.0) -> x509.Certificate:
    """Poll the CSR until it carries a certificate; fail with the last object seen."""
    deadline = time.monotonic() + timeout
    while True:
        answer = client.get(f"{CSRS}/{name}")
        answer.raise_for_status()
        status = answer.json().get("status") or {}
        if status.get("certificate"):
            return x509.load_pem_x509_certificate(base64.b64decode(status["certificate"]))
        if time.monotonic() > deadline:
            raise AssertionError(f"CSR {name} not issued in {timeout:g}s: {answer.json()}")
        time.sleep(0.2)


def approve(client: httpx.Client, name: str) -> None:
    """What `kubectl certificate approve NAME` does: add the Approved condition."""
    csr = client.get(f"{CSRS}/{name}").json()
    conditions = (csr.get("status") or {}).get("conditions") or []
    conditions.append(
        {
            "type": "Approved",
            "status": "True",
            "reason": "E2EApprove",
            "message": "approved by the e2e test",
        }
    )
    csr["status"] = {**(csr.get("status") or {}), "conditions": conditions}
    answer = client.put(f"{CSRS}/{name}/approval", json=csr)
    assert answer.status_code == 200, answer.text
