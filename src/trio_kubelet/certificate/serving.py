"""The kubelet's serving certificate from the cluster (serverTLSBootstrap): a
``kubernetes.io/kubelet-serving`` CSR for the node's addresses, renewed like the client one, and
port 10250 switched to each new certificate for the connections that follow.

At start the store's current pair (``<cert-dir>/kubelet-server-current.pem``) is served if it has
not expired, else the configured tlsCertFile/tlsPrivateKeyFile pair if there is one (as Go's
store falls back to it); with neither, 10250 refuses handshakes until a certificate is issued.
kube-controller-manager does not approve these CSRs: an operator or an approver controller does.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence
from pathlib import Path

import trio

from trio_kubelet.apiserver.client import APIClient
from trio_kubelet.certificate.csr import obtain_certificate
from trio_kubelet.certificate.keys import (
    KeyPair,
    PEMError,
    is_rsa,
    key_pair,
)
from trio_kubelet.certificate.rotation import (
    RotatedCertificate,
    WallClock,
    rotate_forever,
    wall_time,
)
from trio_kubelet.config import AgentOptions
from trio_kubelet.core.certificates import (
    SERVING_SIGNER,
    CertificateTemplate,
    serving_template,
    serving_usages,
    unexpired,
)
from trio_kubelet.node.machine import internal_ips
from trio_kubelet.server.tls import (
    ServerContext,
    ServingCertificate,
    ServingContext,
    TLSConfigError,
    TLSSettings,
    server_tls_context,
)

log = logging.getLogger(__name__)

SERVING_PAIR = "kubelet-server"
WHAT = "serving certificate"

# The node's status addresses, (type, address): read when the manager starts.
Addresses = Callable[[], Sequence[tuple[str, str]]]


def node_addresses(options: AgentOptions) -> list[tuple[str, str]]:
    """The addresses the Node reports (its InternalIPs, then its Hostname); blocking (may
    resolve the node name)."""
    ips = internal_ips(options.node_ip, options.node_name)
    return [*(("InternalIP", ip) for ip in ips), ("Hostname", options.node_name)]


class ServingCertificateManager(RotatedCertificate):
    """Keeps ``context`` (what 10250 serves) on a cluster-issued certificate."""

    def __init__(
        self,
        options: AgentOptions,
        api: APIClient,
        addresses: Addresses,
        *,
        clock: WallClock,
        rng: random.Random | None = None,
    ) -> None:
        super().__init__(options, api, SERVING_PAIR, clock=clock, rng=rng)
        self.addresses = addresses
        self.client_ca = options.config.authentication.x509.client_ca_file or None
        self.current, initial = self._initial()
        self.context = ServingContext(initial)

    def _initial(self) -> tuple[KeyPair | None, ServerContext | None]:
        now = wall_time(self.clock)
        stored = self.store.current()
        if stored is not None and unexpired(stored.facts, now):
            path = self.store.current_path
            return stored, self._tls_context(ServingCertificate(path, path))
        config = self.options.config
        if config.tls_cert_file and config.tls_private_key_file:
            given = ServingCertificate(
                Path(config.tls_cert_file), Path(config.tls_private_key_file)
            )
            try:
                pair = key_pair(given.cert_file.read_bytes(), given.key_file.read_bytes())
            except (OSError, PEMError) as err:
                log.warning("serverTLSBootstrap: cannot use tlsCertFile/tlsPrivateKeyFile: %s", err)
            else:
                return pair, self._tls_context(given)
        log.info("serverTLSBootstrap: no serving certificate yet; 10250 serves none until the "
                 "cluster issues one")
        return None, None

    def _tls_context(self, cert: ServingCertificate) -> ServerContext:
        return server_tls_context(cert, self.client_ca, TLSSettings.of(self.options.config))

    async def run(self) -> None:
        addresses = await trio.to_thread.run_sync(self.addresses)
        template = serving_template(self.options.node_name, addresses)
        if template is None:
            log.error(
                "serverTLSBootstrap: the node has no IP address to put in a serving certificate "
                "(set --node-ip); none is requested"
            )
            return
        await rotate_forever(
            lambda: self.current, template, lambda: self._renew(template), WHAT,
            clock=self.clock, rng=self.rng,
        )

    async def _renew(self, template: CertificateTemplate) -> KeyPair:
        """One renewal: a new key, a CSR sent as the node, the issued pair stored and served."""
        key_pem, key, now = self._new_key()
        certificate = await obtain_certificate(
            self.api, key, template, signer=SERVING_SIGNER,
            usages=serving_usages(rsa_key=is_rsa(key)), now=now,
        )
        pair = self.store.update(certificate, key_pem, now)
        path = self.store.current_path
        try:
            self.context.replace(self._tls_context(ServingCertificate(path, path)))
        except TLSConfigError as err:
            raise PEMError(f"the issued serving certificate cannot be served: {err}") from None
        self.current = pair
        log.info("Serving certificate for %s (%s) in use on new connections",
                 ", ".join((*template.dns_names, *template.ip_addresses)), path)
        return pair
