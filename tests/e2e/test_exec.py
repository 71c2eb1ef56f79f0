"""`kubectl exec` and `kubectl port-forward` through the real API server.

The API server proxies both to the kubelet as SPDY/3.1 upgrades (translating kubectl's websocket
on the way), authenticated with its kubelet-client certificate; the agent authorises that with a
SubjectAccessReview and splices the connection to containerd's streaming server. kubectl is
driven as a user runs it, with the admin kubeconfig: the release's own kubectl
(scripts/build-clients).
"""

from __future__ import annotations

import re
import select
import socket
import subprocess
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
    node_admin,
    node_agent,
    pod_manifest,
)
from tests.e2e.conftest import ControlPlane, kubectl

NODE = "exec-node"
POD = "talk"
PORT = 8080


@pytest.fixture
def api(control_plane: ControlPlane) -> Iterator[Api]:
    with control_plane.admin() as client, node_admin(client, NODE, control_plane.ca) as admin:
        yield admin


def running(pod: JSON | None) -> bool:
    return bool(pod) and condition(pod, "Ready") == "True"


@pytest.fixture
def talk(
    control_plane: ControlPlane, containerd: Containerd, tmp_path: Path, api: Api
) -> Iterator[AgentProcess]:
    """The agent, running a pod that sleeps in `main` and answers "hi" on port 8080."""
    with node_agent(control_plane, containerd.endpoint, tmp_path, NODE) as run:
        manifest = pod_manifest(POD, NODE, containerd.BUSYBOX_TAGGED, ["sleep", "3600"])
        manifest["spec"]["containers"].append({
            "name": "server", "image": containerd.BUSYBOX_TAGGED,
            "imagePullPolicy": "IfNotPresent",
            "command": ["nc", "-ll", "-p", str(PORT), "-e", "echo", "hi"],
        })
        api.create(PODS, manifest)
        api.wait(f"{PODS}/{POD}", running, what=f"{POD} Running and Ready")
        yield run


def test_exec_passes_stdout_stderr_and_the_exit_code(
    talk: AgentProcess, control_plane: ControlPlane, clients: Path
) -> None:
    done = kubectl(clients, control_plane, "exec", POD, "-c", "main", "--",
                   "sh", "-c", "echo out; echo err >&2; exit 3")
    assert done.stdout == "out\n"
    assert done.stderr.startswith("err\n"), done.stderr
    assert done.returncode == 3, done.stderr
    # kubectl may return before the agent has closed both connections and logged the end.
    deadline = time.monotonic() + 10
    while "SPDY session ended" not in talk.text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "SPDY session ended" in talk.text()


def test_exec_with_stdin_sees_its_end(
    talk: AgentProcess, control_plane: ControlPlane, clients: Path
) -> None:
    text = "".join(f"line {n}\n" for n in range(2000))  # ~20 KB: several frames
    done = kubectl(clients, control_plane, "exec", "-i", POD, "-c", "main", "--", "cat", stdin=text)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == text


def test_port_forward(talk: AgentProcess, control_plane: ControlPlane, clients: Path) -> None:
    forward = subprocess.Popen(
        [clients / "kubectl", "--kubeconfig", str(control_plane.admin_kubeconfig), "port-forward",
         f"pod/{POD}", f":{PORT}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        assert forward.stdout is not None
        ready, _, _ = select.select([forward.stdout], [], [], 30)
        assert ready, "kubectl port-forward said nothing in 30 s"
        line = forward.stdout.readline().decode()
        found = re.match(r"Forwarding from 127\.0\.0\.1:(\d+) -> 8080", line)
        assert found, line
        for _ in range(2):  # each connection is a new stream pair on the one SPDY session
            with socket.create_connection(("127.0.0.1", int(found[1])), timeout=30) as client:
                answer = b""
                while chunk := client.recv(1024):
                    answer += chunk
            assert answer == b"hi\n"
    finally:
        forward.terminate()
        forward.wait(10)
