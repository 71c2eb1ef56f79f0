"""A new pod's start with the standard service-account volume: "Added" to sandbox created.

Every pod of a real cluster gets a projected ``kube-api-access-*`` volume: a TokenRequest
token, the ``kube-root-ca.crt`` ConfigMap and the namespace from the downward API. Its first
set-up needs that ConfigMap from the node's object cache, whose watch of it starts with the
pod. Pods are created through the real API server (``scripts/control-plane``) on a private
containerd, one every ``--interval`` s, by default each in a namespace of its own, so every
pod starts a new watch (the Node authorizer's first answer included). From the agent's log:
when each pod was "Added" (source api) and when its sandbox was "Created" — the span the
agent controls before the runtime runs the pod (target: p99 <= 0.5 s). Also printed: the
mean RunPodSandbox call (the agent's runtime operation metrics), which is part of the span,
and how many FailedMount warnings the agent logged on the way.

Needs root, containerd and Go (the first run builds kube-apiserver: see docs/cluster.md).
Usage: ``python bench/bench_volume_start.py [--pods 40] [--interval 0.5]
[--same-namespace] [--control-plane DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import httpx
from bench_node_throughput import IMAGE, NODE, cluster_node, delete_all, percentile
from bench_steady_state import tree_version

# "I1127 04:18:40.005503 trio_kubelet.podconfig] Added pod web_ns (uid) from source api"
LOG_TIME = r"^\w\d{4} (\d\d):(\d\d):(\d\d\.\d+) "
ADDED = re.compile(LOG_TIME + r"trio_kubelet\.podconfig\] Added pod (\S+) \(", re.M)
SANDBOX = re.compile(LOG_TIME + r"trio_kubelet\.workers\] Created sandbox \S+ for pod (\S+) \(",
                     re.M)
FAILED_MOUNT = re.compile(r"trio_kubelet\.volumes\] Pod \S+: MountVolume\.SetUp failed")
RUN_SANDBOX = re.compile(
    r'^kubelet_runtime_operations_duration_seconds_(sum|count)\{operation_type="run_podsandbox"\}'
    r" ([0-9.e+]+)$", re.M)


def log_times(pattern: re.Pattern[str], text: str) -> dict[str, float]:
    """Seconds of the day of each pod's first matching line, by ``name_namespace``."""
    found: dict[str, float] = {}
    for hours, minutes, seconds, pod in pattern.findall(text):
        found.setdefault(pod, int(hours) * 3600 + int(minutes) * 60 + float(seconds))
    return found


def run_sandbox_mean(port: int) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    figures = dict(RUN_SANDBOX.findall(text))
    return float(figures["sum"]) / max(1.0, float(figures["count"]))


def ensure_namespace(admin: httpx.Client, namespace: str, ca: str) -> None:
    """The namespace with what the controller-manager would put there (none runs here): the
    default ServiceAccount and the kube-root-ca.crt ConfigMap."""
    for path, body in (
        ("/api/v1/namespaces", {"metadata": {"name": namespace}}),
        (f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": "default"}}),
        (f"/api/v1/namespaces/{namespace}/configmaps",
         {"metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": ca}}),
    ):
        answer = admin.post(path, json=body)
        if answer.status_code != 409:
            answer.raise_for_status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=40)
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between pods")
    parser.add_argument("--same-namespace", action="store_true",
                        help="all pods in one namespace (one shared ConfigMap watch)")
    parser.add_argument("--control-plane", type=Path, help="reuse a running control plane DIR")
    args = parser.parse_args()
    if os.geteuid() != 0 or shutil.which("containerd") is None:
        print(json.dumps({"bench": "volume_start", "skipped": "needs root and containerd"}))
        return
    run = f"{int(time.time()) % 100000:05d}"
    result: dict[str, Any] = {
        "bench": "volume_start", "tree": tree_version(), "api_server": "real (control-plane)",
        "pods": args.pods, "interval_s": args.interval,
        "namespaces": "one" if args.same_namespace else "one per pod",
    }
    with cluster_node(args.control_plane) as node:
        admin = node.admin
        ca = (node.cp / "pki" / "ca.crt").read_text()
        created: list[tuple[str, str]] = []
        for i in range(args.pods):
            namespace = f"vs-{run}" if args.same_namespace else f"vs-{run}-{i:03d}"
            ensure_namespace(admin, namespace, ca)
            name = f"vs-{i:03d}"
            body = {"metadata": {"name": name}, "spec": {
                "nodeName": NODE, "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "c", "image": IMAGE, "command": ["sleep", "3600"],
                                "imagePullPolicy": "IfNotPresent"}]}}
            answer = admin.post(f"/api/v1/namespaces/{namespace}/pods", json=body)
            answer.raise_for_status()
            volumes = [v["name"] for v in answer.json()["spec"].get("volumes", [])]
            assert any(v.startswith("kube-api-access-") for v in volumes), volumes
            created.append((namespace, name))
            time.sleep(args.interval)
        wanted = {f"{name}_{namespace}" for namespace, name in created}
        deadline = time.monotonic() + 60
        while True:
            text = node.log.read_text(errors="replace")
            sandboxes = log_times(SANDBOX, text)
            if wanted <= sandboxes.keys() or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        added = log_times(ADDED, text)
        spans = [sandboxes[p] - added[p] for p in wanted if p in sandboxes and p in added]
        result.update({
            "started": len(spans),
            "added_to_sandbox_p50_s": round(percentile(spans, 0.5), 3),
            "added_to_sandbox_p99_s": round(percentile(spans, 0.99), 3),
            "added_to_sandbox_max_s": round(max(spans), 3),
            "run_pod_sandbox_mean_s": round(run_sandbox_mean(node.metrics_port), 3),
            "failed_mounts": len(FAILED_MOUNT.findall(text)),
            "load_1m": os.getloadavg()[0],
        })
        result["delete_all_s"] = round(delete_all(admin, created), 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
