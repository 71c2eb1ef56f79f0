"""Node pressure as the cluster sees it: with a memory.available threshold the node cannot
meet, the Node reports MemoryPressure through the real API server, a new BestEffort pod is
refused at admission, and a Burstable one is admitted, started and then evicted — each
Failed / Evicted with the reason in its status."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.containerd_fixture import Containerd
from tests.e2e.agent import JSON, PODS, Api, node_admin, node_agent, pod_manifest
from tests.e2e.conftest import ControlPlane

pytestmark = pytest.mark.e2e
NODE = "pressure-node"


@pytest.fixture
def api(control_plane: ControlPlane) -> Iterator[Api]:
    with control_plane.admin() as client, node_admin(client, NODE, control_plane.ca) as admin:
        yield admin


def condition(node: JSON | None, kind: str) -> JSON | None:
    for entry in (node or {}).get("status", {}).get("conditions", []):
        if entry["type"] == kind:
            return entry  # type: ignore[no-any-return]
    return None


def test_memory_pressure_reaches_the_node_and_admission(
    control_plane: ControlPlane, containerd: Containerd, tmp_path: Path, api: Api
) -> None:
    # No machine has a petabyte available: the threshold is met from the first sample on.
    with node_agent(control_plane, containerd.endpoint, tmp_path, NODE,
                    "--eviction-hard", "memory.available<1Pi"):
        node = api.wait(
            f"/api/v1/nodes/{NODE}",
            lambda n: (condition(n, "MemoryPressure") or {}).get("status") == "True",
            timeout=90,
            what="MemoryPressure=True on the Node",
        )
        pressure = condition(node, "MemoryPressure")
        assert pressure is not None and pressure["reason"] == "KubeletHasInsufficientMemory"
        assert (condition(node, "Ready") or {}).get("status") == "True"

        best_effort = pod_manifest("besteffort", NODE, containerd.BUSYBOX_TAGGED, ["sleep", "3600"])
        api.create(PODS, best_effort)
        refused = api.wait(
            f"{PODS}/besteffort",
            lambda p: (p or {}).get("status", {}).get("phase") == "Failed",
            what="the BestEffort pod refused",
        )
        assert refused is not None
        assert refused["status"]["reason"] == "Evicted"
        assert refused["status"]["message"].startswith(
            "Pod was rejected: The node had condition: [MemoryPressure]."
        )

        # A Burstable pod is admitted (a cpu request only: the 1Pi threshold leaves the Node
        # no allocatable memory, so a memory request would be OutOfmemory, as in Go); the
        # pressure persisting, the eviction manager evicts it (the only candidate).
        burstable = pod_manifest("burstable", NODE, containerd.BUSYBOX_TAGGED, ["sleep", "3600"])
        burstable["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "10m"}}
        api.create(PODS, burstable)
        evicted = api.wait(
            f"{PODS}/burstable",
            lambda p: (p or {}).get("status", {}).get("reason") == "Evicted",
            timeout=90,
            what="the Burstable pod evicted",
        )
        assert evicted is not None and evicted["status"]["phase"] == "Failed"
        assert evicted["status"]["message"].startswith(
            "The node was low on resource: memory. Threshold quantity: "
        )
