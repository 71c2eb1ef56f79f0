"""Where the node keeps a certificate the cluster issued: client-go's file store layout.

Each new pair is written to ``<dir>/<prefix>-<YYYY-MM-DD-HH-MM-SS>.pem`` (certificates, then the
key; mode 0600) and ``<prefix>-current.pem`` is made a symlink to it, so the kubeconfig that names
the current file never changes. The switch goes through ``<prefix>-updated.pem``, renamed over
the current link in one step (Go removes the old link first; a crash between the two leaves only
the ``updated`` link, which is taken up at the next start as Go does).
"""

from __future__ import annotations

import datetime
import logging
import os
from pathlib import Path

from trio_kubelet.certificate.keys import KeyPair, PEMError, key_pair, split_pem

log = logging.getLogger(__name__)


class StoreError(Exception):
    """The store's files cannot be written or are not what they should be; says which."""


class CertificateStore:
    """The pairs ``<prefix>-*.pem`` in ``directory`` (e.g. ``kubelet-client`` in --cert-dir)."""

    def __init__(self, prefix: str, directory: Path) -> None:
        self.prefix = prefix
        self.directory = directory

    @property
    def current_path(self) -> Path:
        return self.directory / f"{self.prefix}-current.pem"

    @property
    def _updated_path(self) -> Path:
        return self.directory / f"{self.prefix}-updated.pem"

    def recover(self) -> None:
        """Finish a switch a crash interrupted: an ``updated`` link and no ``current`` one."""
        if self.current_path.exists() or not self._updated_path.is_symlink():
            return
        os.replace(self._updated_path, self.current_path)
        log.info("Recovered %s from an interrupted certificate update", self.current_path)

    def current(self) -> KeyPair | None:
        """The current pair, or None when there is none or it cannot be used (logged)."""
        self.recover()
        try:
            data = self.current_path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            log.warning("Cannot read %s: %s", self.current_path, err.strerror or err)
            return None
        try:
            return key_pair(*split_pem(data))
        except PEMError as err:
            log.warning("Cannot use %s: %s", self.current_path, err)
            return None

    def update(self, certificate: bytes, key: bytes, now: datetime.datetime) -> KeyPair:
        """Write a new pair and make it current; StoreError if it cannot be done."""
        try:
            pair = key_pair(certificate, key)
        except PEMError as err:
            raise StoreError(
                f"the {self.prefix} certificate and key do not go together: {err}"
            ) from None
        stamp = now.astimezone().strftime("%Y-%m-%d-%H-%M-%S")
        path = self.directory / f"{self.prefix}-{stamp}.pem"
        try:
            self.directory.mkdir(mode=0o755, parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                os.write(fd, _with_newline(certificate) + _with_newline(key))
                os.fsync(fd)
            finally:
                os.close(fd)
            if self.current_path.exists() and not self.current_path.is_symlink():
                raise StoreError(f"{self.current_path} should be a symlink but is a file")
            self._updated_path.unlink(missing_ok=True)
            os.symlink(path.absolute(), self._updated_path)
            os.replace(self._updated_path, self.current_path)
        except OSError as err:
            raise StoreError(f"cannot store the {self.prefix} certificate in {self.directory}: "
                             f"{err.strerror or err}") from None
        return pair


def _with_newline(pem: bytes) -> bytes:
    return pem if pem.endswith(b"\n") else pem + b"\n"
