"""A local image registry for tests: Debian's docker-registry serving plain HTTP on 127.0.0.1.

containerd treats a loopback registry as plain HTTP without any hosts configuration, so the
test containerd pulls from it as it is. Images are variants of the locally built busybox
(same layer, a different config, hence a different image ID), imported into a namespace of
their own and pushed with ``ctr``; the k8s.io namespace the agent uses only sees them once
it pulls them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from tests.containerd_fixture import Containerd, images
from tests.net import free_port

REGISTRY_BIN = "docker-registry"
PUSH_NAMESPACE = "tk-registry"
START_TIMEOUT = 20.0


@cache
def _busybox_layer() -> bytes:
    return images.busybox_layer(images.BUSYBOX_BIN).tar()


def variant_image(ref: str, variant: str) -> bytes:
    """An OCI layout of busybox under ``ref`` whose config (and so ID) depends on ``variant``."""
    config = {
        "Env": [f"PATH={images.DEFAULT_PATH}", f"TK_VARIANT={variant}"],
        "Cmd": ["sh"],
        "WorkingDir": "/",
    }
    return images.image_layout(_busybox_layer(), config, (ref,))


@dataclass
class Registry:
    """A running registry: ``host`` is ``127.0.0.1:PORT``."""

    host: str
    root: Path
    containerd: Containerd
    user: tuple[str, str] | None = None

    @property
    def log(self) -> Path:
        return self.root / "registry.log"

    def ref(self, repository: str, tag: str) -> str:
        return f"{self.host}/{repository}:{tag}"

    def push(self, repository: str, tag: str, variant: str | None = None) -> str:
        """Build a busybox variant, push it as ``repository:tag``; returns its reference."""
        ref = self.ref(repository, tag)
        tarball = self.root / f"{repository.replace('/', '_')}_{tag}.tar"
        tarball.write_bytes(variant_image(ref, variant or f"{repository}:{tag}"))
        ctr = ["-n", PUSH_NAMESPACE]
        self.containerd.ctr(*ctr, "images", "import", str(tarball))
        auth = ["--user", ":".join(self.user)] if self.user else []
        self.containerd.ctr(*ctr, "images", "push", "--plain-http", *auth, ref)
        self.containerd.ctr(*ctr, "images", "rm", ref)
        return ref

    def manifest_requests(self, repository: str, tag: str) -> int:
        """How many times a client asked for the manifest of ``repository:tag`` (access log)."""
        needle = f" /v2/{repository}/manifests/{tag} HTTP"
        return sum(1 for line in self.log.read_text().splitlines()
                   if needle in line and line.startswith("127.0.0.1 - "))

    def manifest_request_times(self, repository: str, tag: str) -> list[float]:
        """When (seconds since the epoch, whole seconds) each manifest request came."""
        needle = f" /v2/{repository}/manifests/{tag} HTTP"
        times = []
        for line in self.log.read_text().splitlines():
            if needle in line and line.startswith("127.0.0.1 - ") and '"HEAD ' in line:
                stamp = line.split("[", 1)[1].split("]", 1)[0]
                times.append(time.mktime(time.strptime(stamp, "%d/%b/%Y:%H:%M:%S %z")))
        return times


def bcrypt_htpasswd(user: str, password: str) -> str | None:
    """An htpasswd line with a bcrypt hash (the registry's only scheme), if libcrypt can."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import crypt  # removed in Python 3.13: auth tests skip there
    except ImportError:
        return None
    hashed = crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))
    return f"{user}:{hashed}" if hashed and hashed.startswith("$2") else None


def unavailable_reason() -> str | None:
    if shutil.which(REGISTRY_BIN) is None:
        return "docker-registry is not installed: apt-get install docker-registry"
    return None


@contextmanager
def running_registry(containerd: Containerd, *, user: tuple[str, str] | None = None
                     ) -> Iterator[Registry]:
    """Start a registry on a free port (with htpasswd auth for ``user``); stop it afterwards."""
    reason = unavailable_reason()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="tk-registry-"))
    port = free_port()
    auth = ""
    if user is not None:
        line = bcrypt_htpasswd(*user)
        if line is None:
            shutil.rmtree(root, ignore_errors=True)
            pytest.skip("no bcrypt in this Python's crypt module for the registry's htpasswd")
        (root / "htpasswd").write_text(line + "\n")
        auth = f"auth:\n  htpasswd:\n    realm: trio-kubelet-test\n    path: {root}/htpasswd\n"
    (root / "config.yml").write_text(
        "version: 0.1\n"
        "log:\n  level: info\n  accesslog:\n    disabled: false\n"
        f"storage:\n  filesystem:\n    rootdirectory: {root}/data\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n" + auth
    )
    registry = Registry(host=f"127.0.0.1:{port}", root=root, containerd=containerd, user=user)
    with open(registry.log, "wb") as log:
        process = subprocess.Popen([REGISTRY_BIN, "serve", str(root / "config.yml")],
                                   stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_until_serving(registry, process)
        yield registry
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(root, ignore_errors=True)


def _wait_until_serving(registry: Registry, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"docker-registry exited: {registry.log.read_text()[-2000:]}")
        try:
            urllib.request.urlopen(f"http://{registry.host}/v2/", timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # 401 from an authenticating registry: it is serving
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"docker-registry did not answer in {START_TIMEOUT}s")


@pytest.fixture(scope="session")
def registry(containerd: Containerd) -> Iterator[Registry]:
    """An open (no auth) registry for the whole session."""
    with running_registry(containerd) as running:
        yield running
