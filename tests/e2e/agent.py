"""The agent as an operator runs it (a `trio-kubelet` process) against the e2e control plane,
and a small admin-side API helper to create pods and wait on what the API server shows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from tests.e2e.csr import CSRS
from tests.net import free_port

if TYPE_CHECKING:
    from tests.e2e.conftest import ControlPlane

JSON = dict[str, Any]
POLL = 0.2


@dataclass
class AgentProcess:
    """One `python -m trio_kubelet` process; restartable with the same flags and directories."""

    args: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def port(self) -> int:
        """The kubelet API's HTTPS port."""
        return int(self.args[self.args.index("--port") + 1])

    def start(self) -> None:
        out = self.log.open("ab")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "trio_kubelet", *self.args],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, as when a node agent crashes."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def text(self) -> str:
        return self.log.read_text(errors="replace")


@contextmanager
def running_agent(
    tmp: Path, node: str, kubeconfig: Path, endpoint: str, ca: Path, *extra: str
) -> Iterator[AgentProcess]:
    manifests = tmp / "manifests"
    manifests.mkdir(exist_ok=True)
    agent = AgentProcess(
        args=[
            "--kubeconfig",
            str(kubeconfig),
            "--hostname-override",
            node,
            "--node-ip",
            "127.0.0.1",
            "--container-runtime-endpoint",
            endpoint,
            "--root-dir",
            str(tmp / "root"),
            "--pod-logs-dir",
            str(tmp / "logs"),
            "--pod-manifest-path",
            str(manifests),
            "--port",
            str(free_port()),
            "--healthz-port",
            "0",
            "--client-ca-file",
            str(ca),
            "--sync-frequency",
            "10s",
            *extra,
        ],
        log=tmp / "agent.log",
    )
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()
        # Like the Go kubelet, a stopped agent leaves its pods' volumes mounted (a restart
        # adopts them); the test's pods are gone with it, so their mounts go too.
        unmount_under(tmp / "root")


def unmount_under(root: Path) -> None:
    """Lazily unmount every mount point below ``root``, deepest first."""
    prefix = f"{root.resolve()}/"
    with open("/proc/self/mountinfo") as mounts:
        points = [line.split()[4] for line in mounts]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


PODS = "/api/v1/namespaces/default/pods"


class Api:
    """The admin's view of the cluster, through the real API server."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    def ensure_namespace_defaults(self, ca: Path) -> None:
        """What controller-manager would publish in ``default`` (none runs here): the default
        ServiceAccount, and the kube-root-ca.crt ConfigMap that every pod's service-account
        volume projects."""
        self.create("/api/v1/namespaces/default/serviceaccounts", {"metadata": {"name": "default"}})
        self.create(
            "/api/v1/namespaces/default/configmaps",
            {"metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": ca.read_text()}},
        )

    def get(self, path: str) -> JSON | None:
        answer = self.client.get(path)
        if answer.status_code == 404:
            return None
        answer.raise_for_status()
        result: JSON = answer.json()
        return result

    def create(self, path: str, body: JSON) -> JSON:
        answer = self.client.post(path, json=body)
        if answer.status_code == 409:
            existing = self.get(f"{path}/{body['metadata']['name']}")
            assert existing is not None
            return existing
        assert answer.status_code == 201, answer.text
        result: JSON = answer.json()
        return result

    def delete(self, path: str, grace: int | None = None) -> None:
        body = {"gracePeriodSeconds": grace} if grace is not None else None
        answer = self.client.request("DELETE", path, json=body)
        assert answer.status_code in (200, 202, 404), answer.text

    def wait(
        self,
        path: str,
        predicate: Callable[[JSON | None], bool],
        timeout: float = 60.0,
        what: str = "",
    ) -> JSON | None:
        """Poll ``path`` until ``predicate(object or None)``; fail with the last object seen."""
        deadline = time.monotonic() + timeout
        while True:
            obj = self.get(path)
            if predicate(obj):
                return obj
            if time.monotonic() > deadline:
                raise AssertionError(f"{what or path}: not reached in {timeout:g}s; last: {obj}")
            time.sleep(POLL)


@contextmanager
def node_agent(
    control_plane: ControlPlane, endpoint: str, tmp: Path, node: str, *extra: str
) -> Iterator[AgentProcess]:
    """The agent of ``node`` on the runtime at ``endpoint`` (``extra`` flags appended); the
    tail of its log is printed after (pytest shows it when the test failed)."""
    kubeconfig = control_plane.node_kubeconfig(node)
    with running_agent(tmp, node, kubeconfig, endpoint, control_plane.ca, *extra) as run:
        try:
            yield run
        finally:
            print(run.text()[-6000:])


@contextmanager
def node_admin(client: httpx.Client, node: str, ca: Path) -> Iterator[Api]:
    """The admin's Api for tests of ``node``'s pods; those pods are deleted (grace 0) after."""
    admin = Api(client)
    admin.ensure_namespace_defaults(ca)
    yield admin
    for pod in (admin.get(f"{PODS}?fieldSelector=spec.nodeName={node}") or {})["items"]:
        admin.delete(f"{PODS}/{pod['metadata']['name']}", grace=0)


@contextmanager
def joining_node_admin(cp: ControlPlane, node: str) -> Iterator[Api]:
    """node_admin on ``cp`` for a node that joins it; after, the Node object and the node's
    certificate signing requests are deleted too."""
    with cp.admin() as client, node_admin(client, node, cp.ca) as admin:
        yield admin
        admin.delete(f"/api/v1/nodes/{node}")
        for csr in (admin.get(CSRS) or {}).get("items", []):
            if csr["spec"]["username"] == f"system:node:{node}":
                admin.delete(f"{CSRS}/{csr['metadata']['name']}")


def pod_manifest(name: str, node: str, image: str, command: list[str], **spec: Any) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": command,
                }
            ],
            **spec,
        },
    }


def container_status(pod: JSON | None, name: str = "main") -> JSON:
    for status in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        if status["name"] == name:
            result: JSON = status
            return result
    return {}


def condition(pod: JSON | None, kind: str) -> str:
    for cond in ((pod or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == kind:
            return str(cond["status"])
    return ""
