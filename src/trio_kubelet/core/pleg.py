"""Turning two consecutive runtime relists into pod lifecycle events (generic PLEG rules).

Sandboxes count as containers, as in the Go kubelet, so a sandbox that dies
also wakes its pod's worker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from trio_kubelet.core.observed import ContainerState, RuntimePodStatus, SandboxState

# What PLEG distinguishes: created and unknown containers are both "unknown".
PlegState = Literal["running", "exited", "unknown"]
LifecycleType = Literal["ContainerStarted", "ContainerDied", "ContainerRemoved"]

_CONTAINER_STATES: dict[ContainerState, PlegState] = {
    ContainerState.RUNNING: "running",
    ContainerState.EXITED: "exited",
    ContainerState.CREATED: "unknown",
    ContainerState.UNKNOWN: "unknown",
}


@dataclass(frozen=True, slots=True)
class Lifecycle:
    pod_uid: str
    type: LifecycleType
    container_id: str


def snapshot(pods: Iterable[RuntimePodStatus]) -> dict[str, tuple[str, PlegState]]:
    """Container/sandbox ID → (pod UID, PLEG state) for one relist."""
    records: dict[str, tuple[str, PlegState]] = {}
    for pod in pods:
        for sandbox in pod.sandboxes:
            state: PlegState = "running" if sandbox.state is SandboxState.READY else "exited"
            records[sandbox.id] = (pod.uid, state)
        for container in pod.containers:
            records[container.id] = (pod.uid, _CONTAINER_STATES[container.state])
    return records


def lifecycle_events(
    old: Mapping[str, tuple[str, PlegState]], new: Mapping[str, tuple[str, PlegState]]
) -> list[Lifecycle]:
    """Events for every ID whose state changed between relists.

    Becoming unknown is not reported (the Go PLEG never emits ContainerChanged);
    a disappearing container is reported Died first unless it had already exited.
    """
    events: list[Lifecycle] = []
    for cid, (uid, state) in new.items():
        before = old.get(cid)
        if before is not None and before[1] == state:
            continue
        if state == "running":
            events.append(Lifecycle(uid, "ContainerStarted", cid))
        elif state == "exited":
            events.append(Lifecycle(uid, "ContainerDied", cid))
    for cid, (uid, state) in old.items():
        if cid in new:
            continue
        if state != "exited":
            events.append(Lifecycle(uid, "ContainerDied", cid))
        events.append(Lifecycle(uid, "ContainerRemoved", cid))
    return events
