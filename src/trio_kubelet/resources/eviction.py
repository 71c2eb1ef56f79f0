"""The eviction manager: every 10 s, compare the node's figures with the eviction thresholds.

A shell around `core.eviction`: it takes the sampler's latest sample, lets the core
decide which thresholds are met and which pressure conditions the node reports, asks
for node-level reclaim first when the starved resource is disk (image and container
GC, through an optional `NodeReclaimer`), and otherwise evicts at most one pod per
round, through the sync loop, which has the pod's worker kill it and mark it
Failed/Evicted. Before the thresholds, with localStorageCapacityIsolation (the
default), every pod past one of its own local storage limits is evicted, and the
round ends there. After an eviction it waits (up to 30 s) for the pods to stop before
looking again, as the Go kubelet does, and then only at a sample taken after that.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import NoReturn, Protocol

import trio

from trio_kubelet.config import ConfigError, KubeletConfiguration
from trio_kubelet.core.eviction import (
    DISK_PRESSURE,
    HARD_EVICTION_GRACE_SECONDS,
    MEMORY_PRESSURE,
    MONITORING_INTERVAL,
    PID_PRESSURE,
    POD_CLEANUP_TIMEOUT,
    REASON_EVICTED,
    REASON_THRESHOLD_MET,
    Assessment,
    EvictionState,
    Observation,
    Threshold,
    ThresholdError,
    dedicated_image_fs,
    has_storage_limits,
    node_reclaim_applies,
    observe,
    parse_thresholds,
    pod_usage,
    rank_pods,
    storage_usage,
    thresholds_met,
)
from trio_kubelet.core.stats import Sample
from trio_kubelet.events import Event, EvictPod, NodeConditions
from trio_kubelet.kube_events import EventRecorder
from trio_kubelet.metrics import AgentMetrics
from trio_kubelet.model.pod import Pod
from trio_kubelet.recording.node_decisions import Assess, Evict, StorageEviction
from trio_kubelet.recording.recorder import Recorder

__all__ = ["EvictionConfig", "EvictionManager", "EvictionPods", "NodeReclaimer", "NodeReclaimers"]

log = logging.getLogger("trio_kubelet.eviction")

# How often the wait for an evicted pod looks whether it has stopped, and the wait for a
# sample taken after node-level reclaim whether the sampler has ticked.
_CLEANUP_POLL = 1.0
_SAMPLE_POLL = 0.5


class NodeReclaimer(Protocol):
    """Node-level reclaim for a disk signal: remove dead containers and unused images."""

    async def reclaim(self, signal: str) -> None: ...


class NodeReclaimers:
    """Several reclaimers as one, asked in turn (Go: container GC, then image GC)."""

    def __init__(self, *reclaimers: NodeReclaimer) -> None:
        self._reclaimers = reclaimers

    async def reclaim(self, signal: str) -> None:
        for reclaimer in self._reclaimers:
            try:
                await reclaimer.reclaim(signal)
            except Exception:  # the next one may still free enough
                log.exception("Eviction manager: node-level reclaim for %s failed", signal)


class EvictionPods(Protocol):
    """The pods eviction chooses from, as the sync loop has them."""

    def active_pods(self) -> list[Pod]: ...

    def spec_seq(self, uid: str) -> int: ...


@dataclass(frozen=True)
class EvictionConfig:
    """The eviction settings of a KubeletConfiguration, parsed once."""

    thresholds: tuple[Threshold, ...]
    transition_period: float = 300.0
    max_pod_grace_period: int = 0
    monitoring_interval: float = MONITORING_INTERVAL
    # The kubepods memory limit, for allocatableMemory.available; None: not observed.
    pods_memory_limit: int | None = None
    # Evict pods past their own local storage limits (emptyDir sizeLimit, ephemeral-storage).
    local_storage_capacity_isolation: bool = True

    @classmethod
    def from_config(
        cls,
        config: KubeletConfiguration,
        *,
        pods_memory_limit: int | None = None,
        monitoring_interval: float = MONITORING_INTERVAL,
    ) -> EvictionConfig:
        """Raises `ConfigError` naming the field of a threshold that cannot be used."""
        try:
            thresholds = parse_thresholds(
                config.eviction_hard,
                config.eviction_soft,
                config.eviction_soft_grace_period,
                config.eviction_minimum_reclaim,
                enforce_pods_allocatable=(
                    config.cgroups_per_qos and "pods" in config.enforce_node_allocatable
                ),
            )
        except ThresholdError as err:
            raise ConfigError(str(err)) from None
        return cls(
            thresholds=thresholds,
            transition_period=config.eviction_pressure_transition_period,
            max_pod_grace_period=config.eviction_max_pod_grace_period,
            monitoring_interval=monitoring_interval,
            pods_memory_limit=pods_memory_limit,
            local_storage_capacity_isolation=config.local_storage_capacity_isolation,
        )


class EvictionManager:
    """Watches the node's signals, reports pressure, and evicts pods when a threshold is met.

    ``latest_sample`` is the sampler's newest sample (None before the first);
    ``refresh`` takes a new one at once, to see what node-level reclaim achieved (without
    it, the manager waits for the sampler's next tick).
    ``stopped`` says whether a pod has nothing running any more.
    """

    def __init__(
        self,
        config: EvictionConfig,
        pods: EvictionPods,
        latest_sample: Callable[[], Sample | None],
        send: Callable[[Event], Awaitable[None]],
        *,
        wall_clock: Callable[[], float],
        stopped: Callable[[str], bool],
        events: EventRecorder | None = None,
        metrics: AgentMetrics | None = None,
        reclaimer: NodeReclaimer | None = None,
        refresh: Callable[[], Awaitable[Sample]] | None = None,
        recorder: Recorder | None = None,
    ) -> None:
        self.config = config
        self.state = EvictionState()
        self.conditions: tuple[str, ...] = ()
        self.rounds = 0
        # Wall time the last evicted pod was seen stopped: a sample older than that still
        # counts what the pod used, and must not drive the next eviction.
        self._settled_at = -math.inf
        self._pods = pods
        self._latest_sample = latest_sample
        self._wall_clock = wall_clock
        self._stopped = stopped
        self._events = events if events is not None else EventRecorder()
        self._metrics = metrics
        self._send = send
        self._reclaimer = reclaimer
        self._refresh = refresh
        self._recorder = recorder

    # -- what the rest of the agent reads ---------------------------------------------------

    def node_conditions(self) -> tuple[str, ...]:
        """The pressure conditions reported now (admission and the node status read them)."""
        return self.conditions

    def memory_pressure(self) -> bool:
        return MEMORY_PRESSURE in self.conditions

    def disk_pressure(self) -> bool:
        return DISK_PRESSURE in self.conditions

    def pid_pressure(self) -> bool:
        return PID_PRESSURE in self.conditions

    # -- the loop ---------------------------------------------------------------------------

    async def run(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> NoReturn:
        """A round every monitoring interval; after an eviction, the next once the pods stopped."""
        log.info(
            "Eviction manager started: %d threshold(s), every %.0fs",
            len(self.config.thresholds),
            self.config.monitoring_interval,
        )
        task_status.started()
        while True:
            try:
                evicted = await self.synchronize()
            except Exception:  # a bad round must not end the node's protection
                log.exception("Eviction manager: round failed")
                evicted = ()
            if evicted:
                await self._wait_for_cleanup(evicted)
            else:
                await trio.sleep(self.config.monitoring_interval)

    async def synchronize(self) -> tuple[str, ...]:
        """One round; the UIDs of the pods evicted (one for a threshold, or each pod past
        its own local storage limits)."""
        sample = self._latest_sample()
        config = self.config
        if sample is None or sample.timestamp <= self._settled_at:
            return ()
        if not config.thresholds and not config.local_storage_capacity_isolation:
            return ()
        self.rounds += 1
        observations = observe(sample, pods_memory_limit=config.pods_memory_limit)
        now = self._wall_clock()
        assessment = Assess.decide(
            self._recorder, config.thresholds, observations, self.state, now=now,
            transition_period=config.transition_period, conditions=self.conditions,
        )
        await self._update_conditions(assessment.conditions)
        self.state = assessment.state
        dedicated = dedicated_image_fs(sample)
        if config.local_storage_capacity_isolation:
            overrun = await self._evict_storage_overruns(sample, dedicated=dedicated)
            if overrun:
                return overrun
        threshold, resource = assessment.threshold, assessment.resource
        if threshold is None or resource is None:
            return ()
        log.info("Eviction manager: attempting to reclaim %s (%s)", resource, threshold.signal)
        self._events.node_event(
            self._events.node_name, "Warning", REASON_THRESHOLD_MET,
            f"Attempting to reclaim {resource}",
        )
        if await self._reclaim_node_level(threshold, dedicated=dedicated):
            log.info("Eviction manager: reduced %s pressure without evicting pods", resource)
            return ()
        victim = await self._evict_one(sample, assessment, observations, dedicated=dedicated)
        return () if victim is None else (victim,)

    async def _evict(self, pod: Pod, message: str, grace: int) -> None:
        """Hand the pod to the sync loop to kill and mark Failed (Evicted)."""
        await self._send(EvictPod(pod_uid=pod.metadata.uid, message=message, grace=grace,
                                  reason=REASON_EVICTED))
        self._events.pod_event(pod, "Warning", REASON_EVICTED, message)

    async def _evict_storage_overruns(self, sample: Sample, *, dedicated: bool) -> tuple[str, ...]:
        """Evict every pod past its own local storage limits, at once (Go's grace: 1 s)."""
        pods = [p for p in self._pods.active_pods() if has_storage_limits(p)]
        if not pods:
            return ()
        usage = storage_usage(sample, {p.metadata.uid for p in pods})
        overruns = StorageEviction.decide(self._recorder, pods, usage,
                                          spec_seq=self._pods.spec_seq,
                                          dedicated_image_fs=dedicated)
        evicted = []
        for overrun in overruns:
            pod, uid = overrun.pod, overrun.pod.metadata.uid
            await self._evict(pod, overrun.message, HARD_EVICTION_GRACE_SECONDS)
            log.info("Eviction manager: evicting pod %s (%s): %s", pod.full_name, uid,
                     overrun.message)
            if self._metrics is not None:
                self._metrics.evictions.labels(overrun.limit).inc()
            evicted.append(uid)
        return tuple(evicted)

    async def _update_conditions(self, conditions: tuple[str, ...]) -> None:
        """Keep the conditions for the node status; tell admission (the sync loop) a change."""
        if conditions == self.conditions:
            return
        log.info(
            "Eviction manager: node conditions now %s (were %s)",
            list(conditions) or "none",
            list(self.conditions) or "none",
        )
        self.conditions = conditions
        await self._send(NodeConditions(source="eviction", conditions=list(conditions)))

    async def _reclaim_node_level(self, threshold: Threshold, *, dedicated: bool) -> bool:
        """Image and container GC for disk signals; True when that resolved every threshold."""
        if self._reclaimer is None or not node_reclaim_applies(
            threshold.signal, dedicated_image_fs=dedicated
        ):
            return False
        try:
            await self._reclaimer.reclaim(threshold.signal)
        except Exception:
            log.exception("Eviction manager: node-level reclaim for %s failed", threshold.signal)
        sample = await self._sample_after(self._wall_clock())
        if sample is None:
            return False
        observations = observe(sample, pods_memory_limit=self.config.pods_memory_limit)
        return not thresholds_met(self.config.thresholds, observations, min_reclaim=True)

    async def _sample_after(self, when: float) -> Sample | None:
        """A sample taken after ``when``: ``refresh``'s, or the sampler's next one (None if
        none comes within two intervals)."""
        if self._refresh is not None:
            return await self._refresh()
        with trio.move_on_after(2 * self.config.monitoring_interval):
            while True:
                sample = self._latest_sample()
                if sample is not None and sample.timestamp > when:
                    return sample
                await trio.sleep(_SAMPLE_POLL)
        return None

    async def _evict_one(
        self,
        sample: Sample,
        assessment: Assessment,
        observations: dict[str, Observation],
        *,
        dedicated: bool,
    ) -> str | None:
        threshold = assessment.threshold
        assert threshold is not None
        pods = self._pods.active_pods()
        if not pods:
            log.error("Eviction manager: thresholds met, but no pods are active to evict")
            return None
        usage = pod_usage(sample)
        log.info(
            "Eviction manager: pods ranked for eviction: %s",
            ", ".join(
                p.full_name
                for p in rank_pods(threshold.signal, pods, usage, dedicated_image_fs=dedicated)
            ),
        )
        victim = Evict.decide(
            self._recorder, assessment.actionable, observations, pods, usage,
            spec_seq=self._pods.spec_seq, dedicated_image_fs=dedicated,
            max_pod_grace_period=self.config.max_pod_grace_period,
        )
        if victim is None:
            log.info("Eviction manager: unable to evict any pods from the node")
            return None
        pod, uid = victim.pod, victim.pod.metadata.uid
        await self._evict(pod, victim.message, victim.grace)
        log.info(
            "Eviction manager: evicting pod %s (%s) with %ds grace: %s",
            pod.full_name, uid, victim.grace, victim.message,
        )
        if self._metrics is not None:
            self._metrics.evictions.labels(threshold.signal).inc()
        return uid

    async def _wait_for_cleanup(self, uids: tuple[str, ...]) -> None:
        """Until the evicted pods have nothing running, at most 30 s (Go's podCleanupTimeout)."""
        await trio.lowlevel.checkpoint()  # never a round after round without yielding
        with trio.move_on_after(POD_CLEANUP_TIMEOUT) as waited:
            while not all(self._stopped(uid) for uid in uids):
                await trio.sleep(_CLEANUP_POLL)
            log.info("Eviction manager: evicted pods %s are stopped", ", ".join(uids))
        if waited.cancelled_caught:
            log.warning("Eviction manager: evicted pods %s have not all stopped after %.0fs",
                        ", ".join(uids), POD_CLEANUP_TIMEOUT)
        self._settled_at = self._wall_clock()
