"""`trio-kubelet hollow` against a real control plane (etcd, kube-apiserver, kube-scheduler,
kube-controller-manager): five hollow nodes register and hold their Leases, the scheduler's pods
run on them (a Deployment's, a Job's that completes, one that fails with its command's exit
code), and at SIGTERM the process exits and the nodes are deleted. No containerd, no cgroups."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

from trio_kubelet.replay.reader import read_recording

if TYPE_CHECKING:
    from tests.e2e.conftest import ControlPlane

pytestmark = pytest.mark.e2e

SRC = Path(__file__).resolve().parents[2] / "src"
NODES = 5
PREFIX = "e2e-hollow-"
NAMESPACE = "default"
JSON = dict[str, Any]


def wait_for(what: str, check: Callable[[], Any], timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.5)


def hollow_nodes(admin: httpx.Client) -> list[JSON]:
    return [node for node in admin.get("/api/v1/nodes").json()["items"]
            if node["metadata"]["name"].startswith(PREFIX)]


def ready(node: JSON) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in node.get("status", {}).get("conditions", []))


def pods(admin: httpx.Client, selector: str) -> list[JSON]:
    answer = admin.get(f"/api/v1/namespaces/{NAMESPACE}/pods", params={"labelSelector": selector})
    return list(answer.json()["items"])


@pytest.fixture
def hollow(
    cluster_control_plane: ControlPlane, tmp_path: Path
) -> Iterator[subprocess.Popen[bytes]]:
    log = tmp_path / "hollow.log"
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    process = subprocess.Popen(
        [sys.executable, "-m", "trio_kubelet", "hollow",
         "--kubeconfig", str(cluster_control_plane.admin_kubeconfig), "--nodes", str(NODES),
         "--name-prefix", PREFIX, "--root-dir", str(tmp_path / "nodes"),
         "--record-dir", str(tmp_path / "recordings"), "--v", "2"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        with cluster_control_plane.admin() as admin:
            for node in hollow_nodes(admin):
                admin.delete(f"/api/v1/nodes/{node['metadata']['name']}")
            for kind in ("apis/apps/v1/namespaces/default/deployments/hollow-web",
                         "apis/batch/v1/namespaces/default/jobs/hollow-ok",
                         "apis/batch/v1/namespaces/default/jobs/hollow-fail"):
                admin.delete(f"/{kind}", params={"propagationPolicy": "Background"})
        if process.returncode not in (0, None):
            sys.stderr.write(log.read_text(errors="replace")[-5000:])


def job(name: str, script: str) -> JSON:
    return {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {"restartPolicy": "Never", "containers": [
                {"name": "main", "image": "busybox:1.36", "command": ["sh", "-c", script]}]},
        }},
    }


def test_hollow_nodes_run_scheduled_pods_and_leave_cleanly(
    cluster_control_plane: ControlPlane, hollow: subprocess.Popen[bytes], tmp_path: Path
) -> None:
    with cluster_control_plane.admin() as admin:
        nodes = wait_for(f"{NODES} Ready hollow nodes",
                         lambda: len([n for n in hollow_nodes(admin) if ready(n)]) == NODES
                         and hollow_nodes(admin))
        assert sorted(n["metadata"]["name"] for n in nodes) == [f"{PREFIX}{i}" for i in range(5)]
        addresses = {n["status"]["addresses"][0]["address"] for n in nodes}
        assert len(addresses) == NODES  # each node its own InternalIP
        assert {n["status"]["nodeInfo"]["containerRuntimeVersion"] for n in nodes} == {
            "fake://0.1.0"}
        # Each node holds its own Lease and renews it.
        leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"
        first = {n: admin.get(f"{leases}/{n}").json()["spec"] for n in (f"{PREFIX}0", f"{PREFIX}4")}
        assert {n: spec["holderIdentity"] for n, spec in first.items()} == {n: n for n in first}
        wait_for("renewed leases", lambda: all(
            admin.get(f"{leases}/{n}").json()["spec"]["renewTime"] != spec["renewTime"]
            for n, spec in first.items()), timeout=30)

        deployment = {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "hollow-web"},
            "spec": {"replicas": 10, "selector": {"matchLabels": {"app": "hollow-web"}},
                     "template": {"metadata": {"labels": {"app": "hollow-web"}}, "spec": {
                         "containers": [{"name": "web", "image": "registry.k8s.io/pause:3.10"}]}}},
        }
        assert admin.post("/apis/apps/v1/namespaces/default/deployments",
                          json=deployment).status_code == 201
        for body in (job("hollow-ok", "sleep 2; exit 0"), job("hollow-fail", "exit 3")):
            created = admin.post("/apis/batch/v1/namespaces/default/jobs", json=body)
            assert created.status_code == 201, created.text

        def web_running() -> list[JSON]:
            found = pods(admin, "app=hollow-web")
            running = [p for p in found if p["status"].get("phase") == "Running"
                       and all(s["ready"] for s in p["status"].get("containerStatuses", []))]
            return running if len(running) == 10 else []

        running = wait_for("10 Running pods of the Deployment", web_running)
        assert {p["spec"]["nodeName"] for p in running} <= {f"{PREFIX}{i}" for i in range(5)}
        assert len({p["status"]["podIP"] for p in running}) == 10  # no address given twice
        ok = wait_for("the Job that sleeps 2 s to succeed", lambda: [
            p for p in pods(admin, "app=hollow-ok") if p["status"].get("phase") == "Succeeded"])
        (ok_state,) = [s["state"]["terminated"] for s in ok[0]["status"]["containerStatuses"]]
        assert ok_state["exitCode"] == 0 and ok_state["reason"] == "Completed"
        failed = wait_for("the Job that exits 3 to fail", lambda: [
            p for p in pods(admin, "app=hollow-fail") if p["status"].get("phase") == "Failed"])
        (fail_state,) = [s["state"]["terminated"] for s in failed[0]["status"]["containerStatuses"]]
        assert fail_state["exitCode"] == 3 and fail_state["reason"] == "Error"
        events = admin.get(f"/api/v1/namespaces/{NAMESPACE}/events", params={
            "fieldSelector": f"involvedObject.name={running[0]['metadata']['name']}"}).json()
        reasons = {e["reason"] for e in events["items"]}
        assert {"Scheduled", "Pulled", "Created", "Started"} <= reasons

        hollow.send_signal(signal.SIGTERM)
        assert hollow.wait(60) == 0
        assert hollow_nodes(admin) == []  # deleted, not left to go NotReady
        # The Deployment's pods lost their nodes: the controllers replace them (unscheduled now).
        wait_for("the pods of deleted nodes to be gone", lambda: not [
            p for p in pods(admin, "app=hollow-web") if p["spec"].get("nodeName")], timeout=120)

    # Each node's recording is one that replays: the node that ran the failing Job.
    node = failed[0]["spec"]["nodeName"]
    recording = tmp_path / "recordings" / f"{node}.jsonl"
    assert read_recording(recording).header.node == node
    replayed = subprocess.run(
        [sys.executable, "-m", "trio_kubelet", "replay", "--check", str(recording)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC)},
    )
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "no divergence" in replayed.stdout
