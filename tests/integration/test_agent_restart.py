"""The agent as a process: kill -9 and restart adopts running pods; a missing runtime is retried."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cri_api.v1 import api_pb2

pytestmark = pytest.mark.integration

MANIFEST = """\
apiVersion: v1
kind: Pod
metadata: {name: adopted}
spec:
  terminationGracePeriodSeconds: 2
  initContainers:
  - {name: setup, image: "busybox:1.36", command: ["true"]}
  containers:
  - {name: app, image: "busybox:1.36", command: ["sleep", "3600"]}
  - {name: helper, image: "busybox:1.36", command: ["sleep", "3600"]}
"""


def start_agent(tmp_path: Path, endpoint: str, log_name: str) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / log_name
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trio_kubelet",
            "--pod-manifest-path",
            str(tmp_path / "manifests"),
            "--container-runtime-endpoint",
            endpoint,
            "--root-dir",
            str(tmp_path / "root"),
            "--hostname-override",
            "restart-node",
        ],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    return process, log


def snapshot(containerd) -> tuple[set[str], set[str]]:
    service = containerd.runtime_service
    selector = {"io.kubernetes.pod.name": "adopted-restart-node"}
    containers = service.ListContainers(
        api_pb2.ListContainersRequest(filter=api_pb2.ContainerFilter(label_selector=selector)),
        timeout=30,
    ).containers
    sandboxes = service.ListPodSandbox(
        api_pb2.ListPodSandboxRequest(filter=api_pb2.PodSandboxFilter(label_selector=selector)),
        timeout=30,
    ).items
    running = {c.id for c in containers if c.state == api_pb2.CONTAINER_RUNNING}
    return {c.id for c in containers} | {s.id for s in sandboxes}, running


def wait_until(predicate, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}; agent log:\n{log.read_text()[-4000:]}")


def test_kill_9_and_restart_adopts_running_pod(containerd, tmp_path):
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "adopted.yaml").write_text(MANIFEST)
    first, log1 = start_agent(tmp_path, containerd.endpoint, "agent1.log")
    try:
        wait_until(lambda: len(snapshot(containerd)[1]) == 2, 60, "two running containers", log1)
        time.sleep(2)  # let a few relists pass so the first agent is in steady state
        before = snapshot(containerd)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    second, log2 = start_agent(tmp_path, containerd.endpoint, "agent2.log")
    try:
        wait_until(
            lambda: "All pod sources are ready" in log2.read_text(),
            30,
            "the restarted agent to read its sources",
            log2,
        )
        time.sleep(5)  # several relists and syncs of the adopted pod
        assert snapshot(containerd) == before, log2.read_text()[-4000:]
        text = log2.read_text()
        assert "Created sandbox" not in text and "Started container" not in text
        assert "Traceback" not in text
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=20) == 0
    # SIGTERM stops the agent, never the pods.
    assert snapshot(containerd) == before


def test_unreachable_runtime_is_retried_without_traceback(containerd, tmp_path):
    (tmp_path / "manifests").mkdir()
    missing = tmp_path / "nothing-here.sock"
    agent, log = start_agent(tmp_path, f"unix://{missing}", "agent.log")
    try:
        wait_until(
            lambda: log.read_text().count("is not reachable") >= 2,
            20,
            "two connection attempts",
            log,
        )
    finally:
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=20) == 0
    text = log.read_text()
    assert "Traceback" not in text
    assert str(missing) in text
