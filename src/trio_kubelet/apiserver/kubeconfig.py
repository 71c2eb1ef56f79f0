"""Reading a kubeconfig: the current context's server, CA, and client certificate or token."""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
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


def load_kubeconfig(path: Path) -> Connection:
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as err:
        raise KubeconfigError(f"--kubeconfig {path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise KubeconfigError(f"--kubeconfig {path}: not YAML: {err}") from None
    if not isinstance(document, dict):
        raise KubeconfigError(f"--kubeconfig {path}: expected a mapping at the top")
    return _Reader(path, document).connection()


class _Reader:
    def __init__(self, path: Path, document: Mapping[str, Any]) -> None:
        self.path = path
        self.document = document

    def fail(self, message: str) -> KubeconfigError:
        return KubeconfigError(f"--kubeconfig {self.path}: {message}")

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
        ssl_context = self.ssl_context(cluster, user) if server.startswith("https://") else None
        return Connection(server=server, ssl_context=ssl_context, token=token, user=user_name)

    def ssl_context(self, cluster: Mapping[str, Any], user: Mapping[str, Any]) -> ssl.SSLContext:
        context = ssl.create_default_context()
        if cluster.get("insecure-skip-tls-verify"):
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            ca = self.data_or_file(cluster, "certificate-authority", "clusters.cluster")
            if ca is not None:
                try:
                    context.load_verify_locations(cadata=ca.decode())
                except (ssl.SSLError, ValueError) as err:
                    raise self.fail(f"clusters.cluster.certificate-authority: {err}") from None
        cert = self.data_or_file(user, "client-certificate", "users.user")
        key = self.data_or_file(user, "client-key", "users.user")
        if cert is not None:
            _load_cert_chain(context, cert, key or cert, self.fail)
        return context

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


def _load_cert_chain(context: ssl.SSLContext, cert: bytes, key: bytes, fail: Any) -> None:
    """ssl only loads client certificates from files: write both to a private temp dir."""
    with tempfile.TemporaryDirectory(prefix="trio-kubelet-") as private:
        cert_path, key_path = Path(private, "client.crt"), Path(private, "client.key")
        cert_path.write_bytes(cert)
        key_path.touch(mode=0o600)
        key_path.write_bytes(key)
        try:
            context.load_cert_chain(str(cert_path), str(key_path))
        except ssl.SSLError as err:
            raise fail(f"users.user.client-certificate/client-key: {err}") from None
