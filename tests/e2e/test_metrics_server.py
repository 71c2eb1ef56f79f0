"""The ecosystem's own clients against the node: metrics-server (built from the Go module proxy by
scripts/build-clients) scrapes the agent's /metrics/resource over its serving port, and kubectl
(the same build) shows the figures with `kubectl top node` / `kubectl top pod` through the
aggregation layer (the APIService v1beta1.metrics.k8s.io).

metrics-server runs as a host process, not as the usual Deployment: this control plane listens on
loopback and the host runs no kube-proxy, so a pod could reach neither the API server nor be
reached through a Service's cluster IP. As a process it does what its pod does — watches nodes and
pods, scrapes each node's kubelet at its InternalIP and status port, serves metrics.k8s.io
behind kube-apiserver's front proxy — with the identity its manifest gives it (the
kube-system/metrics-server service account and RBAC), and it verifies the kubelet's serving
certificate against the cluster CA (serverTLSBootstrap, the CSR approved with `kubectl
certificate approve`), so `--kubelet-insecure-tls` is not needed.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.containerd_fixture import Containerd
from tests.e2e.agent import JSON, PODS, Api, joining_node_admin, node_agent, pod_manifest
from tests.e2e.conftest import ControlPlane, kubectl
from tests.e2e.csr import CSRS
from tests.net import free_port

pytestmark = pytest.mark.e2e

NODE = "metrics-node"
POD = "busy"
NAMESPACE = "kube-system"
NAME = "metrics-server"
APISERVICE = "/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.metrics.k8s.io"
# ~29 MiB held by the shell (a 30 MB variable), and a little CPU every second.
WORKLOAD = (
    "x=$(head -c 30000000 /dev/zero | tr '\\0' x); "
    "while true; do i=0; while [ $i -lt 3000 ]; do i=$((i+1)); done; sleep 1; done"
)


def host_address() -> str:
    """The source address of the default route: where kube-apiserver reaches metrics-server
    (a Service's endpoints may not be loopback addresses)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("203.0.113.1", 9))  # TEST-NET-3; no packet is sent, only a route picked
        address: str = probe.getsockname()[0]
    if address.startswith("127."):
        pytest.skip("no default route: metrics-server needs an address other than loopback")
    return address


def rbac_objects() -> list[tuple[str, JSON]]:
    """What metrics-server's manifest (components.yaml) grants its service account: read nodes'
    metrics, list pods and nodes, delegate authentication and authorization to the API server
    and read the front proxy's CA."""
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    account = [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]

    def role_ref(kind: str, name: str) -> JSON:
        return {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": name}

    return [
        (f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts", {"metadata": {"name": NAME}}),
        (
            f"{rbac}/clusterroles",
            {
                "metadata": {"name": f"system:{NAME}"},
                "rules": [
                    {"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]},
                    {
                        "apiGroups": [""],
                        "resources": ["pods", "nodes"],
                        "verbs": ["get", "list", "watch"],
                    },
                ],
            },
        ),
        (
            f"{rbac}/clusterrolebindings",
            {
                "metadata": {"name": f"system:{NAME}"},
                "roleRef": role_ref("ClusterRole", f"system:{NAME}"),
                "subjects": account,
            },
        ),
        (
            f"{rbac}/clusterrolebindings",
            {
                "metadata": {"name": f"{NAME}:system:auth-delegator"},
                "roleRef": role_ref("ClusterRole", "system:auth-delegator"),
                "subjects": account,
            },
        ),
        (
            f"{rbac}/namespaces/{NAMESPACE}/rolebindings",
            {
                "metadata": {"name": f"{NAME}-auth-reader"},
                "roleRef": role_ref("Role", "extension-apiserver-authentication-reader"),
                "subjects": account,
            },
        ),
    ]


def serving_objects(address: str, port: int) -> list[tuple[str, JSON]]:
    """The Service the APIService names, its one endpoint (the host process), the APIService."""
    return [
        (
            f"/api/v1/namespaces/{NAMESPACE}/services",
            {
                "metadata": {"name": NAME},
                "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]},
            },
        ),
        (
            f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices",
            {
                "metadata": {
                    "name": f"{NAME}-host",
                    "labels": {"kubernetes.io/service-name": NAME},
                },
                "addressType": "IPv4",
                "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
                "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
            },
        ),
        (
            "/apis/apiregistration.k8s.io/v1/apiservices",
            {
                "metadata": {"name": "v1beta1.metrics.k8s.io"},
                "spec": {
                    "service": {"name": NAME, "namespace": NAMESPACE},
                    "group": "metrics.k8s.io",
                    "version": "v1beta1",
                    # metrics-server serves a self-signed certificate unless given one, as in
                    # its own manifest.
                    "insecureSkipTLSVerify": True,
                    "groupPriorityMinimum": 100,
                    "versionPriority": 100,
                },
            },
        ),
    ]


@contextmanager
def created(api: Api, objects: list[tuple[str, JSON]]) -> Iterator[None]:
    """Create ``objects``; delete them again in reverse order (the APIService first: one left
    unavailable would break every client's discovery of the shared control plane)."""
    for path, body in objects:
        api.create(path, body)
    try:
        yield
    finally:
        for path, body in reversed(objects):
            api.delete(f"{path}/{body['metadata']['name']}")


def service_account_kubeconfig(cp: ControlPlane, api: Api, path: Path) -> Path:
    """A kubeconfig holding a token of kube-system/metrics-server (TokenRequest)."""
    answer = api.client.post(
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{NAME}/token",
        json={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}},
    )
    assert answer.status_code == 201, answer.text
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": cp.server,
                                                 "certificate-authority": str(cp.ca)}}],
        "users": [{"name": NAME, "user": {"token": answer.json()["status"]["token"]}}],
        "contexts": [{"name": NAME, "context": {"cluster": "e2e", "user": NAME}}],
        "current-context": NAME,
    }
    path.write_text(json.dumps(config))
    return path


@contextmanager
def metrics_server(
    binary: Path, kubeconfig: Path, ca: Path, address: str, port: int, tmp: Path
) -> Iterator[subprocess.Popen[bytes]]:
    """metrics-server serving at ADDRESS:PORT; its log is printed after."""
    log = tmp / "metrics-server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                binary,
                f"--bind-address={address}",
                f"--secure-port={port}",
                f"--cert-dir={tmp / 'metrics-server-certs'}",
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--kubelet-preferred-address-types=InternalIP",
                "--kubelet-use-node-status-port",
                f"--kubelet-certificate-authority={ca}",
                # Its minimum, so that the two scrapes a CPU rate needs come sooner; a scrape's
                # timeout must then be shorter than 9 s.
                "--metric-resolution=10s",
                "--kubelet-request-timeout=5s",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        print(log.read_text(errors="replace")[-6000:])


def wait_available(api: Api, process: subprocess.Popen[bytes], timeout: float = 90) -> None:
    """Until kube-apiserver finds the metrics.k8s.io APIService Available (it has reached
    metrics-server's discovery endpoint)."""

    def available(service: JSON | None) -> bool:
        assert process.poll() is None, f"metrics-server exited ({process.returncode})"
        conditions = ((service or {}).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)

    api.wait(APISERVICE, available, timeout=timeout, what="the metrics.k8s.io APIService")


def approve_serving_csr(clients: Path, cp: ControlPlane, api: Api, timeout: float = 90) -> None:
    """Wait for the node's kubelet-serving CSR and approve it with kubectl, as an operator does
    (kube-controller-manager signs it but does not approve serving certificates)."""
    deadline = time.monotonic() + timeout
    while True:
        pending = [
            csr["metadata"]["name"]
            for csr in (api.get(CSRS) or {})["items"]
            if csr["spec"]["signerName"] == "kubernetes.io/kubelet-serving"
            and csr["spec"]["username"] == f"system:node:{NODE}"
        ]
        if pending:
            break
        assert time.monotonic() < deadline, f"no serving CSR from {NODE} in {timeout}s"
        time.sleep(0.5)
    done = kubectl(clients, cp, "certificate", "approve", *pending)
    assert done.returncode == 0, done.stderr


def top(clients: Path, cp: ControlPlane, *args: str, timeout: float = 120) -> dict[str, str]:
    """`kubectl top ARGS` once metrics-server has figures: the first row, by column heading."""
    deadline = time.monotonic() + timeout
    while True:
        done = kubectl(clients, cp, "top", *args)
        lines = done.stdout.splitlines()
        if done.returncode == 0 and len(lines) >= 2:
            return dict(zip(lines[0].split(), lines[1].split(), strict=True))
        assert time.monotonic() < deadline, (
            f"kubectl top {' '.join(args)}: no figures in {timeout}s: {done.stderr}"
        )
        time.sleep(2)


def quantity(text: str, unit: str) -> int:
    """``250m`` (unit m) or ``31Mi`` (unit Mi) as a number of that unit."""
    match = re.fullmatch(rf"(\d+){unit}", text)
    assert match, f"{text!r} is not a figure in {unit}"
    return int(match.group(1))


@pytest.fixture
def api(join_control_plane: ControlPlane) -> Iterator[Api]:
    with joining_node_admin(join_control_plane, NODE) as admin:
        yield admin


def test_kubectl_top_shows_the_node_and_a_pod_through_metrics_server(
    join_control_plane: ControlPlane,
    containerd: Containerd,
    tmp_path: Path,
    api: Api,
    clients: Path,
) -> None:
    cp = join_control_plane
    address, port = host_address(), free_port()
    config = tmp_path / "kubelet.yaml"
    config.write_text(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
        "serverTLSBootstrap: true\n"
    )
    with (
        created(api, rbac_objects()),
        created(api, serving_objects(address, port)),
        node_agent(cp, containerd.endpoint, tmp_path, NODE, "--config", str(config)),
    ):
        approve_serving_csr(clients, cp, api)
        api.create(PODS, pod_manifest(POD, NODE, containerd.BUSYBOX_TAGGED, ["sh", "-c", WORKLOAD]))
        kubeconfig = service_account_kubeconfig(cp, api, tmp_path / "metrics-server.kubeconfig")
        with metrics_server(
            clients / NAME, kubeconfig, cp.ca, address, port, tmp_path
        ) as process:
            wait_available(api, process)
            node = top(clients, cp, "node", NODE)
            pod = top(clients, cp, "pod", POD, "--namespace", "default")
        # Deleted gracefully while the agent runs: it stops the containers, then the API
        # object goes.
        api.delete(f"{PODS}/{POD}")
        api.wait(f"{PODS}/{POD}", lambda found: found is None, what="the pod deleted")

    print(node, pod)
    assert node["NAME"] == NODE
    assert pod["NAME"] == POD
    node_memory, pod_memory = quantity(node["MEMORY(bytes)"], "Mi"), quantity(
        pod["MEMORY(bytes)"], "Mi"
    )
    assert pod_memory >= 28, pod  # the 30 MB the shell holds
    assert node_memory > pod_memory, node
    assert quantity(pod["CPU(cores)"], "m") > 0, pod  # its loop runs every second
    assert quantity(node["CPU(cores)"], "m") > 0, node
