"""A throwaway CA and an in-memory CSR API (httpx MockTransport) for the certificate unit tests."""

from __future__ import annotations

import base64
import datetime
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

import httpx
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
JSON = dict[str, Any]
NOW = datetime.datetime.now(datetime.UTC)


class CA:
    def __init__(self) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-ca")])
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self.key.public_key())
            .serial_number(1)
            .not_valid_before(NOW - datetime.timedelta(days=1))
            .not_valid_after(NOW + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )

    def sign(
        self,
        public_key: Any,
        subject: x509.Name,
        *,
        not_before: datetime.datetime | None = None,
        life: datetime.timedelta = datetime.timedelta(hours=1),
        server: bool = False,
    ) -> bytes:
        start = not_before or NOW - datetime.timedelta(minutes=5)
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(self.cert.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(start + life)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM)

    def node_pair(self, node: str, **kwargs: Any) -> tuple[bytes, bytes]:
        """A client certificate and key (PEM) for system:node:NODE."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name(
            [
                x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
                x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node}"),
            ]
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
        return self.sign(key.public_key(), subject, **kwargs), key_pem


@dataclass
class CSRApi:
    """Creates, gets, lists and watches CSRs; ``decide`` says what happens to a new one:
    "approve" (approved and signed by ``ca``), "deny", or "wait"."""

    ca: CA
    decide: str = "approve"
    csrs: dict[str, JSON] = field(default_factory=dict)
    created: list[JSON] = field(default_factory=list)
    _uids: itertools.count[int] = field(default_factory=itertools.count)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if request.method == "POST" and path == CSRS:
            return self._create(json.loads(request.content))
        if request.method == "GET" and path.startswith(f"{CSRS}/"):
            csr = self.csrs.get(path.rsplit("/", 1)[1])
            return httpx.Response(200, json=csr) if csr else _status(404, "NotFound")
        if request.method == "GET" and path == CSRS:
            selector = request.url.params.get("fieldSelector", "")
            name = selector.removeprefix("metadata.name=")
            items = [csr for key, csr in self.csrs.items() if key == name]
            if request.url.params.get("watch") == "true":
                return httpx.Response(200, content=b"")  # no events: the list said it all
            return httpx.Response(200, json={"metadata": {"resourceVersion": "1"}, "items": items})
        return _status(405, "MethodNotAllowed")

    def _create(self, body: JSON) -> httpx.Response:
        name = body["metadata"].get("name") or f"csr-{next(self._uids)}"
        if name in self.csrs:
            return _status(409, "AlreadyExists")
        csr = {**body, "metadata": {"name": name, "uid": f"uid-{name}"}, "status": {}}
        self.created.append(csr)
        request = x509.load_pem_x509_csr(base64.b64decode(body["spec"]["request"]))
        if self.decide == "approve":
            server = "server auth" in body["spec"]["usages"]
            certificate = self.ca.sign(request.public_key(), request.subject, server=server)
            csr["status"] = {
                "conditions": [{"type": "Approved", "reason": "AutoApproved", "message": ""}],
                "certificate": base64.b64encode(certificate).decode(),
            }
        elif self.decide == "deny":
            csr["status"] = {
                "conditions": [{"type": "Denied", "reason": "NotYou", "message": "go away"}]
            }
        self.csrs[name] = csr
        return httpx.Response(201, json=csr)


def _status(code: int, reason: str) -> httpx.Response:
    return httpx.Response(code, json={"kind": "Status", "reason": reason, "code": code})
