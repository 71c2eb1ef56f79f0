"""Pod lifecycle events from runtime relists and from the runtime's own container events.

Two consecutive relists give the generic PLEG's events (`lifecycle_events`). Where the
runtime streams container events (CRI GetContainerEvents), `PlegRecords` merges both
inputs so that each change is told once, whichever input sees it first. Sandboxes count
as containers, as in the Go kubelet, so a sandbox that dies also wakes its pod's worker.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import Literal

from trio_kubelet.core.observed import ContainerState, RuntimePodStatus, SandboxState

# What PLEG distinguishes: created and unknown containers are both "unknown".
PlegState = Literal["running", "exited", "unknown"]
LifecycleType = Literal["ContainerStarted", "ContainerDied", "ContainerRemoved"]
#: One container's (or sandbox's) record: its pod's UID and its PLEG state.
Record = tuple[str, PlegState]
#: The CRI's container event types (ContainerEventType), without their prefix and suffix.
RuntimeEventType = Literal["created", "started", "stopped", "deleted"]

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


def snapshot(pods: Iterable[RuntimePodStatus]) -> dict[str, Record]:
    """Container/sandbox ID → (pod UID, PLEG state) for one relist."""
    records: dict[str, tuple[str, PlegState]] = {}
    for pod in pods:
        for sandbox in pod.sandboxes:
            state: PlegState = "running" if sandbox.state is SandboxState.READY else "exited"
            records[sandbox.id] = (pod.uid, state)
        for container in pod.containers:
            records[container.id] = (pod.uid, _CONTAINER_STATES[container.state])
    return records


def lifecycle_events(old: Mapping[str, Record], new: Mapping[str, Record]) -> list[Lifecycle]:
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


@dataclass(frozen=True, slots=True)
class RuntimeEvent:
    """What PLEG reads of one runtime container event (sandboxes have them too).

    ``pod_uid`` is the pod the event's sandbox or container status names ("" if none does).
    """

    container_id: str
    type: RuntimeEventType
    pod_uid: str = ""


# The state an event moves a record to, and the order states follow: a container is
# created, runs, exits and is deleted, never the other way round.
_EVENT_STATES: dict[RuntimeEventType, PlegState] = {
    "created": "unknown", "started": "running", "stopped": "exited",
}
_ORDER: dict[PlegState, int] = {"unknown": 0, "running": 1, "exited": 2}


#: How many removed IDs PLEG remembers (in two generations of this size): far more than
#: the events that can be in flight between the runtime and PLEG at once.
REMEMBERED_REMOVALS = 1024


@dataclass(frozen=True, slots=True)
class PlegRecords:
    """What PLEG knows of every container and sandbox: the last relist, moved on by events.

    A relist is the truth when it is taken (the shell never applies an event while one is
    in flight, so no event it holds can be newer than the relist). An event moves one record
    forward only, so an event the relist already reported, or one repeated, tells nothing new.
    ``gone`` and ``gone_before`` hold the last IDs that left the records (two generations of
    `REMEMBERED_REMOVALS`): an event about one of them that was still on its way when it
    went (a late "stopped" after a relist saw it deleted) must not bring it back.
    """

    records: Mapping[str, Record] = field(default_factory=dict)
    gone: frozenset[str] = frozenset()
    gone_before: frozenset[str] = frozenset()

    def relisted(self, current: Mapping[str, Record]) -> tuple[PlegRecords, list[Lifecycle]]:
        """The records after a relist (``current``, from `snapshot`) and the changes it saw."""
        removed = self.records.keys() - current.keys()
        return (self._forgetting(removed, current), lifecycle_events(self.records, current))

    def on_event(self, event: RuntimeEvent) -> tuple[PlegRecords, list[Lifecycle]]:
        """The records after one runtime event and the changes it tells (none if stale)."""
        cid = event.container_id
        old = self.records.get(cid)
        before = {cid: old} if old is not None else {}
        if event.type == "deleted":
            if old is None:
                return self, []
            records = {k: v for k, v in self.records.items() if k != cid}
            return self._forgetting({cid}, records), lifecycle_events(before, {})
        state = _EVENT_STATES[event.type]
        if old is None:
            if not event.pod_uid or cid in self.gone or cid in self.gone_before:
                return self, []
            new: Record = (event.pod_uid, state)
        elif _ORDER[state] <= _ORDER[old[1]]:
            return self, []
        else:
            new = (old[0], state)
        return (replace(self, records={**self.records, cid: new}),
                lifecycle_events(before, {cid: new}))

    def _forgetting(self, removed: AbstractSet[str],
                    records: Mapping[str, Record]) -> PlegRecords:
        """New ``records``, with the ``removed`` IDs remembered."""
        if not removed:
            return replace(self, records=records)
        if len(self.gone) + len(removed) <= REMEMBERED_REMOVALS:
            return PlegRecords(records, self.gone | removed, self.gone_before)
        return PlegRecords(records, frozenset(removed), self.gone)


PlegChange = tuple[str, str]  # (container or sandbox id, "ContainerStarted" / "ContainerDied")


def accounted_changes(status: RuntimePodStatus) -> frozenset[PlegChange]:
    """Every PLEG change ``status`` already shows: the start of each container and sandbox
    in it that ran, and the exit of each that exited. A container only moves from running
    to exited, so news of one of these tells a worker that looked at ``status`` nothing
    new (news of anything else does)."""
    changes: set[PlegChange] = set()
    for c in status.containers:
        if c.state in (ContainerState.RUNNING, ContainerState.EXITED):
            changes.add((c.id, "ContainerStarted"))
        if c.state is ContainerState.EXITED:
            changes.add((c.id, "ContainerDied"))
    for sandbox in status.sandboxes:
        changes.add((sandbox.id, "ContainerStarted"))
        if sandbox.state is SandboxState.NOTREADY:
            changes.add((sandbox.id, "ContainerDied"))
    return frozenset(changes)
