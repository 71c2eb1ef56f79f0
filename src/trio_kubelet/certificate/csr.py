"""Asking the cluster for a certificate: send a CertificateSigningRequest, watch it until it is
issued or refused (client-go's csr package).

A request with a fixed name (the bootstrap one) that exists already is taken up if it is ours:
the same subject and signer, signed by our key, and no expired certificate on it.
"""

from __future__ import annotations

import base64
import datetime
import logging
from collections.abc import Sequence

import trio
from cryptography import x509

from trio_kubelet.apiserver.client import JSON, APIClient, WatchEvent
from trio_kubelet.apiserver.errors import AlreadyExists, APIError
from trio_kubelet.apiserver.reflector import Reflector
from trio_kubelet.certificate.keys import (
    PrivateKey,
    certificate_request,
    request_matches_key,
    request_subject,
)
from trio_kubelet.core.certificates import (
    CertificateTemplate,
    Issued,
    Refused,
    Waiting,
    csr_outcome,
)

log = logging.getLogger(__name__)

CSRS = "/apis/certificates.k8s.io/v1/certificatesigningrequests"


class CertificateRequestError(Exception):
    """The request could not be sent, was refused, or is not ours; the message says which."""


async def obtain_certificate(
    api: APIClient,
    key: PrivateKey,
    template: CertificateTemplate,
    *,
    signer: str,
    usages: Sequence[str],
    name: str | None = None,
    now: datetime.datetime,
) -> bytes:
    """Send a CSR for ``template`` signed by ``key`` and return the issued certificate (PEM) once
    approved and signed. Without ``name`` the API server names it (``csr-…``). Cancel the
    caller's scope to stop waiting."""
    request = certificate_request(key, template)
    body: JSON = {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"name": name} if name else {"generateName": "csr-"},
        "spec": {
            "request": base64.b64encode(request).decode(),
            "signerName": signer,
            "usages": list(usages),
        },
    }
    try:
        created = await api.create(CSRS, body)
    except AlreadyExists:
        if name is None:
            raise
        created = await _existing(api, name, request, signer, key, now)
        log.info("Certificate signing request %s exists already and is ours; waiting for it", name)
    except APIError as err:
        raise CertificateRequestError(f"cannot create certificate signing request: {err}") from None
    metadata = created.get("metadata") or {}
    csr_name, uid = str(metadata.get("name", "")), str(metadata.get("uid", ""))
    log.info("Sent certificate signing request %s (signer %s)", csr_name, signer)
    return await _wait(api, csr_name, uid)


async def _existing(
    api: APIClient,
    name: str,
    request: bytes,
    signer: str,
    key: PrivateKey,
    now: datetime.datetime,
) -> JSON:
    try:
        existing = await api.get(f"{CSRS}/{name}")
    except APIError as err:
        raise CertificateRequestError(
            f"cannot retrieve certificate signing request {name}: {err}"
        ) from None
    spec = existing.get("spec") or {}
    problem = _incompatibility(spec, request, signer, key, existing.get("status") or {}, now)
    if problem:
        raise CertificateRequestError(f"certificate signing request {name} is not ours: {problem}")
    return existing


def _incompatibility(
    spec: JSON, request: bytes, signer: str, key: PrivateKey, status: JSON, now: datetime.datetime
) -> str | None:
    try:
        theirs = base64.b64decode(str(spec.get("request", "")), validate=True)
    except ValueError:
        return "spec.request is not base64"
    if request_subject(theirs) != request_subject(request):
        return "a different subject"
    if spec.get("signerName") and spec.get("signerName") != signer:
        return f"signer {spec.get('signerName')!r}, not {signer!r}"
    if not request_matches_key(theirs, key):
        return "not signed by this node's key"
    if status.get("certificate"):
        try:
            issued = x509.load_pem_x509_certificates(base64.b64decode(status["certificate"]))
        except ValueError:
            return "status.certificate cannot be read"
        if any(now > cert.not_valid_after_utc for cert in issued):
            return "its certificate has expired"
    return None


class _Outcome:
    """The reflector's handler: remembers the decision and stops the watch once there is one."""

    def __init__(self, name: str, uid: str, scope: trio.CancelScope) -> None:
        self.name, self.uid, self.scope = name, uid, scope
        self.certificate: bytes | None = None
        self.refusal: str | None = None
        self.approved_logged = False

    async def replace(self, items: list[JSON]) -> None:
        if not items:
            self._refuse(f"csr {self.name!r} was deleted")
        for item in items:
            self._look(item)

    async def apply(self, event: WatchEvent) -> None:
        if event.type == "DELETED":
            self._refuse(f"csr {self.name!r} was deleted")
        elif event.type in ("ADDED", "MODIFIED"):
            self._look(event.object)

    def _look(self, csr: JSON) -> None:
        outcome = csr_outcome(csr, self.uid)
        if isinstance(outcome, Issued):
            log.info("Certificate signing request %s is issued", self.name)
            self.certificate = outcome.certificate
            self.scope.cancel()
        elif isinstance(outcome, Refused):
            self._refuse(outcome.reason)
        elif isinstance(outcome, Waiting) and outcome.approved and not self.approved_logged:
            self.approved_logged = True
            log.info("Certificate signing request %s is approved, waiting to be issued", self.name)

    def _refuse(self, reason: str) -> None:
        self.refusal = reason
        self.scope.cancel()


async def _wait(api: APIClient, name: str, uid: str) -> bytes:
    """Watch the CSR (list+watch of just that name) until it is issued or refused."""
    with trio.CancelScope() as scope:
        outcome = _Outcome(name, uid, scope)
        reflector = Reflector(
            api,
            CSRS,
            outcome,
            params={"fieldSelector": f"metadata.name={name}"},
            what=f"certificate signing request {name}",
        )
        await reflector.run()
    if outcome.certificate is not None:
        return outcome.certificate
    raise CertificateRequestError(outcome.refusal or f"csr {name!r}: no answer")
