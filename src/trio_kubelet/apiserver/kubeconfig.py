"""Reading a kubeconfig: the current context's server, CA, and client certificate or token; and
writing the one a bootstrapped node uses (its certificate from the cluster, kept in a file)."""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from trio_kubelet.config import ConfigError


class KubeconfigError(ConfigError):
    """The kubeconfig cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Connection:
    """Where the API server is and how to prove who we are to it."""

    server: str
    ssl_context: ssl.SSLContext | None  # None for plain http://
    token: str | None = None
    user: str = ""  # the kubeconfig's user entry name, for log lines
    # What ssl_context was made of, to make another with a new client certificate (rotation).
    ca_data: bytes | None = None  # PEM; None: the system's trust store
    insecure: bool = False  # insecure-skip-tls-verify
    client_certificate: bytes | None = None  # PEM
    client_key: bytes | None = None  # PEM

    def with_client_certificate(self, certificate: bytes, key: bytes) -> Connection:
        """The same server and CA, authenticated by this certificate (no token)."""
        return replace(
            self,
            ssl_context=tls_context(self.ca_data, self.insecure, certificate, key),
            token=None,
            client_certificate=certificate,
            client_key=key,
        )

    def anonymous(self) -> Connection:
        """The same server and CA with no credentials at all."""
        return replace(
            self,
            ssl_context=tls_context(self.ca_data, self.insecure, None, None)
            if self.server.startswith("https://")
            else None,
            token=None,
            client_certificate=None,
            client_key=None,
        )


class TLSError(ValueError):
    """A CA or client certificate that ssl cannot load; the message says which and why."""


def tls_context(
    ca_data: bytes | None, insecure: bool, certificate: bytes | None, key: bytes | None
) -> ssl.SSLContext:
    """A client context trusting ``ca_data`` (or the system store), presenting the certificate
    (with ``key``, or a key in the same PEM) if given; raises TLSError naming the part at fault."""
    context = ssl.create_default_context()
    if insecure:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif ca_data is not None:
        try:
            context.load_verify_locations(cadata=ca_data.decode())
        except (ssl.SSLError, ValueError) as err:
            raise TLSError(f"certificate-authority: {err}") from None
    if certificate is not None:
        _load_cert_chain(context, certificate, key or certificate)
    return context


def load_kubeconfig(path: Path, flag: str = "--kubeconfig") -> Connection:
    """The current context of the kubeconfig at ``path``; errors name ``flag`` and the field."""
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as err:
        raise KubeconfigError(f"{flag} {path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise KubeconfigError(f"{flag} {path}: not YAML: {err}") from None
    if not isinstance(document, dict):
        raise KubeconfigError(f"{flag} {path}: expected a mapping at the top")
    return _Reader(path, document, flag).connection()


class _Reader:
    def __init__(self, path: Path, document: Mapping[str, Any], flag: str) -> None:
        self.path = path
        self.document = document
        self.flag = flag

    def fail(self, message: str) -> KubeconfigError:
        return KubeconfigError(f"{self.flag} {self.path}: {message}")

    def named(self, section: str, name: str) -> Mapping[str, Any]:
        for entry in self.document.get(section) or []:
            if isinstance(entry, dict) and entry.get("name") == name:
                body = entry.get(section[:-1])
                if not isinstance(body, dict):
                    raise self.fail(f"{section}[{name}]: no {section[:-1]} mapping")
                return body
        raise self.fail(f"{section}: no entry named {name!r}")

    def connection(self) -> Connection:
        current = self.document.get("current-context")
        contexts = self.document.get("contexts") or []
        if not current:
            if len(contexts) != 1:
                raise self.fail("current-context is not set")
            current = contexts[0].get("name")
        context = self.named("contexts", str(current))
        cluster = self.named("clusters", str(context.get("cluster", "")))
        user_name = str(context.get("user", ""))
        user = self.named("users", user_name) if user_name else {}
        server = str(cluster.get("server", "")).rstrip("/")
        if not server.startswith(("https://", "http://")):
            raise self.fail(f"clusters[{context.get('cluster')}].server: {server!r} is not a URL")
        token = user.get("token")
        if user.get("tokenFile"):
            token = self.file(user["tokenFile"], "users.user.tokenFile").decode().strip()
        insecure = bool(cluster.get("insecure-skip-tls-verify"))
        ca = None
        if not insecure:
            ca = self.data_or_file(cluster, "certificate-authority", "clusters.cluster")
        cert = self.data_or_file(user, "client-certificate", "users.user")
        key = self.data_or_file(user, "client-key", "users.user")
        ssl_context = None
        if server.startswith("https://"):
            try:
                ssl_context = tls_context(ca, insecure, cert, key)
            except TLSError as err:
                where = "clusters.cluster" if str(err).startswith("certificate-") else "users.user"
                raise self.fail(f"{where}.{err}") from None
        return Connection(
            server=server,
            ssl_context=ssl_context,
            token=token,
            user=user_name,
            ca_data=ca,
            insecure=insecure,
            client_certificate=cert,
            client_key=key or cert if cert is not None else None,
        )

    def data_or_file(self, section: Mapping[str, Any], field: str, where: str) -> bytes | None:
        data = section.get(f"{field}-data")
        if data:
            try:
                return base64.b64decode(str(data), validate=True)
            except ValueError:
                raise self.fail(f"{where}.{field}-data: not base64") from None
        if section.get(field):
            return self.file(section[field], f"{where}.{field}")
        return None

    def file(self, name: str, where: str) -> bytes:
        path = Path(os.path.expanduser(str(name)))
        if not path.is_absolute():
            path = self.path.parent / path
        try:
            return path.read_bytes()
        except OSError as err:
            raise self.fail(f"{where}: {path}: {err.strerror}") from None


def _load_cert_chain(context: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """ssl only loads client certificates from files: write both to a private temp dir."""
    with tempfile.TemporaryDirectory(prefix="trio-kubelet-") as private:
        cert_path, key_path = Path(private, "client.crt"), Path(private, "client.key")
        cert_path.write_bytes(cert)
        key_path.touch(mode=0o600)
        key_path.write_bytes(key)
        try:
            context.load_cert_chain(str(cert_path), str(key_path))
        except ssl.SSLError as err:
            raise TLSError(f"client-certificate/client-key: {err}") from None


def write_certificate_kubeconfig(path: Path, bootstrap: Connection, pem_path: Path) -> None:
    """The kubeconfig a bootstrapped node keeps using (as Go's kubelet writes it): the bootstrap
    kubeconfig's server and CA, and a client certificate and key both read from ``pem_path``
    (the certificate store's current pair, so a rotation needs no rewrite)."""
    cluster: dict[str, Any] = {"server": bootstrap.server}
    if bootstrap.insecure:
        cluster["insecure-skip-tls-verify"] = True
    elif bootstrap.ca_data is not None:
        cluster["certificate-authority-data"] = base64.b64encode(bootstrap.ca_data).decode()
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "default-cluster", "cluster": cluster}],
        "users": [
            {
                "name": "default-auth",
                "user": {"client-certificate": str(pem_path), "client-key": str(pem_path)},
            }
        ],
        "contexts": [
            {
                "name": "default-context",
                "context": {
                    "cluster": "default-cluster",
                    "user": "default-auth",
                    "namespace": "default",
                },
            }
        ],
        "current-context": "default-context",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        yaml.safe_dump(document, file, default_flow_style=False, sort_keys=False)
    os.replace(tmp, path)
