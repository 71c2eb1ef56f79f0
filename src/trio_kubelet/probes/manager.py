"""Probe workers: one task per (pod, container, probe type), as the Go prober manager.

The sync loop tells the manager which pods it wants (``set_pod``) and which are
gone (``remove_pod``). Each worker ticks every ``periodSeconds``, reads its
container from the pod's published status, lets ``core.probes`` decide, runs the
probe and sends every change of its published result to the reconciler as a
``ProbeResultEvent``. A worker also ticks at once when its pod's status shows a
container instance it has not probed yet, so a new container is not kept
waiting a whole period for its first readiness answer.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from trio_kubelet.core.container_ids import runtime_id
from trio_kubelet.core.observed import ProbeResult
from trio_kubelet.core.probes import (
    Next,
    ProbeType,
    ProbeWorkerState,
    Tick,
    after_probe,
    before_probe,
    initial_jitter,
    next_tick,
    probe_view,
    probed_containers,
)
from trio_kubelet.events import Event, ProbeResultEvent
from trio_kubelet.kube_events import EventRecorder
from trio_kubelet.metrics import AgentMetrics
from trio_kubelet.model.pod import Container, Pod, Probe
from trio_kubelet.probes.prober import ProbeError, Prober
from trio_kubelet.status.store import PodStatusStore

log = logging.getLogger("trio_kubelet.probes")

_METRIC_RESULT = {
    ProbeResult.SUCCESS: "successful",
    ProbeResult.FAILURE: "failed",
    ProbeResult.UNKNOWN: "unknown",
}


@dataclass(eq=False)
class _Worker:
    uid: str
    container: Container
    probe_type: ProbeType
    probe: Probe
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    wake: trio.Event = field(default_factory=trio.Event)
    probed_id: str = ""  # the container instance the last tick looked at

    def trigger(self) -> None:
        self.wake.set()


class ProbeManager:
    def __init__(
        self,
        prober: Prober,
        store: PodStatusStore,
        send: trio.MemorySendChannel[Event],
        *,
        wall_clock: Callable[[], float],
        events: EventRecorder | None = None,
        metrics: AgentMetrics | None = None,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self._prober = prober
        self._store = store
        self._send = send
        self._wall_clock = wall_clock
        self._events = events or EventRecorder()
        self._metrics = metrics
        self._jitter = jitter
        self._pods: dict[str, Pod] = {}
        self._workers: dict[str, list[_Worker]] = {}
        self._nursery: trio.Nursery | None = None
        self._started = 0.0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._started = trio.current_time()
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            with trio.CancelScope(shield=True):
                await self._prober.aclose()

    def set_pod(self, pod: Pod) -> None:
        """Start workers for the pod's probes; a changed probe gets a fresh worker."""
        uid = pod.metadata.uid
        self._pods[uid] = pod
        wanted = probed_containers(pod)
        old = self._workers.get(uid, [])
        keep = [
            w
            for w in old
            if any(
                c.name == w.container.name and t is w.probe_type and p == w.probe
                for c, t, p in wanted
            )
        ]
        for worker in old:
            if worker not in keep:
                worker.scope.cancel()
        workers = list(keep)
        for container, probe_type, probe in wanted:
            if any(w.container.name == container.name and w.probe_type is probe_type
                   for w in keep):
                continue
            worker = _Worker(uid, container, probe_type, probe)
            workers.append(worker)
            assert self._nursery is not None, "ProbeManager.set_pod before run()"
            self._nursery.start_soon(self._work, worker)
        if workers:
            self._workers[uid] = workers
        else:
            self._workers.pop(uid, None)

    def remove_pod(self, uid: str) -> None:
        self._pods.pop(uid, None)
        for worker in self._workers.pop(uid, []):
            worker.scope.cancel()

    def status_changed(self, uid: str) -> None:
        """The pod's published status changed: workers facing a new instance tick now, and so
        do readiness workers of a started container that is not ready (as Go's
        UpdatePodStatus: the startup probe may just have passed; readiness is not left to wait
        for its next period)."""
        workers = self._workers.get(uid)
        if not workers:
            return
        pod = self._store.get(uid)
        if pod is None:
            return
        running = {
            s.name: s
            for s in (*pod.status.init_container_statuses, *pod.status.container_statuses)
            if s.state.running is not None and s.container_id
        }
        for worker in workers:
            status = running.get(worker.container.name)
            if status is None:
                continue
            if runtime_id(status.container_id) != worker.probed_id or (
                worker.probe_type is ProbeType.READINESS and status.started and not status.ready
            ):
                worker.trigger()

    # -- one worker ---------------------------------------------------------------------------

    async def _work(self, worker: _Worker) -> None:
        state = ProbeWorkerState()
        published: ProbeResult | None = None
        period = float(worker.probe.period_seconds)
        with worker.scope:
            await trio.sleep(
                initial_jitter(period, trio.current_time() - self._started, self._jitter())
            )
            tick_at = trio.current_time()
            while True:
                state, published, go_on = await self._tick(worker, state, published)
                if not go_on:
                    return
                tick_at = next_tick(tick_at, trio.current_time(), period)
                with trio.move_on_at(tick_at):
                    await worker.wake.wait()
                worker.wake = trio.Event()

    async def _tick(
        self, worker: _Worker, state: ProbeWorkerState, published: ProbeResult | None
    ) -> tuple[ProbeWorkerState, ProbeResult | None, bool]:
        pod = self._pods.get(worker.uid)
        current = self._store.get(worker.uid)
        if pod is None or current is None:
            return state, published, True  # no status published yet
        view = probe_view(pod, current.status, worker.container)
        worker.probed_id = view.container_id if view.running else ""
        tick = before_probe(worker.probe_type, worker.probe, state, view, self._wall_clock())
        published = await self._publish(worker, tick, published)
        if tick.next is not Next.PROBE:
            return tick.state, published, tick.next is Next.WAIT
        result = await self._run_probe(worker, pod, tick.state.container_id, current.status.pod_ip)
        if result is None:
            return tick.state, published, True
        tick = after_probe(worker.probe_type, worker.probe, tick.state, result)
        published = await self._publish(worker, tick, published)
        return tick.state, published, True

    async def _run_probe(
        self, worker: _Worker, pod: Pod, container_id: str, pod_ip: str | None
    ) -> ProbeResult | None:
        """Probe once; None when the probe could not run (the Go worker discards those)."""
        title = worker.probe_type.title
        name = worker.container.name
        started = trio.current_time()
        try:
            outcome = await self._prober.probe(worker.probe, worker.container, container_id,
                                               pod_ip or "")
        except ProbeError as err:
            log.warning("%s probe of container %s in pod %s errored: %s",
                        title, name, pod.full_name, err)
            self._events.pod_event(pod, "Warning", "Unhealthy", f"{title} probe errored: {err}",
                                   name)
            return None
        if outcome.result is ProbeResult.FAILURE:
            log.info("%s probe of container %s in pod %s failed: %s",
                     title, name, pod.full_name, outcome.output.strip())
            self._events.pod_event(pod, "Warning", "Unhealthy",
                                   f"{title} probe failed: {outcome.output}", name)
        elif outcome.warning:
            log.info("%s probe of container %s in pod %s succeeded with a warning: %s",
                     title, name, pod.full_name, outcome.output.strip())
            self._events.pod_event(pod, "Warning", "ProbeWarning",
                                   f"{title} probe warning: {outcome.output}", name)
        if self._metrics is not None:
            meta = pod.metadata
            self._metrics.prober_probe_total.labels(
                title, _METRIC_RESULT[outcome.result], name, meta.name, meta.namespace, meta.uid
            ).inc()
            if outcome.result is ProbeResult.SUCCESS:
                self._metrics.prober_probe_duration.labels(
                    title, name, meta.name, meta.namespace
                ).observe(trio.current_time() - started)
        return outcome.result

    async def _publish(
        self, worker: _Worker, tick: Tick, published: ProbeResult | None
    ) -> ProbeResult | None:
        """Send the tick's result to the reconciler if it differs from the last one sent."""
        if tick.forget:
            published = None
        if tick.publish is None or tick.publish is published:
            return published
        await self._send.send(
            ProbeResultEvent(
                pod_uid=worker.uid,
                container_name=worker.container.name,
                container_id=tick.state.container_id,
                probe=worker.probe_type.value,
                result=tick.publish.value,
                forget=tick.forget,
            )
        )
        return tick.publish

