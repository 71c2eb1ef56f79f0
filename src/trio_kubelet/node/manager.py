"""The node's life in the cluster: register the Node, keep its status, renew its Lease.

Faithful to the Go kubelet's syncNodeStatus: registration is retried with backoff (100 ms
doubling to 7 s) for as long as it takes, in the background, so static pods never wait for
the API server; then every nodeStatusUpdateFrequency the status is recomputed over the
API server's copy of the Node and patched only when it changed or nodeStatusReportFrequency
has passed (the Lease is the frequent heartbeat). A failed status update is retried 5 times
in a round, then again at the next tick. Nothing here ever ends the agent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, NoReturn, Protocol

import trio

from trio_kubelet.apiserver.client import JSON, APIClient
from trio_kubelet.apiserver.errors import AlreadyExists, APIError
from trio_kubelet.config import AgentOptions
from trio_kubelet.core.image_gc import ListedImage
from trio_kubelet.kube_events import EventRecorder
from trio_kubelet.node.conditions import (
    READY,
    runtime_condition_error,
    runtime_errors,
)
from trio_kubelet.node.lease import LeaseController
from trio_kubelet.node.machine import internal_ips, read_machine_facts
from trio_kubelet.node.registration import (
    MachineFacts,
    RuntimeFeatures,
    RuntimeHandlerFeatures,
    StatusInputs,
    changed_fields,
    initial_node,
    labels_to_restore,
    node_status,
    reconcile_patch,
    should_report,
    status_patch,
)
from trio_kubelet.runtime.errors import CRIError

log = logging.getLogger("trio_kubelet.node")

REGISTER_FIRST_DELAY = 0.1
REGISTER_MAX_DELAY = 7.0
NODE_STATUS_UPDATE_RETRY = 5
RUNTIME_PROBE_PERIOD = 5.0  # Go's updateRuntimeUp period


def _no_pressure() -> bool:
    return False


def _no_error() -> str | None:
    return None


def _no_images() -> Sequence[ListedImage] | None:
    return None


def _no_features() -> RuntimeFeatures | None:
    return None


@dataclass(frozen=True)
class NodeHealth:
    """What the Ready condition and nodeInfo need from the rest of the agent.

    Each callable answers now, without blocking. ``runtime_errors`` is Go's
    runtimeState.runtimeErrors without the PLEG (empty when the runtime is fine; see
    :class:`RuntimeProbe`); ``pleg_error`` is the PLEG health check's message
    ("pleg was last seen active 3m0s ago; threshold is 3m0s"), ``network_error`` the
    runtime's network condition ("container runtime network not ready: ..."); the pressure
    callables are the eviction manager's, and ``runtime_version`` is (name, version) from
    the CRI Version call, None when unknown.
    """

    runtime_errors: Callable[[], Sequence[str]]
    pleg_error: Callable[[], str | None]
    network_error: Callable[[], str | None]
    runtime_version: Callable[[], tuple[str, str] | None]
    memory_pressure: Callable[[], bool] = _no_pressure
    disk_pressure: Callable[[], bool] = _no_pressure
    pid_pressure: Callable[[], bool] = _no_pressure
    shutdown_error: Callable[[], str | None] = _no_error
    images: Callable[[], Sequence[ListedImage] | None] = _no_images
    runtime_features: Callable[[], RuntimeFeatures | None] = _no_features


class NodePressure(Protocol):
    """The eviction manager (resources/eviction.py): whether the node is short of a resource."""

    def memory_pressure(self) -> bool: ...

    def disk_pressure(self) -> bool: ...

    def pid_pressure(self) -> bool: ...


class WallClock(Protocol):
    def now(self) -> float: ...


class RuntimeStatusSource(Protocol):
    """The two CRI calls the probe makes (runtime/client.CRIClient has them)."""

    async def status(self) -> Any: ...

    async def version(self) -> Any: ...


def runtime_features(answer: Any) -> RuntimeFeatures | None:
    """The handlers and features of a CRI StatusResponse; None when it names neither
    (containerd 1.6), so the node reports neither, as Go's setters do then."""
    handlers = tuple(
        RuntimeHandlerFeatures(
            name=handler.name,
            recursive_read_only_mounts=bool(
                handler.features and handler.features.recursive_read_only_mounts
            ),
            user_namespaces=bool(handler.features and handler.features.user_namespaces),
        )
        for handler in answer.runtime_handlers
    )
    features = answer.features
    if not handlers and features is None:
        return None
    return RuntimeFeatures(
        handlers=handlers,
        supplemental_groups_policy=(
            None if features is None else features.supplemental_groups_policy
        ),
    )


class RuntimeProbe:
    """Go's updateRuntimeUp: ask the CRI runtime for its status every 5 s, remember its answer.

    Gives :class:`NodeHealth` its runtime errors, network error and runtime version.
    """

    def __init__(self, runtime: RuntimeStatusSource) -> None:
        self.runtime = runtime
        self.last_runtime_ok: float | None = None  # trio time of the last RuntimeReady=true
        self.runtime_error: str | None = None
        self.network: str | None = None
        self.version: tuple[str, str] | None = None
        self.features: RuntimeFeatures | None = None

    async def run(self) -> NoReturn:
        while True:
            await self.probe()
            await trio.sleep(RUNTIME_PROBE_PERIOD)

    async def probe(self) -> None:
        try:
            answer = await self.runtime.status()
        except CRIError as err:
            log.error("Container runtime status check failed: %s", err)
            return
        conditions = {
            c.type: (c.type, c.status, c.reason, c.message)
            for c in (answer.status.conditions if answer.status else [])
        }
        self.network = runtime_condition_error(
            "container runtime network", conditions.get("NetworkReady")
        )
        self.runtime_error = runtime_condition_error(
            "container runtime", conditions.get("RuntimeReady")
        )
        if self.runtime_error is None:
            self.last_runtime_ok = trio.current_time()
        self.features = runtime_features(answer)
        try:
            version = await self.runtime.version()
        except CRIError:
            self.version = None
        else:
            self.version = (version.runtime_name, version.runtime_version)

    def errors(self) -> list[str]:
        return runtime_errors(
            now=trio.current_time(),
            last_runtime_ok=self.last_runtime_ok,
            runtime_error=self.runtime_error,
        )

    def health(
        self, pleg_error: Callable[[], str | None], pressure: NodePressure | None = None
    ) -> NodeHealth:
        """The node's health from this probe, the PLEG and (when given) the eviction manager."""
        health = NodeHealth(
            runtime_errors=self.errors,
            pleg_error=pleg_error,
            network_error=lambda: self.network,
            runtime_version=lambda: self.version,
            runtime_features=lambda: self.features,
        )
        if pressure is None:
            return health
        return replace(
            health,
            memory_pressure=pressure.memory_pressure,
            disk_pressure=pressure.disk_pressure,
            pid_pressure=pressure.pid_pressure,
        )


class NodeManager:
    """Registers this node, keeps its status in the API server and runs its Lease."""

    def __init__(
        self,
        client: APIClient,
        options: AgentOptions,
        health: NodeHealth,
        clock: WallClock,
        *,
        machine: MachineFacts | None = None,
        events: EventRecorder | None = None,
    ) -> None:
        self.client = client
        self.events = events
        self.options = options
        self.health = health
        self.clock = clock
        self.machine = machine
        self.node_uid: str | None = None
        self.registered = trio.Event()
        self._status_now = trio.Event()  # set by sync_soon: a status round without waiting
        self.last_report: float | None = None  # wall time of the last status sent
        self.node_path = f"/api/v1/nodes/{options.node_name}"
        self.lease = LeaseController(
            client,
            options.node_name,
            duration_seconds=options.config.node_lease_duration_seconds,
            wall_clock=clock.now,
            node_uid=lambda: self.node_uid,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start at once (nothing waits for the API server), then run until cancelled."""
        task_status.started()
        self._event("Starting", "Starting kubelet.")
        if self.machine is None:
            self.machine = await trio.to_thread.run_sync(read_machine_facts, self.options.root_dir)
        config = self.options.config
        async with trio.open_nursery() as nursery:
            if config.register_node:
                await self.register()
            nursery.start_soon(self.lease.run)
            while True:
                self._status_now = trio.Event()
                await self.sync_status()
                with trio.move_on_after(config.node_status_update_frequency):
                    await self._status_now.wait()

    def sync_soon(self) -> None:
        """Send the status now rather than at the next period (the node is shutting down)."""
        self._status_now.set()

    # --- registration ---------------------------------------------------------------------

    async def register(self) -> None:
        """Create the Node (or adopt the existing one), retrying until the API server agrees."""
        name = self.options.node_name
        step, retry_after = REGISTER_FIRST_DELAY, 0.0
        while True:
            await trio.sleep(max(step, retry_after))
            step = min(step * 2, REGISTER_MAX_DELAY)
            node = initial_node(self.options, await self._inputs(), self.clock.now())
            log.info("Attempting to register node %s", name)
            try:
                await self._try_register(node)
            except APIError as err:
                log.error("Unable to register node %s with the API server: %s", name, err)
                retry_after = err.retry_after or 0.0  # a 429's Retry-After, if longer
                continue
            log.info("Successfully registered node %s", name)
            self.registered.set()
            return

    async def _try_register(self, node: JSON) -> None:
        try:
            self._learn(await self.client.create("/api/v1/nodes", node))
            return
        except AlreadyExists:
            pass
        existing = await self.client.get(self.node_path)
        self._learn(existing)
        log.info("Node %s was previously registered", self.options.node_name)
        patch = reconcile_patch(node, existing)
        if patch is not None:
            self._learn(await self.client.patch(f"{self.node_path}/status", patch))

    def _learn(self, node: JSON) -> None:
        uid = node.get("metadata", {}).get("uid")
        if uid:
            self.node_uid = str(uid)

    # --- status ---------------------------------------------------------------------------

    async def sync_status(self) -> None:
        """One status round: up to 5 tries, the first reading the API server's cache."""
        for attempt in range(NODE_STATUS_UPDATE_RETRY):
            try:
                await self._try_update_status(attempt)
                return
            except APIError as err:
                log.error("Error updating node status, will retry: %s", err)
        log.error("Unable to update node status: update node status exceeds retry count")

    async def _try_update_status(self, attempt: int) -> None:
        node = await self.client.get(
            self.node_path, {"resourceVersion": "0"} if attempt == 0 else None
        )
        self._learn(node)
        inputs = await self._inputs()
        now = self.clock.now()
        reported = node.get("status") or {}
        desired = node_status(self.options, inputs, reported, now)
        changed = changed_fields(reported, desired)
        labels = labels_to_restore(node, inputs.machine)
        if not should_report(
            bool(changed or labels),
            now=now,
            last_report=self.last_report,
            report_frequency=self.options.config.node_status_report_frequency,
        ):
            return
        await self.client.patch(f"{self.node_path}/status", status_patch(desired, changed, labels))
        self.last_report = now
        _log_ready_transition(reported, desired)
        for reason in condition_event_reasons(reported, desired):
            self._event(reason, f"Node {self.options.node_name} status is now: {reason}")

    def _event(self, reason: str, message: str) -> None:
        if self.events is not None:
            self.events.node_event(self.options.node_name, "Normal", reason, message)

    async def _inputs(self) -> StatusInputs:
        assert self.machine is not None
        node_ip, name = self.options.node_ip, self.options.node_name
        if node_ip:
            addresses = internal_ips(node_ip, name)
        else:  # a DNS lookup: keep it off the event loop
            addresses = await trio.to_thread.run_sync(internal_ips, None, name)
        health = self.health
        return StatusInputs(
            machine=self.machine,
            internal_ips=tuple(addresses),
            runtime=health.runtime_version(),
            runtime_errors=tuple(health.runtime_errors()),
            pleg_error=health.pleg_error(),
            network_error=health.network_error(),
            memory_pressure=health.memory_pressure(),
            disk_pressure=health.disk_pressure(),
            pid_pressure=health.pid_pressure(),
            shutdown_error=health.shutdown_error(),
            images=None if (images := health.images()) is None else tuple(images),
            features=health.runtime_features(),
        )


def _ready(status: JSON) -> JSON | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == READY), None)


def _log_ready_transition(reported: JSON, desired: JSON) -> None:
    before, after = _ready(reported), _ready(desired)
    if after is None or (before is not None and before.get("status") == after.get("status")):
        return
    if after.get("status") == "True":
        log.info("Node is ready")
    else:
        log.info("Node became not ready: %s", after.get("message"))


# The event reason of each node condition's status, as the Go kubelet records them.
_CONDITION_EVENTS = {
    ("Ready", "True"): "NodeReady",
    ("Ready", "False"): "NodeNotReady",
    ("MemoryPressure", "False"): "NodeHasSufficientMemory",
    ("MemoryPressure", "True"): "NodeHasInsufficientMemory",
    ("DiskPressure", "False"): "NodeHasNoDiskPressure",
    ("DiskPressure", "True"): "NodeHasDiskPressure",
    ("PIDPressure", "False"): "NodeHasSufficientPID",
    ("PIDPressure", "True"): "NodeHasInsufficientPID",
}


def condition_event_reasons(reported: JSON, desired: JSON) -> list[str]:
    """The events for conditions that are new or changed status between two node statuses."""
    before = {c.get("type"): c.get("status") for c in reported.get("conditions") or []}
    reasons = []
    for condition in desired.get("conditions") or []:
        kind, status = condition.get("type"), condition.get("status")
        if before.get(kind) != status and (kind, status) in _CONDITION_EVENTS:
            reasons.append(_CONDITION_EVENTS[(kind, status)])
    return reasons
