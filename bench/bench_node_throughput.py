"""Node throughput in the style of sig-scalability: pods created through the real API server.

Starts (or reuses) the e2e control plane (``scripts/control-plane``: etcd + kube-apiserver) and a
private containerd, runs ``trio-kubelet`` as a process with the node's credentials, then creates
``--pods`` pods (busybox ``sleep 3600``, ``nodeName`` set: no scheduler) at ``--rate`` pods/s.
A watch on the node's pods (as the admin) records when each pod is first seen ``Running`` with
its container ready. Pod startup latency = that moment minus the moment the create request returned
(both on this machine's clock; the Kubernetes SLO, 5 s p99, uses the same span).

Also reports the agent's API requests per pod, from its own ``rest_client_requests_total``
(read-only port) over the run, and the time for all pods to be deleted afterwards.

Needs root, containerd and Go (the first run builds kube-apiserver: see docs/cluster.md).
Usage: ``python bench/bench_node_throughput.py [--pods 100] [--rate 5] [--control-plane DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from bench_steady_state import tree_version

from trio_kubelet.volumes import mounter

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
NODE = "bench-node"
NAMESPACE = "default"
IMAGE = "docker.io/library/busybox:1.36"
REQUESTS = re.compile(r'^rest_client_requests_total\{[^}]*\} ([0-9.e+]+)$', re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def admin_client(cp: Path, server: str) -> httpx.Client:
    context = ssl.create_default_context(cafile=cp / "pki" / "ca.crt")
    context.load_cert_chain(cp / "pki" / "admin.crt", cp / "pki" / "admin.key")
    return httpx.Client(base_url=server, verify=context, timeout=30.0)


def control_plane_up(cp: Path) -> str:
    out = subprocess.run([sys.executable, str(SCRIPTS / "control-plane"), "up", str(cp),
                          "--node", NODE], check=True, capture_output=True, text=True).stdout
    return re.search(r"TRIO_KUBELET_APISERVER=(\S+)", out).group(1)  # type: ignore[union-attr]


def requests_total(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    return sum(float(v) for v in REQUESTS.findall(text))


class Watcher(threading.Thread):
    """Records when each pod is first seen Running and ready, through one long watch."""

    def __init__(self, client: httpx.Client) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.running: dict[str, float] = {}
        self.stop = False

    def run(self) -> None:
        params = {"watch": "true", "fieldSelector": f"spec.nodeName={NODE}"}
        timeout = httpx.Timeout(30.0, read=None)
        with self.client.stream("GET", f"/api/v1/namespaces/{NAMESPACE}/pods", params=params,
                                timeout=timeout) as response:
            for line in response.iter_lines():
                if self.stop:
                    return
                pod = json.loads(line)["object"]
                name = pod["metadata"]["name"]
                statuses = pod.get("status", {}).get("containerStatuses") or []
                if (pod.get("status", {}).get("phase") == "Running" and statuses
                        and all(s.get("ready") for s in statuses)):
                    self.running.setdefault(name, time.monotonic())


@dataclass
class ClusterNode:
    """A control plane, and trio-kubelet as node ``NODE`` on a private containerd."""

    cp: Path
    server: str
    admin: httpx.Client
    metrics_port: int  # the agent's read-only port
    log: Path  # the agent's log


@contextmanager
def cluster_node(control_plane: Path | None) -> Iterator[ClusterNode]:
    """Start (or reuse, at ``control_plane``) the control plane, a private containerd and the
    agent; yield once the node is registered and the agent's metrics answer; tear down."""
    work = Path(tempfile.mkdtemp(prefix="tk-bench-node-"))
    cp = control_plane or work / "cp"
    server = control_plane_up(cp)
    subprocess.run([str(SCRIPTS / "containerd-env"), "start", str(work / "ctr")], check=True,
                   capture_output=True)
    endpoint = f"unix://{work / 'ctr' / 'containerd.sock'}"
    metrics_port = free_port()
    log = work / "agent.log"
    agent = subprocess.Popen(
        [sys.executable, "-m", "trio_kubelet", "--kubeconfig", str(cp / f"node-{NODE}.kubeconfig"),
         "--hostname-override", NODE, "--node-ip", "127.0.0.1",
         "--container-runtime-endpoint", endpoint, "--root-dir", str(work / "root"),
         "--pod-logs-dir", str(work / "logs"), "--port", str(free_port()),
         "--read-only-port", str(metrics_port), "--healthz-port", "0",
         "--client-ca-file", str(cp / "pki" / "ca.crt")],
        stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        with admin_client(cp, server) as admin:
            admin.post(f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
                       json={"metadata": {"name": "default"}})
            deadline = time.monotonic() + 60
            while admin.get(f"/api/v1/nodes/{NODE}").status_code != 200:
                if time.monotonic() > deadline:
                    raise SystemExit("the node did not register in 60 s")
                time.sleep(0.2)
            while True:
                try:
                    requests_total(metrics_port)
                    break
                except httpx.HTTPError:
                    time.sleep(0.2)
            yield ClusterNode(cp, server, admin, metrics_port, log)
    finally:
        agent.terminate()
        agent.wait(20)
        # A stopped agent leaves pod volumes mounted (a restart adopts them), and the last
        # deleted pods' may still be up: nothing of the bench stays mounted.
        for point in mounter.mount_points_under(work / "root"):
            mounter.unmount(point)
        subprocess.run([str(SCRIPTS / "containerd-env"), "stop", str(work / "ctr")],
                       capture_output=True)
        if control_plane is None:
            subprocess.run([sys.executable, str(SCRIPTS / "control-plane"), "down", str(cp)],
                           capture_output=True)
        if not mounter.mount_points_under(work):  # never delete through a mount
            shutil.rmtree(work, ignore_errors=True)


def delete_all(admin: httpx.Client, pods: list[tuple[str, str]], timeout: float = 180) -> float:
    """Delete the (namespace, name) pods and wait until the node has none left; the seconds
    it took."""
    start = time.monotonic()
    for namespace, name in pods:
        admin.delete(f"/api/v1/namespaces/{namespace}/pods/{name}")
    while admin.get("/api/v1/pods", params={"fieldSelector": f"spec.nodeName={NODE}"}).json()[
        "items"
    ]:
        if time.monotonic() - start > timeout:
            break
        time.sleep(0.5)
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=100)
    parser.add_argument("--rate", type=float, default=5.0, help="pods created per second")
    parser.add_argument("--control-plane", type=Path, help="reuse a running control plane DIR")
    args = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("containerd") is None:
        print(json.dumps({"bench": "node_throughput", "skipped": "needs root and containerd"}))
        return
    result: dict[str, Any] = {"bench": "node_throughput", "tree": tree_version(),
                              "pods": args.pods, "rate": args.rate}
    with cluster_node(args.control_plane) as node:
        admin, metrics_port = node.admin, node.metrics_port
        before = requests_total(metrics_port)
        watcher = Watcher(admin_client(node.cp, node.server))
        watcher.start()
        created: dict[str, float] = {}
        start = time.monotonic()
        for i in range(args.pods):
            name = f"tp-{i:04d}"
            time.sleep(max(0.0, start + i / args.rate - time.monotonic()))
            body = {"metadata": {"name": name}, "spec": {
                "nodeName": NODE, "terminationGracePeriodSeconds": 1,
                "automountServiceAccountToken": False,
                "containers": [{"name": "c", "image": IMAGE, "command": ["sleep", "3600"],
                                "imagePullPolicy": "IfNotPresent"}]}}
            answer = admin.post(f"/api/v1/namespaces/{NAMESPACE}/pods", json=body)
            answer.raise_for_status()
            created[name] = time.monotonic()
        deadline = time.monotonic() + 120
        while len(watcher.running) < args.pods and time.monotonic() < deadline:
            time.sleep(0.2)
        latencies = [watcher.running[n] - t for n, t in created.items() if n in watcher.running]
        after_running = requests_total(metrics_port)
        watcher.stop = True
        delete_s = delete_all(admin, [(NAMESPACE, name) for name in created])
        result.update({
            "running": len(latencies),
            "startup_p50_s": round(percentile(latencies, 0.5), 3),
            "startup_p99_s": round(percentile(latencies, 0.99), 3),
            "startup_max_s": round(max(latencies), 3),
            "api_requests_per_pod_to_running": round((after_running - before) / args.pods, 2),
            "api_requests_per_pod_total": round(
                (requests_total(metrics_port) - before) / args.pods, 2),
            "delete_all_s": round(delete_s, 1),
            "load_1m": os.getloadavg()[0],
        })
    print(json.dumps(result))


if __name__ == "__main__":
    main()
