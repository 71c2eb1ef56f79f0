"""The sync loop: the one consumer of every source's events, routing work to pod workers.

It feeds pod sets to ``PodConfig`` (which decides which pods are wanted), wakes
the worker of each pod an event concerns, and starts a teardown worker for pods
the runtime holds that no source wants.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterable, Sequence
from typing import Protocol

import trio

from trio_kubelet.core.admission import Rejection
from trio_kubelet.events import (
    Event,
    EvictPod,
    NodeConditions,
    OOMEvent,
    PodLifecycleEvent,
    PodSetUpdate,
    ProbeResultEvent,
    RelistDone,
    ResyncTick,
)
from trio_kubelet.model.pod import Pod
from trio_kubelet.reconcile.podconfig import Change, PodConfig
from trio_kubelet.reconcile.workers import PodWorker, WorkerContext
from trio_kubelet.recording.pod_decisions import Admission
from trio_kubelet.recording.records import InFlightSpec, SnapshotRecord

log = logging.getLogger("trio_kubelet.sync")


class PodProbes(Protocol):
    """What the sync loop tells the probe manager: which pods to probe."""

    def set_pod(self, pod: Pod) -> None: ...
    def remove_pod(self, uid: str) -> None: ...


class _NoProbes:
    def set_pod(self, pod: Pod) -> None:
        pass

    def remove_pod(self, uid: str) -> None:
        pass


class SyncLoop:
    def __init__(
        self,
        ctx: WorkerContext,
        sources: Iterable[str],
        *,
        sync_frequency: float = 60.0,
        probes: PodProbes | None = None,
        allowed_unsafe_sysctls: Sequence[str] = (),
    ) -> None:
        self._ctx = ctx
        # The latest node conditions of each manager that reports them (NodeConditions).
        self._conditions: dict[str, tuple[str, ...]] = {}
        self._allowed_unsafe_sysctls = tuple(allowed_unsafe_sysctls)
        self._probes = probes if probes is not None else _NoProbes()
        self._sync_frequency = sync_frequency
        self._relist_failing = False
        self.config = PodConfig(sources)
        self.workers: dict[str, PodWorker] = {}
        # Pods whose teardown finished: late PLEG events about them are expected.
        self._gone: set[str] = set()
        # Set by the first good relist: every UID the runtime held then has had lifecycle
        # events (sent before the relist's RelistDone), and so is in `workers`, `_gone` or
        # `_unowned` (told of while no worker had it).
        self.last_relist_ok: float | None = None
        self._unowned: set[str] = set()
        self.last_handled: float | None = None  # trio time of the last event (healthz/syncloop)
        self._nursery: trio.Nursery | None = None
        # Every consumed event gets a sequence number; recordings refer to pod specs by it.
        self._seq = 0

    async def run(
        self,
        receive: trio.MemoryReceiveChannel[Event],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            async with receive:
                async for event in receive:
                    self.handle(event)
            nursery.cancel_scope.cancel()

    def handle(self, event: Event) -> None:
        """Apply one event to the desired state and wake the workers concerned (never blocks)."""
        self.last_handled = trio.current_time()
        seq = self._seq
        self._seq += 1
        if self._ctx.recorder is not None:
            self._ctx.recorder.event(seq, event)
        if isinstance(event, PodSetUpdate):
            self._apply(self.config.apply(event), seq)
        elif isinstance(event, PodLifecycleEvent):
            self._on_lifecycle(event)
        elif isinstance(event, OOMEvent):
            log.info(
                "OOM kill in container %s of pod %s_%s (%s)",
                event.container_name,
                event.pod_name,
                event.pod_namespace,
                event.pod_uid,
            )
            events = self._ctx.events
            victim = f"{event.process}, pid: {event.pid}" if event.pid else event.container_name
            events.node_event(
                events.node_name,
                "Warning",
                "OOMKilling",
                f"Memory cgroup out of memory: Killed process {victim}",
            )
            worker = self.workers.get(event.pod_uid)
            if worker is not None:
                worker.wake()
        elif isinstance(event, RelistDone):
            self._on_relist(event)
        elif isinstance(event, ProbeResultEvent):
            self._on_probe(event)
        elif isinstance(event, NodeConditions):
            self._conditions[event.source] = tuple(event.conditions)
        elif isinstance(event, EvictPod):
            self._evict(event)
        elif isinstance(event, ResyncTick):
            # Spread over the period (deterministically by UID, so replays match),
            # not all pods at once: a burst of 110 syncs starves the relist.
            now = trio.current_time()
            for uid, worker in self.workers.items():
                worker.wake_at(now + self._sync_frequency * (zlib.crc32(uid.encode()) / 2**32))

    def _on_relist(self, event: RelistDone) -> None:
        if not event.ok:
            self._relist_failing = True
            return
        self.last_relist_ok = trio.current_time()
        if self._relist_failing:
            # The runtime is back: retry pods whose sync failed now, not after their retry delay.
            self._relist_failing = False
            for worker in self.workers.values():
                worker.wake()

    def _on_probe(self, event: ProbeResultEvent) -> None:
        """Record a probe result; sync the pod unless it is a liveness success (Go's rule)."""
        worker = self.workers.get(event.pod_uid)
        if worker is None or not self._ctx.probe_results.apply(event):
            return
        if event.probe != "liveness" or event.result != "success":
            worker.wake()

    def _on_lifecycle(self, event: PodLifecycleEvent) -> None:
        worker = self.workers.get(event.pod_uid)
        if worker is not None:
            worker.tell(event.container_id, event.type)
            return
        if event.pod_uid in self._gone:
            return
        self._unowned.add(event.pod_uid)
        if event.type != "ContainerRemoved":
            self._apply(self.config.runtime_pod_seen(event.pod_uid), -1)

    def node_conditions(self) -> tuple[str, ...]:
        """The node conditions admission refuses pods by: every manager's latest."""
        return tuple(c for conditions in self._conditions.values() for c in conditions)

    def existing_pods(self) -> set[str]:
        """UIDs of the pods that exist on the node: wanted by a source, or being torn down."""
        return self.config.desired().keys() | self.workers.keys()

    def snapshot(self) -> SnapshotRecord:
        """The pod sets and spec versions now, to start a rotated recording with."""
        return SnapshotRecord(
            pod_sets={
                source: [pod.to_api() for pod in pods.values()]
                for source, pods in self.config.pod_sets().items()
            },
            spec_seqs={uid: worker.spec_seq for uid, worker in self.workers.items()},
            in_flight=[
                InFlightSpec(uid=uid, seq=seq, pod=pod.to_api())
                for uid, worker in self.workers.items()
                if worker.syncing is not None
                for seq, pod in [worker.syncing]
            ],
        )

    def _apply(self, changes: list[Change], seq: int) -> None:
        # New pods are admitted oldest first, as the Go kubelet sorts additions.
        for change in sorted(changes, key=_creation_time):
            self._want(change.uid, change.pod, seq)

    def _want(self, uid: str, pod: Pod | None, seq: int) -> None:
        worker = self.workers.get(uid)
        if worker is None:
            assert self._nursery is not None, "SyncLoop.handle called before run()"
            worker = PodWorker(uid, self._ctx, self.node_pods)
            # Only a worker makes objects of its UID: a UID the runtime has not shown since it
            # was listed, and no worker had, has nothing there.
            worker.known_absent = (self.last_relist_ok is not None and uid not in self._gone
                                   and uid not in self._unowned)
            self.workers[uid] = worker
            self._gone.discard(uid)
            self._unowned.discard(uid)
            if pod is not None:
                worker.rejection = self._admit(uid, pod, seq)
            self._nursery.start_soon(self._run_worker, worker)
        worker.pod = pod
        worker.spec_seq = seq if pod is not None else -1
        if pod is not None:
            self._probes.set_pod(pod)
        else:
            self._probes.remove_pod(uid)
        worker.wake()

    def _admit(self, uid: str, pod: Pod, seq: int) -> Rejection | None:
        """Check a new pod against the pods already admitted; record and report a refusal."""
        admitted = {
            other: (worker.spec_seq, admitted_pod)
            for other, worker in self.workers.items()
            if other != uid and (admitted_pod := worker.admitted_pod) is not None
        }
        rejection = Admission.decide(
            self._ctx.recorder, uid, pod, seq, admitted, self._ctx.node.allocatable or {},
            allowed_unsafe_sysctls=self._allowed_unsafe_sysctls,
            node_conditions=list(self.node_conditions()),
        )
        if rejection is not None:
            log.warning(
                "Rejected pod %s (%s): %s: %s",
                pod.full_name,
                uid,
                rejection.reason,
                rejection.message,
            )
            self._ctx.events.pod_event(pod, "Warning", rejection.reason, rejection.message)
        return rejection

    def node_pods(self) -> list[Pod]:
        """The pods on the node, as their workers last published them (the QoS tiers' input)."""
        return [pod for worker in self.workers.values() if (pod := worker.published) is not None]

    def active_pods(self) -> list[Pod]:
        """The pods admitted and not finished: what eviction may choose from."""
        return [pod for worker in self.workers.values() if (pod := worker.admitted_pod)]

    def spec_seq(self, uid: str) -> int:
        """The seq of the event that set the pod's spec (-1: unknown), for recordings."""
        worker = self.workers.get(uid)
        return worker.spec_seq if worker is not None else -1

    def _evict(self, event: EvictPod) -> None:
        """Have the pod's worker kill it and mark it Failed; a pod that is no longer active
        here (gone, refused or finished since the eviction chose it) is left alone."""
        worker = self.workers.get(event.pod_uid)
        if worker is None or worker.admitted_pod is None:
            log.info("Not evicting pod %s: no longer active", event.pod_uid)
            return
        worker.evict(event.message, event.grace, event.reason)

    async def _run_worker(self, worker: PodWorker) -> None:
        try:
            await worker.run()
        finally:
            del self.workers[worker.uid]
            self._gone.add(worker.uid)
            self._probes.remove_pod(worker.uid)
            self._ctx.probe_results.remove_pod(worker.uid)


def _creation_time(change: Change) -> str:
    # RFC 3339 timestamps in UTC sort as strings; removals and unstamped pods go first.
    return (change.pod.metadata.creation_timestamp or "") if change.pod is not None else ""
