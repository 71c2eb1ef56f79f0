"""Graceful node shutdown through the real API server and containerd, on the two signals: the
real systemd-logind's PrepareForShutdown (on a private system bus, tests/logind_fixture.py; sent
with dbus-send as Kubernetes' node e2e test sends it) and, where there is no logind, SIGTERM.
Either way the node reports NotReady, new pods are refused, regular pods stop before critical
ones, each ends Failed/Terminated with a DisruptionTarget condition, within the budget. With
logind the agent's inhibitor lock is let go once the pods have stopped, and a cancellation makes
the node Ready again with a new lock; with SIGTERM the agent exits."""

from __future__ import annotations

import datetime
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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
from tests.logind_fixture import Logind, running_logind

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
def logind() -> Iterator[Logind]:
    """logind allowing a longer delay than the grace period, so the agent writes no drop-in
    (it would go to this host's /etc/systemd; tests/integration/test_logind.py covers it)."""
    with tempfile.TemporaryDirectory(prefix="tk-logind-") as root, running_logind(
        Path(root), f"InhibitDelayMaxSec={GRACE + 10}"
    ) as running:
        yield running


@contextmanager
def shutdown_agent(
    control_plane: ControlPlane, containerd: Containerd, tmp_path: Path
) -> Iterator[AgentProcess]:
    """The agent with graceful shutdown on, on the system bus DBUS_SYSTEM_BUS_ADDRESS names."""
    config = tmp_path / "kubelet.yaml"
    config.write_text(
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
        f"shutdownGracePeriod: {GRACE}s\nshutdownGracePeriodCriticalPods: {CRITICAL_GRACE}s\n"
    )
    with node_agent(
        control_plane, containerd.endpoint, tmp_path, NODE, "--config", str(config)
    ) as run:
        yield run


@pytest.fixture
def agent(
    control_plane: ControlPlane, containerd: Containerd, tmp_path: Path, api: Api,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[AgentProcess]:
    """On no system bus: SIGTERM is the signal."""
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", f"unix:path={tmp_path}/no-bus")
    with shutdown_agent(control_plane, containerd, tmp_path) as run:
        yield run


@pytest.fixture
def logind_agent(
    logind: Logind, control_plane: ControlPlane, containerd: Containerd, tmp_path: Path,
    api: Api, monkeypatch: pytest.MonkeyPatch,
) -> Iterator[AgentProcess]:
    """On the bus of the real logind: its PrepareForShutdown is the signal."""
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", logind.address)
    with shutdown_agent(control_plane, containerd, tmp_path) as run:
        yield run


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not {what} after {timeout}s"
        time.sleep(0.2)


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


def start_pods(api: Api, image: str) -> None:
    """Once the node is Ready: a regular and a critical pod, both Running; each takes 2 s to
    stop."""
    api.wait(
        f"/api/v1/nodes/{NODE}",
        lambda n: ready_condition(n).get("status") == "True",
        timeout=60,
        what="the Node Ready",
    )
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


def wait_shutting_down(api: Api) -> None:
    """The shutdown signal reaches the agent asynchronously: a pod created before the agent
    has seen it is admitted and then stopped with the others, so the late pod waits for the
    node's NotReady."""
    api.wait(
        f"/api/v1/nodes/{NODE}",
        lambda n: ready_condition(n).get("message") == "node is shutting down",
        timeout=10,
        what="the Node NotReady for the shutdown",
    )


def check_shut_down(api: Api) -> None:
    """The node NotReady, both pods stopped by the shutdown (regular first), the late pod
    refused, and the node's NodeShutdown event."""
    ready = ready_condition(api.get(f"/api/v1/nodes/{NODE}"))
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
    assert "Shutdown manager detected shutdown event" in node_events(api)


def node_events(api: Api) -> set[str]:
    """The messages of the node's NodeShutdown events."""
    events = api.get(f"/api/v1/namespaces/default/events?fieldSelector=involvedObject.name={NODE}")
    return {e["message"] for e in (events or {}).get("items", []) if e["reason"] == "NodeShutdown"}


def test_sigterm_shuts_the_node_down_regular_pods_first(
    agent: AgentProcess, api: Api, containerd: Containerd
) -> None:
    start_pods(api, containerd.BUSYBOX_TAGGED)
    assert agent.process is not None
    started = time.monotonic()
    agent.process.send_signal(signal.SIGTERM)
    wait_shutting_down(api)
    api.create(PODS, pod_manifest("late", NODE, containerd.BUSYBOX_TAGGED, ["sleep", "3600"]))

    agent.process.wait(GRACE + 15)
    took = time.monotonic() - started
    assert took < GRACE + 10, f"the agent took {took:.0f}s to shut the node down"
    check_shut_down(api)
    log = agent.text()
    assert "Failed to start node shutdown manager: cannot connect to the system bus" in log
    assert "graceful node shutdown" in log and "Node shutdown: done" in log


def test_logind_prepare_for_shutdown_stops_the_pods_then_lets_the_lock_go(
    logind: Logind, logind_agent: AgentProcess, api: Api, containerd: Containerd
) -> None:
    agent = logind_agent
    assert agent.process is not None
    lock = ("shutdown", "kubelet", "Kubelet needs time to handle node shutdown", "delay",
            agent.process.pid)
    start_pods(api, containerd.BUSYBOX_TAGGED)
    wait_until(lambda: logind.inhibitors() == [lock], 10, "the agent's inhibitor lock")

    started = time.monotonic()
    logind.prepare_for_shutdown(True)
    wait_shutting_down(api)
    api.create(PODS, pod_manifest("late", NODE, containerd.BUSYBOX_TAGGED, ["sleep", "3600"]))
    wait_until(lambda: logind.inhibitors() == [], GRACE + 10, "the inhibitor lock released")
    took = time.monotonic() - started
    # Each round waits for its pod (2 s to stop), not for its whole budget.
    assert 4 <= took < GRACE, f"the lock was released after {took:.0f}s"
    assert agent.process.poll() is None  # the agent stays up until the machine goes down
    api.wait(f"{PODS}/late", lambda p: (p or {}).get("status", {}).get("phase") == "Failed",
             timeout=30, what="the late pod refused")
    check_shut_down(api)

    logind.prepare_for_shutdown(False)  # the shutdown was cancelled
    api.wait(
        f"/api/v1/nodes/{NODE}",
        lambda n: ready_condition(n).get("status") == "True",
        timeout=30,
        what="the Node Ready again",
    )
    wait_until(lambda: logind.inhibitors() == [lock], 10, "a new inhibitor lock")
    api.create(PODS, pod_manifest("after", NODE, containerd.BUSYBOX_TAGGED, ["sleep", "3600"]))
    api.wait(f"{PODS}/after", running, timeout=60, what="a new pod admitted and Running")
    assert "Shutdown manager detected shutdown cancellation" in node_events(api)
    # Its logind allowed the whole grace period: nothing written to this host's /etc.
    assert not Path("/etc/systemd/logind.conf.d/99-kubelet.conf").exists()
