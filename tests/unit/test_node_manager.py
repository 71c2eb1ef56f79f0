"""node/manager.py against an in-memory API server (httpx.MockTransport), on trio's MockClock.

Covers what the real-apiserver e2e test cannot time precisely: the registration backoff,
status sent only on change or when the report is due, the lease's renewal period, its
conflict handling and its backoff while the API server is away.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import replace
from itertools import pairwise
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from trio_kubelet.apiserver.client import APIClient
from trio_kubelet.apiserver.kubeconfig import Connection
from trio_kubelet.cli import parse_run_options
from trio_kubelet.clock import TrioWallClock
from trio_kubelet.config import AgentOptions
from trio_kubelet.node.manager import NodeHealth, NodeManager, RuntimeProbe
from trio_kubelet.node.registration import (
    MachineFacts,
    RuntimeFeatures,
    RuntimeHandlerFeatures,
)
from trio_kubelet.runtime.cri.runtime import v1

NODE = "node-a"
MACHINE = MachineFacts(num_cores=2, memory_bytes=4 * 1024**3, ephemeral_storage_bytes=10 * 1024**3)
LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"


def _merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    """Enough of a strategic merge patch for node status: maps merge, conditions by type."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif key == "conditions":
            merged = {c["type"]: c for c in target.get(key, [])}
            merged.update({c["type"]: c for c in value})
            target[key] = list(merged.values())
        elif isinstance(value, list):
            target[key] = [item for item in value if "$patch" not in item]
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class FakeAPIServer:
    """Nodes and leases in memory; ``down`` makes every request fail to connect."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict[str, Any]] = {}
        self.leases: dict[str, dict[str, Any]] = {}
        self.down = False
        self.refusals: list[httpx.Response] = []  # answers to the next requests, in order
        self.requests: list[tuple[float, str, str]] = []  # (trio time, method, path)
        self.version = 0

    def calls(self, method: str, path_pattern: str) -> list[float]:
        return [t for t, m, p in self.requests if m == method and re.fullmatch(path_pattern, p)]

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(obj)

    def handle(self, request: httpx.Request) -> httpx.Response:
        path, method = request.url.path, request.method
        self.requests.append((trio.current_time(), method, path))
        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        if self.refusals:
            return self.refusals.pop(0)
        body = json.loads(request.content) if request.content else None
        if path == "/api/v1/nodes" and method == "POST":
            return self._create(self.nodes, body, uid="node-uid-1")
        if path == LEASES and method == "POST":
            return self._create(self.leases, body, uid="lease-uid-1")
        match = re.fullmatch(r"/api/v1/nodes/([^/]+)(/status)?", path)
        if match:
            node = self.nodes.get(match.group(1))
            if node is None:
                return _status(404, "NotFound")
            if method == "PATCH":
                _merge(node, body)
                return httpx.Response(200, json=self._stamp(node))
            return httpx.Response(200, json=node)
        match = re.fullmatch(LEASES + r"/([^/]+)", path)
        if match:
            lease = self.leases.get(match.group(1))
            if lease is None:
                return _status(404, "NotFound")
            if method == "PUT":
                if body["metadata"].get("resourceVersion") != lease["metadata"]["resourceVersion"]:
                    return _status(409, "Conflict")
                self.leases[match.group(1)] = body
                return httpx.Response(200, json=self._stamp(body))
            return httpx.Response(200, json=lease)
        return _status(404, "NotFound")

    def _create(self, store: dict[str, Any], body: dict[str, Any], uid: str) -> httpx.Response:
        name = body["metadata"]["name"]
        if name in store:
            return _status(409, "AlreadyExists")
        body["metadata"]["uid"] = uid
        store[name] = body
        return httpx.Response(201, json=self._stamp(body))


def _status(code: int, reason: str) -> httpx.Response:
    return httpx.Response(code, json={"kind": "Status", "code": code, "reason": reason})


class Health:
    def __init__(self) -> None:
        self.runtime: list[str] = []

    def node_health(self) -> NodeHealth:
        return NodeHealth(
            runtime_errors=lambda: self.runtime,
            pleg_error=lambda: None,
            network_error=lambda: None,
            runtime_version=lambda: ("containerd", "1.7.2"),
        )


def options(**config: Any) -> AgentOptions:
    base = parse_run_options(["--hostname-override", NODE, "--node-ip", "10.0.0.5"])
    return replace(base, config=base.config.model_copy(update=config))


def manager_for(
    api: FakeAPIServer, health: Health, opts: AgentOptions | None = None
) -> NodeManager:
    client = APIClient(
        Connection(server="http://api.test", ssl_context=None),
        transport=httpx.MockTransport(api.handle),
    )
    return NodeManager(
        client, opts or options(), health.node_health(), TrioWallClock(epoch=1e9), machine=MACHINE
    )


async def test_registration_waits_out_the_api_server_with_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    api, health = FakeAPIServer(), Health()
    api.down = True
    manager = manager_for(api, health)
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)  # returns at once: nothing waits for the API server
        await trio.sleep(25)
        assert not manager.registered.is_set()
        api.down = False
        await manager.registered.wait()
        nursery.cancel_scope.cancel()
    attempts = api.calls("POST", "/api/v1/nodes")
    gaps = [round(b - a, 3) for a, b in pairwise(attempts)]
    assert attempts[0] == 0.1
    assert gaps == [0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 7.0, 7.0]
    node = api.nodes[NODE]
    assert node["metadata"]["labels"]["kubernetes.io/hostname"] == NODE
    assert manager.node_uid == "node-uid-1"


async def test_registration_honours_retry_after_and_reports_refusals(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    api, health = FakeAPIServer(), Health()
    forbidden = 'nodes "node-a" is forbidden: node "other" is not allowed to modify node "node-a"'
    api.refusals = [
        httpx.Response(429, headers={"Retry-After": "5"}, json={"reason": "TooManyRequests"}),
        httpx.Response(403, json={"kind": "Status", "reason": "Forbidden", "message": forbidden}),
    ]
    manager = manager_for(api, health)
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        await manager.registered.wait()
        nursery.cancel_scope.cancel()
    assert [round(t, 3) for t in api.calls("POST", "/api/v1/nodes")] == [0.1, 5.1, 5.5]
    assert f"Unable to register node node-a with the API server: Forbidden (403): {forbidden}" in (
        caplog.text
    )


async def test_status_goes_out_on_change_or_when_due_and_the_lease_every_10s_plus_jitter(
    autojump_clock: trio.testing.MockClock,
) -> None:
    api, health = FakeAPIServer(), Health()
    manager = manager_for(api, health, options(node_status_report_frequency=60.0))
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        await manager.registered.wait()
        await trio.sleep(35)
        patches = api.calls("PATCH", "/api/v1/nodes/node-a/status")
        assert len(patches) == 1  # the first report after registration; nothing changed since
        assert len(api.calls("GET", "/api/v1/nodes/node-a")) == 4  # one read per 10 s tick

        health.runtime = ["container runtime is down"]
        await trio.sleep(10)
        ready = api.nodes[NODE]["status"]["conditions"][-1]
        assert (ready["status"], ready["message"]) == ("False", "container runtime is down")
        assert len(api.calls("PATCH", "/api/v1/nodes/node-a/status")) == 2

        await trio.sleep(70)  # unchanged, but the 60 s report period comes round once
        nursery.cancel_scope.cancel()
    assert len(api.calls("PATCH", "/api/v1/nodes/node-a/status")) == 3
    lease = api.leases[NODE]
    assert lease["spec"]["holderIdentity"] == NODE
    assert lease["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "node-uid-1"}
    ]
    renewals = api.calls("PUT", LEASES + "/node-a")
    gaps = [b - a for a, b in pairwise(renewals)]
    assert all(10.0 <= gap < 10.4 for gap in gaps)  # 10 s and up to 4 % of jitter (Go's)
    assert len(set(gaps)) > 1
    assert len(renewals) >= 8


async def test_an_existing_node_is_reconciled_not_recreated(
    autojump_clock: trio.testing.MockClock,
) -> None:
    api, health = FakeAPIServer(), Health()
    api.nodes[NODE] = {
        "metadata": {
            "name": NODE,
            "uid": "old-uid",
            "resourceVersion": "1",
            "labels": {"kubernetes.io/hostname": "renamed", "team": "x"},
        },
        "status": {},
    }
    manager = manager_for(api, health)
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        await manager.registered.wait()
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    labels = api.nodes[NODE]["metadata"]["labels"]
    assert labels["kubernetes.io/hostname"] == NODE
    assert labels["team"] == "x"
    assert labels["kubernetes.io/os"] == "linux"
    assert manager.node_uid == "old-uid"
    assert api.nodes[NODE]["status"]["capacity"]["cpu"] == "2"


async def test_the_lease_backs_off_while_the_api_server_is_away_and_resumes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    api, health = FakeAPIServer(), Health()
    manager = manager_for(api, health)
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        await manager.registered.wait()
        await trio.sleep(5)
        api.down = True
        went_down = trio.current_time()
        await trio.sleep(30)
        api.down = False
        came_back = trio.current_time()
        await trio.sleep(10)
        nursery.cancel_scope.cancel()
    lease_gets = [t for t in api.calls("GET", LEASES + "/node-a") if went_down < t < came_back]
    gaps = [round(b - a, 3) for a, b in pairwise(lease_gets)]
    assert gaps[:6] == [0.2, 0.4, 0.8, 1.6, 3.2, 6.4]
    assert max(gaps) == 7.0
    renewed_after = [t for t in api.calls("PUT", LEASES + "/node-a") if t > came_back]
    assert renewed_after and renewed_after[0] - came_back <= 7.0
    assert api.leases[NODE]["spec"]["renewTime"].startswith("2001-09-09T01:47:")


async def test_a_lease_conflict_rereads_the_lease(autojump_clock: trio.testing.MockClock) -> None:
    api, health = FakeAPIServer(), Health()
    manager = manager_for(api, health)
    async with trio.open_nursery() as nursery:
        await nursery.start(manager.run)
        await manager.registered.wait()
        await trio.sleep(1)
        api.version += 1  # someone else wrote the lease
        api.leases[NODE]["metadata"]["resourceVersion"] = str(api.version)
        await trio.sleep(10)
        nursery.cancel_scope.cancel()
    assert len(api.calls("GET", LEASES + "/node-a")) == 2  # the first ensure, then the re-read
    assert manager.lease.latest is not None
    assert manager.lease.latest["metadata"]["resourceVersion"] == str(api.version)


class FakeRuntime:
    def __init__(self) -> None:
        self.conditions = [("RuntimeReady", True), ("NetworkReady", False)]
        self.handlers: list[v1.RuntimeHandler] = []
        self.features: v1.RuntimeFeatures | None = None

    async def status(self) -> v1.StatusResponse:
        conditions = [
            v1.RuntimeCondition(type=t, status=s, reason="R", message="M")
            for t, s in self.conditions
        ]
        return v1.StatusResponse(
            status=v1.RuntimeStatus(conditions=conditions),
            runtime_handlers=self.handlers,
            features=self.features,
        )

    async def version(self) -> Any:
        return type("Version", (), {"runtime_name": "containerd", "runtime_version": "v1.7.2"})


async def test_runtime_probe_feeds_the_health(autojump_clock: trio.testing.MockClock) -> None:
    probe = RuntimeProbe(FakeRuntime())
    health = probe.health(lambda: None)
    assert health.runtime_errors() == ["container runtime status check may not have completed yet"]
    await probe.probe()
    assert health.runtime_errors() == []
    assert health.network_error() == (
        "container runtime network not ready: NetworkReady=false reason:R message:M"
    )
    assert health.runtime_version() == ("containerd", "v1.7.2")
    assert health.runtime_features() is None  # a runtime naming no handlers (containerd 1.6)
    await trio.sleep(31)
    assert health.runtime_errors() == ["container runtime is down"]


async def test_runtime_probe_reads_the_handlers_and_features_the_runtime_names() -> None:
    runtime = FakeRuntime()
    runtime.handlers = [
        v1.RuntimeHandler(name="", features=v1.RuntimeHandlerFeatures(user_namespaces=True)),
        v1.RuntimeHandler(name="runc"),
    ]
    runtime.features = v1.RuntimeFeatures(supplemental_groups_policy=True)
    probe = RuntimeProbe(runtime)
    await probe.probe()
    assert probe.health(lambda: None).runtime_features() == RuntimeFeatures(
        handlers=(
            RuntimeHandlerFeatures("", user_namespaces=True),
            RuntimeHandlerFeatures("runc"),
        ),
        supplemental_groups_policy=True,
    )
