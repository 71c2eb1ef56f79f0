"""End-to-end fixtures: a real control plane (scripts/control-plane: etcd + kube-apiserver), one
that nodes join as kubeadm nodes do (kube-controller-manager signing and approving CSRs,
kube-apiserver verifying kubelets' serving certificates), the private containerd shared with
tests/integration, and the `e2e` marker."""

from __future__ import annotations

import os
import shlex
import shutil
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.containerd_fixture import Containerd, containerd

__all__ = ["Containerd", "containerd"]  # the session fixture; Containerd for type annotations

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE.parents[1] / "scripts"
CONTROL_PLANE = SCRIPTS / "control-plane"
REUSE_ENV_VAR = "TRIO_KUBELET_E2E_CONTROL_PLANE"
JOIN_REUSE_ENV_VAR = "TRIO_KUBELET_E2E_JOIN_CONTROL_PLANE"
CLUSTER_REUSE_ENV_VAR = "TRIO_KUBELET_E2E_CLUSTER_CONTROL_PLANE"
NODE = "e2e-node"  # the node the session's credentials are made for
UP_TIMEOUT = 3600.0  # seconds: the first `up` on a machine builds kube-apiserver and etcd


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "e2e: needs a real etcd + kube-apiserver (scripts/control-plane)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/e2e gets the `e2e` marker (-m 'not e2e' skips the tier)."""
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)


def _control_plane(*args: str, timeout: float = 120.0) -> str:
    """Run scripts/control-plane ARGS; its stdout, or the test fails with its stderr."""
    done = subprocess.run(
        [sys.executable, str(CONTROL_PLANE), *args], capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        pytest.fail(f"control-plane {' '.join(args)} failed:\n{done.stderr}", pytrace=False)
    return done.stdout


@dataclass(frozen=True)
class ControlPlane:
    """A running etcd + kube-apiserver: where it is, credentials, and apiserver stop/start."""

    dir: Path
    server: str  # https://127.0.0.1:PORT
    node: str = NODE  # the node name the fixture made a certificate and kubeconfig for

    @property
    def ca(self) -> Path:
        return self.dir / "pki" / "ca.crt"

    @property
    def admin_kubeconfig(self) -> Path:
        return self.dir / "admin.kubeconfig"

    @property
    def bootstrap_kubeconfig(self) -> Path:
        """The bootstrap token's kubeconfig (system:bootstrappers), what `kubeadm join` gives."""
        return self.dir / "bootstrap.kubeconfig"

    def start_controller_manager(self, *flags: str) -> None:
        """(Re)start kube-controller-manager with ``flags`` (e.g. --cluster-signing-duration 3m);
        returns once its /healthz answers."""
        _control_plane("start-controller-manager", str(self.dir), *flags)

    def node_kubeconfig(self, name: str = NODE) -> Path:
        """DIR/node-NAME.kubeconfig (identity system:node:NAME), made on first use."""
        path = self.dir / f"node-{name}.kubeconfig"
        if not path.exists():
            _control_plane("up", str(self.dir), "--node", name)
        return path

    def stop_apiserver(self) -> None:
        """Stop kube-apiserver (etcd keeps running): the API server is down until start."""
        _control_plane("stop-apiserver", str(self.dir))

    def start_apiserver(self) -> None:
        """Start kube-apiserver again on the same port; returns once /readyz answers 200."""
        _control_plane("start-apiserver", str(self.dir))

    def admin(self) -> httpx.Client:
        """A client authenticated as admin (system:masters): can do anything."""
        return self._client("admin")

    def node_client(self, name: str = NODE) -> httpx.Client:
        """A client authenticated as system:node:NAME (Node authorizer + NodeRestriction)."""
        self.node_kubeconfig(name)
        return self._client(f"node-{name}")

    def bootstrap_client(self) -> httpx.Client:
        """A client authenticated by the bootstrap token (system:bootstrap:<id>)."""
        token = (self.dir / "pki" / "bootstrap-token").read_text().strip()
        return httpx.Client(
            base_url=self.server,
            verify=ssl.create_default_context(cafile=self.ca),
            headers={"Authorization": f"Bearer {token}"},
            timeout=10.0,
        )

    def certificate_client(self, cert_file: Path, key_file: Path) -> httpx.Client:
        """A client authenticated by a certificate the test holds (one the cluster issued)."""
        context = ssl.create_default_context(cafile=self.ca)
        context.load_cert_chain(cert_file, key_file)
        return httpx.Client(base_url=self.server, verify=context, timeout=10.0)

    def _client(self, stem: str) -> httpx.Client:
        context = ssl.create_default_context(cafile=self.ca)
        context.load_cert_chain(self.dir / "pki" / f"{stem}.crt", self.dir / "pki" / f"{stem}.key")
        return httpx.Client(base_url=self.server, verify=context, timeout=10.0)


def _up(directory: Path, *flags: str) -> ControlPlane:
    """`control-plane up DIR --node NODE FLAGS` (idempotent); the server URL is in its env lines."""
    output = _control_plane("up", str(directory), "--node", NODE, *flags, timeout=UP_TIMEOUT)
    env = dict(word.split("=", 1) for word in shlex.split(output) if "=" in word)
    return ControlPlane(dir=directory, server=env["TRIO_KUBELET_APISERVER"])


def _unavailable_reason() -> str | None:
    """Why the control plane cannot come up here: no cached binaries and no Go to build them."""
    cached = subprocess.run([str(SCRIPTS / "build-control-plane"), "--print"], capture_output=True)
    if cached.returncode != 0 and shutil.which("go") is None:
        return "kube-apiserver/etcd are not built and Go is not installed (docs/cluster.md)"
    return None


def _control_plane_fixture(reuse_env_var: str, prefix: str, *flags: str) -> Iterator[ControlPlane]:
    """A control plane in a new /tmp/PREFIX* (stopped and deleted at the end), or the running one
    named by $REUSE_ENV_VAR (left running). Skips when it cannot be built; under CI=true that is a
    failure instead, because CI installs everything and a silent skip would hide the e2e tier."""
    reuse = os.environ.get(reuse_env_var)
    if reuse:
        yield _up(Path(reuse).resolve(), *flags)
        return
    reason = _unavailable_reason()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"e2e tests cannot run in CI: {reason}")
        pytest.skip(reason)
    directory = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield _up(directory, *flags)
    finally:
        done = subprocess.run(
            [sys.executable, str(CONTROL_PLANE), "down", str(directory)],
            capture_output=True,
            text=True,
        )
        if done.returncode == 0:
            shutil.rmtree(directory, ignore_errors=True)
        else:
            sys.stderr.write(f"control-plane down failed, kept {directory}:\n{done.stderr}")


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """etcd + kube-apiserver for the session, or the running one in
    $TRIO_KUBELET_E2E_CONTROL_PLANE."""
    yield from _control_plane_fixture(REUSE_ENV_VAR, "tk-cp-")


@pytest.fixture(scope="session")
def join_control_plane() -> Iterator[ControlPlane]:
    """A control plane nodes join as kubeadm nodes do, or the running one in
    $TRIO_KUBELET_E2E_JOIN_CONTROL_PLANE: kube-controller-manager signs (with the cluster CA) and
    approves node client CSRs, the bootstrap token and kubeadm's RBAC for it exist, and
    kube-apiserver verifies kubelets' serving certificates (--kubelet-certificate-authority), so
    `kubectl logs/exec` reach only a kubelet whose serving certificate the cluster issued."""
    yield from _control_plane_fixture(
        JOIN_REUSE_ENV_VAR,
        "tk-cp-join-",
        "--controller-manager",
        "--kubelet-certificate-authority",
    )


@pytest.fixture(scope="session")
def cluster_control_plane() -> Iterator[ControlPlane]:
    """A control plane that schedules and manages pods as a cluster's does, or the running one in
    $TRIO_KUBELET_E2E_CLUSTER_CONTROL_PLANE: kube-scheduler, and kube-controller-manager with every
    controller (deployments, jobs, node lifecycle, garbage collection...)."""
    for plane in _control_plane_fixture(
        CLUSTER_REUSE_ENV_VAR, "tk-cp-cluster-", "--controller-manager", "--scheduler"
    ):
        plane.start_controller_manager("--controllers", "*")
        yield plane


CLIENTS_BUILD_TIMEOUT = 3600.0  # seconds: the first build on a machine compiles both from source


@pytest.fixture(scope="session")
def clients() -> Path:
    """The directory holding kubectl and metrics-server of scripts/build-clients (built on
    first use)."""
    cached = subprocess.run([SCRIPTS / "build-clients", "--print"], capture_output=True, text=True)
    if cached.returncode != 0 and shutil.which("go") is None:
        reason = "kubectl/metrics-server are not built and Go is not installed (docs/cluster.md)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    built = subprocess.run(
        [SCRIPTS / "build-clients"], capture_output=True, text=True, timeout=CLIENTS_BUILD_TIMEOUT
    )
    assert built.returncode == 0, built.stderr
    return Path(built.stdout.strip())


def kubectl(
    clients: Path, cp: ControlPlane, *args: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    """The release's own kubectl (``clients``, scripts/build-clients) as ``cp``'s admin."""
    return subprocess.run(
        [clients / "kubectl", "--kubeconfig", str(cp.admin_kubeconfig), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
