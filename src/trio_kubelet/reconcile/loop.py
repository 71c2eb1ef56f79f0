"""The sync loop: the one consumer of every source's events, routing work to pod workers.

It merges the pod sets of all sources (the Go kubelet's PodConfig), wakes the
worker of each pod an event concerns, and starts a teardown worker for pods the
runtime holds that no source wants — but only after every source has reported
once, so a restarted agent adopts its pods instead of killing them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import trio

from trio_kubelet.events import Event, PodLifecycleEvent, PodSetUpdate, RelistDone, ResyncTick
from trio_kubelet.model.pod import Pod
from trio_kubelet.reconcile.workers import PodWorker, WorkerContext

log = logging.getLogger("trio_kubelet.sync")


class SyncLoop:
    def __init__(self, ctx: WorkerContext, sources: Iterable[str]) -> None:
        self._ctx = ctx
        self._expected_sources = set(sources)
        self._pod_sets: dict[str, dict[str, Pod]] = {}
        self.workers: dict[str, PodWorker] = {}
        # Pods the runtime reported that no source has claimed (yet).
        self._unclaimed: set[str] = set()
        # Pods whose teardown finished: late PLEG events about them are expected.
        self._gone: set[str] = set()
        self.last_relist_ok: float | None = None
        self._nursery: trio.Nursery | None = None

    @property
    def sources_ready(self) -> bool:
        return self._expected_sources <= self._pod_sets.keys()

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
        if isinstance(event, PodSetUpdate):
            self._apply_pod_set(event)
        elif isinstance(event, PodLifecycleEvent):
            self._on_lifecycle(event)
        elif isinstance(event, RelistDone):
            if event.ok:
                self.last_relist_ok = trio.current_time()
        elif isinstance(event, ResyncTick):
            for worker in self.workers.values():
                worker.wake()

    def desired(self) -> dict[str, Pod]:
        """Every pod some source wants, by UID (first source wins on a UID clash)."""
        merged: dict[str, Pod] = {}
        for pods in self._pod_sets.values():
            for uid, pod in pods.items():
                merged.setdefault(uid, pod)
        return merged

    def _apply_pod_set(self, update: PodSetUpdate) -> None:
        was_ready = self.sources_ready
        old = self._pod_sets.get(update.source, {})
        new = {pod.metadata.uid: pod for pod in update.pods}
        self._pod_sets[update.source] = new
        for uid, pod in new.items():
            if old.get(uid) != pod:
                log.info(
                    "%s pod %s (%s) from source %s",
                    "Updated" if uid in old else "Added",
                    pod.full_name,
                    uid,
                    update.source,
                )
                self._want(uid, pod)
        desired = self.desired()
        for uid in old.keys() - new.keys():
            if uid not in desired:
                log.info(
                    "Removed pod %s (%s) from source %s", old[uid].full_name, uid, update.source
                )
                self._want(uid, None)
        if self.sources_ready and not was_ready:
            log.info("All pod sources are ready")
            for uid in self._unclaimed - desired.keys():
                log.info("Pod %s is on the runtime but in no source: tearing it down", uid)
                self._want(uid, None)
            self._unclaimed.clear()

    def _on_lifecycle(self, event: PodLifecycleEvent) -> None:
        worker = self.workers.get(event.pod_uid)
        if worker is not None:
            worker.wake()
        elif event.pod_uid in self._gone or event.type == "ContainerRemoved":
            return
        elif self.sources_ready:
            self._want(event.pod_uid, None)
        else:
            self._unclaimed.add(event.pod_uid)

    def _want(self, uid: str, pod: Pod | None) -> None:
        worker = self.workers.get(uid)
        if worker is None:
            assert self._nursery is not None, "SyncLoop.handle called before run()"
            worker = PodWorker(uid, self._ctx)
            self.workers[uid] = worker
            self._gone.discard(uid)
            self._nursery.start_soon(self._run_worker, worker)
        worker.pod = pod
        worker.wake()

    async def _run_worker(self, worker: PodWorker) -> None:
        try:
            await worker.run()
        finally:
            del self.workers[worker.uid]
            self._gone.add(worker.uid)
