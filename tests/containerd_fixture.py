"""The session fixture `containerd`: a private containerd (scripts/containerd-env).

Shared by tests/integration and tests/e2e: each conftest imports the fixture from here.
Debian's containerd 1.6 by default; with TRIO_KUBELET_CONTAINERD=2, containerd 2.x
(scripts/build-containerd2 builds it the first time, ~6 min).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import ModuleType

import grpc
import pytest
from cri_api.v1.api_pb2 import VersionRequest
from cri_api.v1.api_pb2_grpc import ImageServiceStub, RuntimeServiceStub

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
CONTAINERD_ENV = SCRIPTS / "containerd-env"
REUSE_ENV_VAR = "TRIO_KUBELET_CONTAINERD_SOCK"
#: "2" for containerd 2.x; containerd-env reads it too.
RUNTIME_ENV_VAR = "TRIO_KUBELET_CONTAINERD"
CRI_TIMEOUT = 30.0


def _load_script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


cri_reset = _load_script("cri_reset")
images = _load_script("images")


@dataclass
class Containerd:
    """A running containerd for tests: its socket, its directory and a few helpers."""

    socket: str
    root: Path  # the containerd-env directory: containerd.log, config.toml, root/, state/, cni/
    owned: bool = field(default=False, repr=False)

    BUSYBOX, BUSYBOX_TAGGED = images.BUSYBOX_REFS  # ":latest", and ":1.36" for IfNotPresent
    PAUSE = os.environ.get("TRIO_KUBELET_PAUSE_IMAGE", images.PAUSE_REF)

    @property
    def endpoint(self) -> str:
        return f"unix://{self.socket}"

    @property
    def log(self) -> Path:
        return self.root / "containerd.log"

    @cached_property
    def ctr_path(self) -> str:
        """The ctr of the containerd running here (containerd 2.x's own, or Debian's)."""
        bin_file = self.root / "containerd-bin"
        bin_dir = bin_file.read_text().strip() if bin_file.exists() else ""
        return str(Path(bin_dir, "ctr")) if bin_dir else "ctr"

    @cached_property
    def version(self) -> str:
        """The runtime's version as CRI reports it ("1.6.20", "v2.4.2")."""
        reply = self.runtime_service.Version(VersionRequest(), timeout=CRI_TIMEOUT)
        return str(reply.runtime_version)

    @property
    def major(self) -> int:
        return int(self.version.lstrip("v").split(".")[0])

    def ctr(self, *args: str, check: bool = True) -> str:
        """Run `ctr -a SOCK -n k8s.io ARGS…` and return its stdout; raise with stderr on failure."""
        done = subprocess.run(
            [self.ctr_path, "-a", self.socket, "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            timeout=CRI_TIMEOUT,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout

    @cached_property
    def _channel(self) -> grpc.Channel:
        return grpc.insecure_channel(self.endpoint)

    @cached_property
    def runtime_service(self) -> RuntimeServiceStub:
        """A blocking grpcio CRI RuntimeService stub (cri_api), for set-up and assertions."""
        return RuntimeServiceStub(self._channel)

    @cached_property
    def image_service(self) -> ImageServiceStub:
        """A blocking grpcio CRI ImageService stub (cri_api)."""
        return ImageServiceStub(self._channel)

    def reset(self) -> None:
        """Remove every pod and container in k8s.io and make sure the base images are there."""
        cri_reset.reset(self.runtime_service, timeout=CRI_TIMEOUT)
        # Containers made without CRI (ctr, or a half-created CRI container) are invisible to it.
        for container_id in self.ctr("containers", "ls", "-q").split():
            self.ctr("tasks", "rm", "-f", container_id, check=False)  # -f: SIGKILL first
            self.ctr("containers", "rm", container_id)
        self.restore_images()

    def close(self) -> None:
        if "_channel" in self.__dict__:
            self._channel.close()

    def stop_daemon(self) -> None:
        """Stop the containerd process alone (SIGTERM, as for an upgrade): its shims and the
        containers keep running, and `start_daemon` brings it back to them."""
        pid = int((self.root / "containerd.pid").read_text())
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while Path(f"/proc/{pid}").exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"containerd {pid} did not stop within 20s")
            time.sleep(0.05)

    def start_daemon(self) -> None:
        done = _containerd_env("start", str(self.root))
        if done.returncode != 0:
            raise RuntimeError(f"containerd-env start failed:\n{done.stderr}")

    def restore_images(self) -> None:
        """Re-import busybox/pause if a test removed them (image GC and RemoveImage tests do)."""
        present = set(self.ctr("images", "ls", "-q").split())
        if {self.BUSYBOX, self.BUSYBOX_TAGGED, self.PAUSE} <= present:
            return
        for tarball in images.build(images.default_cache_dir(), self.PAUSE, force=False):
            self.ctr("images", "import", str(tarball))


def _unavailable_reason() -> str | None:
    if os.geteuid() != 0:
        return "tests on a real containerd need root (containerd, runc, mounts, network namespaces)"
    if os.environ.get(RUNTIME_ENV_VAR) == "2":
        built = subprocess.run(["bash", str(SCRIPTS / "build-containerd2"), "--print"],
                               capture_output=True).returncode == 0
        if not built and shutil.which("go") is None:
            return "containerd 2.x is not built and Go is missing (scripts/build-containerd2)"
    missing = [tool for tool in ("containerd", "ctr", "runc") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not installed: run `scripts/containerd-env install`"
    if not Path("/usr/lib/cni/bridge").exists():
        return "CNI plugins not installed: run `scripts/containerd-env install`"
    return None


def _containerd_env(*args: str) -> subprocess.CompletedProcess[str]:
    # containerd 2.x's first start builds it (~6 min on 2 cores).
    return subprocess.run(
        ["bash", str(CONTAINERD_ENV), *args], capture_output=True, text=True, timeout=1200
    )


def _start(root: Path) -> Containerd:
    done = _containerd_env("start", str(root))
    if done.returncode != 0:
        log = root / "containerd.log"
        tail = log.read_text()[-3000:] if log.exists() else ""
        _containerd_env("stop", str(root))
        pytest.fail(f"containerd-env start failed:\n{done.stderr}\n--- containerd.log ---\n{tail}")
    return Containerd(socket=str(root / "containerd.sock"), root=root, owned=True)


@pytest.fixture(scope="session")
def containerd() -> Iterator[Containerd]:
    """A private containerd for the session, or the one named by $TRIO_KUBELET_CONTAINERD_SOCK.

    Skips when the machine cannot run it; under CI=true that is a failure instead, because CI
    installs everything and a silent skip would hide a test tier.
    """
    reason = _unavailable_reason()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"tests on a real containerd cannot run in CI: {reason}")
        pytest.skip(reason)
    reuse = os.environ.get(REUSE_ENV_VAR)
    if reuse:
        env = Containerd(socket=reuse, root=Path(reuse).parent)
        env.ctr("version")
    else:
        # Under /tmp, not pytest's tmp_path: unix socket paths are limited to 108 bytes.
        env = _start(Path(tempfile.mkdtemp(prefix="tk-ctrd-", dir="/tmp")))
    try:
        env.reset()
        yield env
    finally:
        env.close()
        if env.owned:
            done = _containerd_env("stop", str(env.root))
            if done.returncode == 0:
                shutil.rmtree(env.root, ignore_errors=True)
            else:
                sys.stderr.write(f"containerd-env stop failed, kept {env.root}:\n{done.stderr}")
