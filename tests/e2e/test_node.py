"""The NodeManager against the real kube-apiserver, with the node's own credentials (Node
authorizer + NodeRestriction): the Node registers Ready with the machine's capacity and
allocatable, its Lease renews, Ready follows the agent's health, and after the API server
has been away the Lease resumes and the status catches up."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import trio

from trio_kubelet import __version__
from trio_kubelet.apiserver.client import APIClient
from trio_kubelet.apiserver.kubeconfig import load_kubeconfig
from trio_kubelet.cli import parse_run_options
from trio_kubelet.clock import TrioWallClock
from trio_kubelet.model.quantity import parse_quantity
from trio_kubelet.node.machine import internal_ips, read_machine_facts
from trio_kubelet.node.manager import NodeHealth, NodeManager
from trio_kubelet.node.registration import (
    allocatable_reservation,
    machine_capacity,
    node_allocatable,
)

if TYPE_CHECKING:
    from pathlib import Path

    from tests.e2e.conftest import ControlPlane

pytestmark = pytest.mark.e2e
# Not control_plane.node: the agent's own e2e tests register under that name.
NODE = "e2e-node-status"
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{NODE}"
OUTAGE = 15.0  # seconds without an API server
JSON = dict[str, Any]


class Health:
    """The agent's health as the manager sees it; tests flip the network error."""

    def __init__(self) -> None:
        self.network: str | None = None

    def node_health(self) -> NodeHealth:
        return NodeHealth(
            runtime_errors=lambda: [],
            pleg_error=lambda: None,
            network_error=lambda: self.network,
            runtime_version=lambda: ("containerd", "v1.7.2"),
        )


@pytest.fixture
def admin(control_plane: ControlPlane) -> Iterator[httpx.Client]:
    """An admin client; the test node and its lease are deleted before and after the test."""
    with control_plane.admin() as client:

        def clean() -> None:
            for path in (f"/api/v1/nodes/{NODE}", LEASE):
                response = client.delete(path)
                assert response.status_code in (200, 404), response.text

        clean()
        yield client
        clean()


async def read(admin: httpx.Client, path: str) -> JSON | None:
    """GET through the admin client without blocking trio; None while absent or unreachable."""
    try:
        response = await trio.to_thread.run_sync(admin.get, path)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


async def wait_for(admin: httpx.Client, path: str, check: Any, timeout: float = 20.0) -> JSON:
    """Poll ``path`` until ``check(object)`` holds; the object."""
    with trio.fail_after(timeout):
        while True:
            obj = await read(admin, path)
            if obj is not None and check(obj):
                return obj
            await trio.sleep(0.2)


def ready(node: JSON) -> JSON:
    return next(c for c in node["status"]["conditions"] if c["type"] == "Ready")


def amounts(resources: JSON) -> dict[str, Any]:
    return {name: parse_quantity(value) for name, value in resources.items()}


async def test_node_registers_heartbeats_and_rides_out_an_apiserver_outage(
    control_plane: ControlPlane, admin: httpx.Client, tmp_path: Path
) -> None:
    kubeconfig = await trio.to_thread.run_sync(control_plane.node_kubeconfig, NODE)
    base = parse_run_options(
        [
            "--hostname-override", NODE,
            "--root-dir", str(tmp_path),
            "--node-status-update-frequency", "1s",
            "--node-labels", "node.kubernetes.io/pool=e2e",
            "--register-with-taints", "e2e=true:NoSchedule",
        ]
    )  # fmt: skip
    options = replace(
        base, config=base.config.model_copy(update={"node_lease_duration_seconds": 4})
    )
    health = Health()
    client = APIClient(load_kubeconfig(kubeconfig))
    manager = NodeManager(client, options, health.node_health(), TrioWallClock())
    path = f"/api/v1/nodes/{NODE}"
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)

        # Registered and Ready, with what the machine has.
        node = await wait_for(admin, path, lambda n: ready(n)["status"] == "True")
        machine = await trio.to_thread.run_sync(read_machine_facts, tmp_path)
        capacity = machine_capacity(machine, 110)
        config = options.config
        reservation = allocatable_reservation(
            capacity,
            kube_reserved=config.kube_reserved,
            system_reserved=config.system_reserved,
            eviction_hard=config.eviction_hard,
        )
        allocatable = node_allocatable(capacity, reservation)
        status = node["status"]
        assert amounts(status["capacity"]) == {n: a.value for n, a in capacity.items()}
        assert amounts(status["allocatable"]) == {n: a.value for n, a in allocatable.items()}
        assert status["allocatable"]["memory"] != status["capacity"]["memory"]  # 100Mi held back
        assert status["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 10250}}
        info = status["nodeInfo"]
        assert info["kubeletVersion"] == f"v1.36.3+trio-kubelet.{__version__}"
        assert info["containerRuntimeVersion"] == "containerd://1.7.2"
        assert (info["machineID"], info["bootID"]) == (machine.machine_id, machine.boot_id)
        assert (info["operatingSystem"], info["architecture"]) == ("linux", machine.architecture)
        assert info["osImage"] == machine.os_image
        expected_ips = await trio.to_thread.run_sync(internal_ips, None, NODE)
        assert status["addresses"] == [
            *({"type": "InternalIP", "address": ip} for ip in expected_ips),
            {"type": "Hostname", "address": NODE},
        ]
        labels = node["metadata"]["labels"]
        assert labels["kubernetes.io/hostname"] == NODE
        assert labels["node.kubernetes.io/pool"] == "e2e"
        assert {"key": "e2e", "value": "true", "effect": "NoSchedule"} in node["spec"]["taints"]
        assert [c["type"] for c in status["conditions"]] == [
            "MemoryPressure", "DiskPressure", "PIDPressure", "Ready",
        ]  # fmt: skip

        # The Lease is owned by the Node and renews (every 1 s with a 4 s duration).
        lease = await wait_for(admin, LEASE, lambda lease: True)
        assert lease["spec"]["holderIdentity"] == NODE
        assert lease["spec"]["leaseDurationSeconds"] == 4
        assert lease["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node["metadata"]["uid"]}
        ]
        first = lease["spec"]["renewTime"]
        await wait_for(admin, LEASE, lambda lease: lease["spec"]["renewTime"] > first, 15.0)

        # Ready follows the agent's health, with Go's reason and message.
        health.network = "container runtime network not ready: NetworkReady=false"
        node = await wait_for(admin, path, lambda n: ready(n)["status"] == "False", 15.0)
        assert ready(node)["reason"] == "KubeletNotReady"
        assert ready(node)["message"] == health.network
        health.network = None
        await wait_for(admin, path, lambda n: ready(n)["status"] == "True", 15.0)

        # The API server goes away; the node's health changes meanwhile.
        before = (await wait_for(admin, LEASE, lambda lease: True))["spec"]["renewTime"]
        await trio.to_thread.run_sync(control_plane.stop_apiserver)
        health.network = "container runtime network not ready: during the outage"
        await trio.sleep(OUTAGE)
        await trio.to_thread.run_sync(control_plane.start_apiserver)
        back = trio.current_time()
        # The Lease renews again (expected within the lease backoff's 7 s ceiling plus a renew
        # interval; the bound is a sanity bound for a loaded CI box), and the status catches up
        # with what changed while the API server was away.
        await wait_for(admin, LEASE, lambda lease: lease["spec"]["renewTime"] > before, 20.0)
        node = await wait_for(admin, path, lambda n: ready(n)["status"] == "False", 20.0)
        assert ready(node)["message"] == health.network
        assert trio.current_time() - back < 20.0
        nursery.cancel_scope.cancel()
    await client.aclose()


async def test_an_external_cloud_provider_node_registers_for_its_controller(
    control_plane: ControlPlane, admin: httpx.Client, tmp_path: Path
) -> None:
    """--cloud-provider=external through the Node authorizer and NodeRestriction: the Node is
    created tainted uninitialized with its providerID and the given IP; when a cloud
    controller manager (the admin here) sets the addresses and lifts the taint, the node's
    next status reports keep them."""
    kubeconfig = await trio.to_thread.run_sync(control_plane.node_kubeconfig, NODE)
    options = parse_run_options([
        "--hostname-override", NODE, "--root-dir", str(tmp_path), "--node-ip", "127.0.0.1",
        "--node-status-update-frequency", "1s", "--cloud-provider", "external",
        "--provider-id", "external:///e2e/node-1",
    ])  # fmt: skip
    client = APIClient(load_kubeconfig(kubeconfig))
    health = Health()
    manager = NodeManager(client, options, health.node_health(), TrioWallClock())
    path = f"/api/v1/nodes/{NODE}"
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        node = await wait_for(admin, path, lambda n: ready(n)["status"] == "True")
        assert node["spec"]["providerID"] == "external:///e2e/node-1"
        assert {"key": "node.cloudprovider.kubernetes.io/uninitialized", "value": "true",
                "effect": "NoSchedule"} in node["spec"]["taints"]
        annotations = node["metadata"]["annotations"]
        assert annotations["alpha.kubernetes.io/provided-node-ip"] == "127.0.0.1"

        cloud = [{"type": "InternalIP", "address": "127.0.0.1"},
                 {"type": "InternalDNS", "address": "node-1.e2e.internal"}]

        def initialise() -> None:  # as the cloud controller manager does
            status = admin.patch(
                f"{path}/status", json={"status": {"addresses": [{"$patch": "replace"}, *cloud]}},
                headers={"Content-Type": "application/strategic-merge-patch+json"})
            assert status.status_code == 200, status.text
            lifted = admin.patch(path, json={"spec": {"taints": None}},
                                 headers={"Content-Type": "application/merge-patch+json"})
            assert lifted.status_code == 200, lifted.text

        await trio.to_thread.run_sync(initialise)
        # A status report sent after that (the node's health changed) keeps the addresses.
        health.network = "container runtime network not ready: NetworkReady=false"
        later = await wait_for(admin, path, lambda n: ready(n)["status"] == "False", 20.0)
        assert later["status"]["addresses"] == cloud
        assert not later["spec"].get("taints")
        nursery.cancel_scope.cancel()
    await client.aclose()
