"""Pods through the real API server: run, report, crash, delete; static pods' mirrors; faults.

The agent runs as a process (as an operator runs it) with the node's own credentials, so the
Node authorizer and NodeRestriction judge everything it does.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
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

NODE = "pods-node"


@pytest.fixture
def api(control_plane: ControlPlane) -> Iterator[Api]:
    with control_plane.admin() as client, node_admin(client, NODE, control_plane.ca) as admin:
        yield admin


@pytest.fixture
def agent(
    control_plane: ControlPlane, containerd: Containerd, tmp_path: Path, api: Api
) -> Iterator[AgentProcess]:
    with node_agent(control_plane, containerd.endpoint, tmp_path, NODE) as run:
        yield run


def running(pod: JSON | None) -> bool:
    return (
        bool(pod) and pod["status"].get("phase") == "Running" and condition(pod, "Ready") == "True"
    )


def containers_of(containerd: Containerd, uid: str) -> list[str]:
    out = containerd.ctr("containers", "ls", "-q", f'labels."io.kubernetes.pod.uid"=={uid}')
    return out.split()


def test_api_pod_runs_reports_status_restarts_and_is_deleted(
    agent: AgentProcess, api: Api, containerd: Containerd
) -> None:
    manifest = pod_manifest(
        "crashy", NODE, containerd.BUSYBOX_TAGGED, ["sh", "-c", "sleep 4; exit 3"]
    )
    created = api.create(PODS, manifest)
    uid = created["metadata"]["uid"]
    pod = api.wait(f"{PODS}/crashy", running, what="crashy Running and Ready")
    assert pod is not None
    status = pod["status"]
    assert status["podIP"].startswith("10.") and status["hostIP"] == "127.0.0.1"
    main = container_status(pod)
    assert main["ready"] and main["containerID"].startswith("containerd://")
    assert main["imageID"] and main["restartCount"] == 0
    assert main["containerID"].removeprefix("containerd://") in containers_of(containerd, uid)
    assert status["qosClass"] == "BestEffort" and status.get("startTime")

    pod = api.wait(
        f"{PODS}/crashy",
        lambda p: container_status(p).get("restartCount", 0) >= 1,
        timeout=40,
        what="a restart after the crash",
    )
    last = container_status(pod)["lastState"]["terminated"]
    assert last["exitCode"] == 3 and last["reason"] == "Error"

    def by_reason(events: JSON | None) -> dict[str, JSON]:
        return {e["reason"]: e for e in (events or {}).get("items", [])}

    # The restart's Started is recorded (and aggregated) asynchronously: wait for its count.
    events = api.wait(
        f"/api/v1/namespaces/default/events?fieldSelector=involvedObject.uid={uid}",
        lambda events: by_reason(events).get("Started", {}).get("count", 0) >= 2,
        timeout=20,
        what="the Started event counted again for the restart",
    )
    reasons = by_reason(events)
    assert {"Pulled", "Created", "Started"} <= reasons.keys(), sorted(reasons)
    assert reasons["Started"]["source"] == {"component": "kubelet", "host": NODE}
    assert reasons["Started"]["count"] >= 2  # the restart is the same event, counted again

    api.delete(f"{PODS}/crashy")  # graceful: the agent kills, then removes the object
    api.wait(f"{PODS}/crashy", lambda p: p is None, timeout=60, what="crashy deleted")
    deadline = time.monotonic() + 20
    while containers_of(containerd, uid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert containers_of(containerd, uid) == []


def test_static_pod_gets_a_mirror_pod_recreated_when_deleted_removed_with_the_file(
    agent: AgentProcess, api: Api, tmp_path: Path, containerd: Containerd
) -> None:
    manifest = tmp_path / "manifests" / "static.yaml"
    manifest.write_text(f"""
apiVersion: v1
kind: Pod
metadata: {{name: static-web, namespace: default}}
spec:
  containers:
  - {{name: web, image: {containerd.BUSYBOX_TAGGED}, imagePullPolicy: IfNotPresent,
     command: [sleep, "3600"]}}
""")
    path = f"{PODS}/static-web-{NODE}"
    mirror = api.wait(path, running, what="the mirror pod, Running")
    assert mirror is not None
    meta = mirror["metadata"]
    assert "kubernetes.io/config.mirror" in meta["annotations"]
    assert (
        meta["ownerReferences"][0]["kind"] == "Node" and meta["ownerReferences"][0]["name"] == NODE
    )
    static_uid = meta["annotations"].get("kubernetes.io/config.hash")
    assert static_uid

    api.delete(path, grace=0)
    again = api.wait(
        path,
        lambda p: p is not None and p["metadata"]["uid"] != meta["uid"],
        timeout=30,
        what="the mirror pod, recreated",
    )
    assert running(api.wait(path, running, what="the recreated mirror, Running"))
    assert again is not None

    manifest.unlink()
    api.wait(path, lambda p: p is None, timeout=30, what="the mirror pod gone with its file")


def test_agent_killed_and_restarted_keeps_containers_and_status(
    agent: AgentProcess, api: Api, containerd: Containerd
) -> None:
    api.create(PODS, pod_manifest("steady", NODE, containerd.BUSYBOX_TAGGED, ["sleep", "3600"]))
    pod = api.wait(f"{PODS}/steady", running, what="steady Running")
    assert pod is not None
    uid, before = pod["metadata"]["uid"], container_status(pod)["containerID"]

    agent.kill()
    agent.start()
    time.sleep(8)  # a few relists and status rounds of the new agent
    pod = api.wait(f"{PODS}/steady", running, what="steady still Running")
    assert container_status(pod)["containerID"] == before
    assert container_status(pod)["restartCount"] == 0
    assert len(containers_of(containerd, uid)) == 2  # the sandbox and the one container


def test_api_server_down_for_a_while_loses_nothing(
    agent: AgentProcess,
    api: Api,
    control_plane: ControlPlane,
    containerd: Containerd,
    tmp_path: Path,
) -> None:
    api.create(
        PODS,
        pod_manifest("survivor", NODE, containerd.BUSYBOX_TAGGED, ["sh", "-c", "sleep 15; exit 1"]),
    )
    pod = api.wait(f"{PODS}/survivor", running, what="survivor Running")
    assert pod is not None
    uid = pod["metadata"]["uid"]

    control_plane.stop_apiserver()
    try:
        time.sleep(60)  # the container crashes and restarts while nobody can be told
    finally:
        control_plane.start_apiserver()
    pod = api.wait(
        f"{PODS}/survivor",
        lambda p: container_status(p).get("restartCount", 0) >= 1,
        timeout=60,
        what="the restart made while the API server was down",
    )
    assert pod is not None and pod["metadata"]["uid"] == uid
    assert "Traceback" not in agent.text()
    # No duplicates: the sandbox and one instance of the container run (old ones have exited).
    running_tasks = containerd.ctr("tasks", "ls", "-q").split()
    assert len(set(running_tasks) & set(containers_of(containerd, uid))) <= 2


def test_kubelet_api_asks_the_api_server_who_may_do_what(
    agent: AgentProcess, api: Api, control_plane: ControlPlane
) -> None:
    """x509 against the cluster CA, then a SubjectAccessReview (authorization mode Webhook)."""
    url = f"https://127.0.0.1:{agent.port}/pods"
    control_plane.node_kubeconfig("other-node")  # makes pki/node-other-node.crt

    def as_user(stem: str | None) -> int:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # the kubelet's serving certificate is self-signed
        if stem is not None:
            pki = control_plane.dir / "pki"
            context.load_cert_chain(pki / f"{stem}.crt", pki / f"{stem}.key")
        deadline = time.monotonic() + 30
        while True:
            try:
                return httpx.get(url, verify=context, timeout=10).status_code
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    assert as_user("admin") == 200  # system:masters
    assert as_user(None) == 401  # anonymous authentication is off
    assert as_user("node-other-node") == 403  # another node may not proxy to this one


def test_readiness_gates_decide_ready_with_the_containers(
    agent: AgentProcess, api: Api, containerd: Containerd
) -> None:
    """The NodeConformance spec "Pods should support pod readiness gates", step by step:
    the gates' conditions are patched by someone else (here the admin), strategically as a
    controller does; Ready follows within seconds each time, and the agent's own status
    patches never drop the gates' conditions."""
    gates = ["k8s.io/test-condition1", "k8s.io/test-condition2"]
    manifest = pod_manifest("gated", NODE, containerd.BUSYBOX_TAGGED, ["sleep", "3600"],
                            readinessGates=[{"conditionType": gate} for gate in gates])
    api.create(PODS, manifest)
    path = f"{PODS}/gated"

    def ready_is(status: str, message: str | None = None, timeout: float = 20) -> JSON | None:
        def check(pod: JSON | None) -> bool:
            ready = next((c for c in ((pod or {}).get("status") or {}).get("conditions") or []
                          if c["type"] == "Ready"), {})
            return ready.get("status") == status and (
                message is None or ready.get("message") == message)
        return api.wait(path, check, timeout=timeout, what=f"Ready={status} {message or ''}")

    def set_gate(gate: str, status: str) -> None:
        patch = {"status": {"conditions": [{"type": gate, "status": status}]}}
        api.client.patch(
            f"{path}/status", json=patch,
            headers={"Content-Type": "application/strategic-merge-patch+json"},
        ).raise_for_status()

    # The first wait includes the agent's start (its process was just spawned) and the pod's.
    pod = ready_is("False", 'corresponding condition of pod readiness gate "k8s.io/test-condition1"'
                   ' does not exist., corresponding condition of pod readiness gate '
                   '"k8s.io/test-condition2" does not exist.', timeout=60)
    assert condition(pod, "ContainersReady") == "True"
    assert next(c for c in pod["status"]["conditions"]
                if c["type"] == "Ready")["reason"] == "ReadinessGatesNotReady"

    set_gate(gates[0], "True")
    ready_is("False", 'corresponding condition of pod readiness gate "k8s.io/test-condition2"'
             ' does not exist.')
    set_gate(gates[1], "True")
    pod = ready_is("True")
    assert condition(pod, gates[0]) == condition(pod, gates[1]) == "True"
    set_gate(gates[0], "False")
    ready_is("False", 'the status of pod readiness gate "k8s.io/test-condition1" is not "True",'
             ' but False')
    time.sleep(3)  # a few status rounds of the agent: the gates' conditions stay as set
    pod = api.get(path)
    assert (condition(pod, gates[0]), condition(pod, gates[1])) == ("False", "True")
