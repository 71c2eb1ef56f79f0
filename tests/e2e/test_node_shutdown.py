"""Graceful node shutdown through the real API server and containerd: on SIGTERM with
shutdownGracePeriod set, the node reports NotReady, new pods are refused, regular pods stop
before critical ones, each ends Failed/Terminated with a DisruptionTarget condition, and the agent
exits within the budget."""

from __future__ import annotations

import datetime
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.containerd_fixture import Containerd
from tests.e2e.agent import (
    JSON,
    PODS,
    AgentProcess,
    Api,
    condition,
    container_status,
    node_admin,
    node_agent,
    pod_manifest,
)
from tests.e2e.conftest import ControlPlane

NODE = "shutdown-node"
GRACE, CRITICAL_GRACE = 20, 8  # seconds: regular pods get 12, critical ones 8
# Stops 2 s after SIGTERM, so each round visibly takes its time.
SLOW_STOP = ["sh", "-c", 'trap "sleep 2; exit 0" TERM; while true; do sleep 0.2; done']


@pytest.fixture
def api(control_plane: ControlPlane) -> Iterator[Api]:
    with control_plane.admin() as client, node_admin(client, NODE, control_plane.ca) as admin:
        yield admin
        admin.delete(f"/api/v1/nodes/{NODE}")


@pytest.fixture
def agent(
    control_plane: ControlPlane, containerd: Containerd, tmp_path: Path, api: Api
) -> Iterator[AgentProcess]:
    config = tmp_path / "kubelet.yaml"
    config.write_text(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
        f"shutdownGracePeriod: {GRACE}s\nshutdownGracePeriodCriticalPods: {CRITICAL_GRACE}s\n"
    )
    with node_agent(
        control_plane, containerd.endpoint, tmp_path, NODE, "--config", str(config)
    ) as run:
        yield run


def running(pod: JSON | None) -> bool:
    return bool(pod) and condition(pod, "Ready") == "True"


def ready_condition(node: JSON | None) -> JSON:
    for cond in ((node or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == "Ready":
            return dict(cond)
    return {}


def finished_at(pod: JSON | None) -> datetime.datetime:
    terminated = container_status(pod)["state"]["terminated"]
    return datetime.datetime.fromisoformat(terminated["finishedAt"])


def test_sigterm_shuts_the_node_down_regular_pods_first(
    agent: AgentProcess, api: Api, containerd: Containerd
) -> None:
    api.wait(
        f"/api/v1/nodes/{NODE}",
        lambda n: ready_condition(n).get("status") == "True",
        timeout=60,
        what="the Node Ready",
    )
    image = containerd.BUSYBOX_TAGGED
    api.create(
        PODS, pod_manifest("regular", NODE, image, SLOW_STOP, terminationGracePeriodSeconds=30)
    )
    api.create(
        PODS,
        pod_manifest(
            "critical",
            NODE,
            image,
            SLOW_STOP,
            priorityClassName="system-node-critical",
            terminationGracePeriodSeconds=30,
        ),
    )
    for name in ("regular", "critical"):
        api.wait(f"{PODS}/{name}", running, timeout=60, what=f"{name} Running")
    assert agent.process is not None
    started = time.monotonic()
    agent.process.send_signal(signal.SIGTERM)
    api.create(PODS, pod_manifest("late", NODE, image, ["sleep", "3600"]))

    agent.process.wait(GRACE + 15)
    took = time.monotonic() - started
    assert took < GRACE + 10, f"the agent took {took:.0f}s to shut the node down"

    node = api.get(f"/api/v1/nodes/{NODE}")
    ready = ready_condition(node)
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "KubeletNotReady",
        "node is shutting down",
    )
    pods = {name: api.get(f"{PODS}/{name}") for name in ("regular", "critical", "late")}
    for name in ("regular", "critical"):
        status = (pods[name] or {})["status"]
        assert status["phase"] == "Failed", (name, status)
        assert status["reason"] == "Terminated"
        assert status["message"] == "Pod was terminated in response to imminent node shutdown."
        (disruption,) = [c for c in status["conditions"] if c["type"] == "DisruptionTarget"]
        assert (disruption["status"], disruption["reason"]) == ("True", "TerminationByKubelet")
        assert container_status(pods[name])["state"]["terminated"]["exitCode"] == 0  # its trap ran
    # Regular pods in the first round, critical ones after them.
    assert finished_at(pods["regular"]) < finished_at(pods["critical"])
    late = (pods["late"] or {})["status"]
    assert (late["phase"], late["reason"]) == ("Failed", "NodeShutdown")
    assert late["message"] == "Pod was rejected: Pod was rejected as the node is shutting down."
    log = agent.text()
    assert "graceful node shutdown" in log and "Node shutdown: done" in log
    events = api.get(f"/api/v1/namespaces/default/events?fieldSelector=involvedObject.name={NODE}")
    assert "NodeShutdown" in {e["reason"] for e in (events or {}).get("items", [])}
