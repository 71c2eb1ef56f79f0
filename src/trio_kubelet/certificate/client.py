"""The node's client certificate: the one --kubeconfig holds, or one the cluster issues through
TLS bootstrap (--bootstrap-kubeconfig), renewed before it expires with rotateCertificates.

What is used at start, as Go's kubelet decides it:

- without --bootstrap-kubeconfig and rotation, --kubeconfig as it is;
- with rotation, the certificate store's current pair (``<cert-dir>/kubelet-client-current.pem``)
  while unexpired, else the kubeconfig's certificate (then copied into the store);
- with --bootstrap-kubeconfig, when --kubeconfig is missing, unreadable or holds no unexpired
  client certificate: a bootstrap. Its key is kept in ``kubelet-client.key.tmp`` until the
  certificate comes, and its CSR is named after a digest of what it asks (so a restart takes up
  the same request); the certificate is stored and a kubeconfig pointing to the store's current
  file is written at --kubeconfig.

Unlike Go's, the bootstrap never holds up the agent: static pods run while it waits (the node's
own API server may be one of them), and the API-server side starts once the certificate is in
use. Go bootstraps in the background too, but only with rotation on.
"""

from __future__ import annotations

import datetime
import logging
import os
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from trio_kubelet.apiserver.client import APIClient
from trio_kubelet.apiserver.kubeconfig import (
    Connection,
    KubeconfigError,
    load_kubeconfig,
    write_certificate_kubeconfig,
)
from trio_kubelet.certificate.csr import CertificateRequestError, obtain_certificate
from trio_kubelet.certificate.keys import (
    KeyPair,
    PEMError,
    is_rsa,
    key_pair,
    load_private_key,
    new_private_key,
    public_key_der,
    split_pem,
)
from trio_kubelet.certificate.rotation import (
    RotatedCertificate,
    WallClock,
    rotate_forever,
    until_obtained,
    wall_time,
)
from trio_kubelet.certificate.store import CertificateStore
from trio_kubelet.config import AgentOptions
from trio_kubelet.core.certificates import (
    CLIENT_SIGNER,
    bootstrap_csr_name,
    client_template,
    client_usages,
    unexpired,
)

log = logging.getLogger(__name__)

CLIENT_PAIR = "kubelet-client"
BOOTSTRAP_KEY = "kubelet-client.key.tmp"
BOOTSTRAP_WAIT = 3600.0  # Go's kubelet waits an hour for its bootstrap CSR
WHAT = "client certificate"


@dataclass(frozen=True)
class ClientCredentials:
    """How the agent talks to the API server at start, and what it may need later."""

    connection: Connection  # what the API client opens with
    current: KeyPair | None  # the client certificate in use; None: bootstrap first
    bootstrap: Connection | None  # --bootstrap-kubeconfig's


def client_credentials(options: AgentOptions, now: datetime.datetime) -> ClientCredentials:
    """Decide the start-up credentials (reads files; raises KubeconfigError naming the flag)."""
    assert options.kubeconfig is not None
    bootstrap = None
    if options.bootstrap_kubeconfig is not None:
        bootstrap = load_kubeconfig(options.bootstrap_kubeconfig, "--bootstrap-kubeconfig")
    kube = _kubeconfig(options.kubeconfig, required=bootstrap is None)
    kube_pair = _unexpired_pair(kube, now)
    rotate = options.config.rotate_certificates
    current: KeyPair | None = None
    if rotate:
        stored = CertificateStore(CLIENT_PAIR, options.certificate_dir).current()
        current = stored if stored is not None and unexpired(stored.facts, now) else None
    if current is None and kube_pair is not None:
        current = kube_pair
        if rotate:  # as Go: the store holds the pair it renews from now on
            store = CertificateStore(CLIENT_PAIR, options.certificate_dir)
            store.update(kube_pair.certificate, kube_pair.key, now)
    if current is not None and current is kube_pair and kube is not None:
        return ClientCredentials(kube, current, bootstrap)
    if current is not None:
        base = kube or bootstrap
        assert base is not None
        connection = base.with_client_certificate(current.certificate, current.key)
        return ClientCredentials(connection, current, bootstrap)
    if bootstrap is not None:
        log.info(
            "No usable client certificate in --kubeconfig %s: TLS bootstrap with %s",
            options.kubeconfig,
            options.bootstrap_kubeconfig,
        )
        return ClientCredentials(bootstrap.anonymous(), None, bootstrap)
    assert kube is not None
    return ClientCredentials(kube, None, None)


def _kubeconfig(path: Path, *, required: bool) -> Connection | None:
    """--kubeconfig, or None (logged) when a bootstrap can stand in for it."""
    if required:
        return load_kubeconfig(path)
    if not path.exists():
        return None
    try:
        return load_kubeconfig(path)
    except KubeconfigError as err:
        log.warning("Cannot use the existing kubeconfig, bootstrapping instead: %s", err)
        return None


def _unexpired_pair(connection: Connection | None, now: datetime.datetime) -> KeyPair | None:
    """The kubeconfig's client certificate and key if they go together and have not expired."""
    if connection is None or connection.client_certificate is None:
        return None
    try:
        # Both may name one file holding the certificate and the key (the store's current one).
        certificate, _ = split_pem(connection.client_certificate)
        _, key = split_pem(connection.client_key or connection.client_certificate)
        pair = key_pair(certificate, key)
    except PEMError as err:
        log.warning("The kubeconfig's client certificate cannot be used: %s", err)
        return None
    if not unexpired(pair.facts, now):
        log.warning(
            "The kubeconfig's client certificate expired at %s", pair.facts.not_after.isoformat()
        )
        return None
    return pair


class ClientCertificateManager(RotatedCertificate):
    """Bootstraps the client certificate if there is none, then (rotateCertificates) renews it;
    each new one goes to the store and into the API client for new connections."""

    def __init__(
        self,
        options: AgentOptions,
        credentials: ClientCredentials,
        api: APIClient,
        *,
        clock: WallClock,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(options, api, CLIENT_PAIR, clock=clock, rng=rng)
        self.current = credentials.current
        self.bootstrap = credentials.bootstrap
        self.template = client_template(options.node_name)
        self.ready = trio.Event()  # set once a client certificate (or the kubeconfig) is in use
        if self.current is not None or self.bootstrap is None:
            self.ready.set()

    async def run(self) -> None:
        if self.current is None and self.bootstrap is not None:
            await until_obtained(self._bootstrap, WHAT, wait=BOOTSTRAP_WAIT, rng=self.rng)
            self.ready.set()
        if not self.options.config.rotate_certificates:
            return
        if self.current is None:
            log.warning("rotateCertificates: --kubeconfig has no client certificate to renew")
            return
        await rotate_forever(
            lambda: self.current, self.template, self._renew, WHAT, clock=self.clock, rng=self.rng
        )

    async def _bootstrap(self) -> KeyPair:
        """One bootstrap attempt: the CSR under the bootstrap credentials, with the kept key."""
        assert self.bootstrap is not None
        key_pem = self._bootstrap_key()
        key = load_private_key(key_pem)
        usages = client_usages(rsa_key=is_rsa(key))
        name = bootstrap_csr_name(public_key_der(key), self.template, usages)
        async with _temporary_client(self.bootstrap, self.options) as client:
            certificate = await obtain_certificate(
                client, key, self.template, signer=CLIENT_SIGNER, usages=usages, name=name,
                now=wall_time(self.clock),
            )
        pair = await self._use(certificate, key_pem)
        (self.options.certificate_dir / BOOTSTRAP_KEY).unlink(missing_ok=True)
        assert self.options.kubeconfig is not None
        write_certificate_kubeconfig(
            self.options.kubeconfig, self.bootstrap, self.store.current_path
        )
        log.info(
            "TLS bootstrap done: client certificate for %s in %s, kubeconfig %s",
            self.template.common_name,
            self.store.current_path,
            self.options.kubeconfig,
        )
        return pair

    def _bootstrap_key(self) -> bytes:
        """The key of an expired stored pair, else the kept bootstrap key, else a new one
        (kept until the certificate comes, so a restart sends the same request)."""
        stored = self.store.current()
        if stored is not None:
            return stored.key
        path = self.options.certificate_dir / BOOTSTRAP_KEY
        try:
            key_pem = path.read_bytes()
            load_private_key(key_pem)
            return key_pem
        except (OSError, PEMError):
            pass
        key_pem = new_private_key()
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(key_pem)
        return key_pem

    async def _renew(self) -> KeyPair:
        """One renewal: a new key, a CSR sent as the node itself (or with the bootstrap
        credentials once the certificate has expired)."""
        key_pem, key, now = self._new_key()
        usages = client_usages(rsa_key=is_rsa(key))
        if self.current is not None and unexpired(self.current.facts, now):
            certificate = await obtain_certificate(
                self.api, key, self.template, signer=CLIENT_SIGNER, usages=usages, now=now
            )
        elif self.bootstrap is not None:
            async with _temporary_client(self.bootstrap, self.options) as client:
                certificate = await obtain_certificate(
                    client, key, self.template, signer=CLIENT_SIGNER, usages=usages, now=now
                )
        else:
            raise CertificateRequestError(
                "the client certificate has expired and there is no --bootstrap-kubeconfig to "
                "ask for another with"
            )
        return await self._use(certificate, key_pem)

    async def _use(self, certificate: bytes, key_pem: bytes) -> KeyPair:
        pair = self.store.update(certificate, key_pem, wall_time(self.clock))
        await self.api.use_client_certificate(pair.certificate, pair.key)
        self.current = pair
        return pair


@asynccontextmanager
async def _temporary_client(connection: Connection, options: AgentOptions) -> AsyncIterator[
    APIClient
]:
    client = APIClient(connection, qps=options.config.kube_api_qps,
                       burst=options.config.kube_api_burst)
    try:
        yield client
    finally:
        await client.aclose()
