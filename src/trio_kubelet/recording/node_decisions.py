"""The node-wide decision kinds: the eviction manager's verdict and choices, the GC passes and
container log rotations.

Each kind is the one place that says how the shell records it (the wrapper the eviction
manager or a garbage collector calls instead of the bare pure function), how replay
re-decides the record, and how the trace explains it (a ``(node)`` line, or the evicted pod's).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import trio

from trio_kubelet.core.container_gc import (
    GCContainer,
    GCPlan,
    GCPolicy,
    GCSandbox,
    log_dir_pod_uid,
    plan_container_gc,
)
from trio_kubelet.core.eviction import (
    Assessment,
    EvictionState,
    Observation,
    PodUsage,
    StorageOverrun,
    StorageUsage,
    Threshold,
    Victim,
    assess,
    choose_victim,
    storage_overruns,
)
from trio_kubelet.core.image_gc import (
    NEVER,
    ImageFs,
    ImageRecord,
    bytes_to_free,
    choose_for_space,
    eviction_order,
    expired_images,
)
from trio_kubelet.core.log_rotation import RotationPlan, RotationPolicy, plan_rotation
from trio_kubelet.core.observed import ContainerState, SandboxState
from trio_kubelet.model.pod import Pod
from trio_kubelet.recording.kinds import BadRecord, DecisionKind, Replay
from trio_kubelet.recording.recorder import Recorder
from trio_kubelet.recording.records import (
    AssessRecord,
    ContainerGCRecord,
    EvictionRecord,
    ImageGCRecord,
    LogRotationRecord,
    StorageEvictionRecord,
)

NODE = "(node)"  # how the trace names a node-wide decision


class Assess(DecisionKind[AssessRecord]):
    """An eviction round's verdict (``core.eviction.assess``): conditions, thresholds to act on."""

    record = AssessRecord

    @staticmethod
    def decide(
        recorder: Recorder | None, thresholds: Sequence[Threshold],
        observations: Mapping[str, Observation], state: EvictionState, *, now: float,
        transition_period: float, conditions: tuple[str, ...],
    ) -> Assessment:
        """``assess``; recorded when its verdict matters: the node's ``conditions`` change,
        or a threshold is actionable."""
        verdict = assess(thresholds, observations, state, now=now,
                         transition_period=transition_period)
        if recorder is None or (verdict.conditions == conditions and not verdict.actionable):
            return verdict
        t = trio.current_time()
        recorder.add(lambda: AssessRecord(
            t=t, now=now, observations=_observation_rows(observations),
            first_observed=[(th.signal, th.hard, at) for th, at in state.first_observed.items()],
            condition_seen=dict(state.condition_seen),
            met=[(th.signal, th.hard) for th in state.met],
            last_observations=_observation_rows(state.observations),
            conditions=list(verdict.conditions),
            actionable=[(th.signal, th.hard) for th in verdict.actionable],
        ))
        return verdict

    @classmethod
    def replay(cls, replay: Replay, record: AssessRecord) -> None:
        """Re-decide an eviction round's verdict from the figures and the state it began with."""
        if not replay.shows(None):
            return
        named = _named(replay)
        try:
            state = EvictionState(
                first_observed={named[(signal, hard)]: at
                                for signal, hard, at in record.first_observed},
                condition_seen=dict(record.condition_seen),
                met=tuple(named[key] for key in record.met),
                observations={s: Observation(*o) for s, o in record.last_observations.items()},
            )
        except KeyError as err:
            raise BadRecord(f"assess: a threshold the configuration does not have: {err}") from None
        verdict = assess(
            replay.thresholds(),
            {signal: Observation(*o) for signal, o in record.observations.items()},
            state,
            now=record.now,
            transition_period=replay.transition_period(),
        )
        recorded = {"conditions": record.conditions,
                    "actionable": [list(key) for key in record.actionable]}
        replayed = {"conditions": list(verdict.conditions),
                    "actionable": [[th.signal, th.hard] for th in verdict.actionable]}
        diverged = cls.compare(replay, NODE,
                               "the replayed eviction verdict differs from the recorded one",
                               recorded, replayed)
        acting = ", ".join(th.signal for th in verdict.actionable) or "nothing"
        summary = f"pressure: {', '.join(verdict.conditions) or 'none'}; act on {acting}"
        replay.trace(NODE, "", summary, diverged=diverged)


class Evict(DecisionKind[EvictionRecord]):
    """The pod a round evicts for its most urgent threshold (``core.eviction.choose_victim``)."""

    record = EvictionRecord

    @staticmethod
    def decide(
        recorder: Recorder | None, actionable: Sequence[Threshold],
        observations: Mapping[str, Observation], pods: Sequence[Pod],
        usage: Mapping[str, PodUsage], *, spec_seq: Callable[[str], int],
        dedicated_image_fs: bool, max_pod_grace_period: int,
    ) -> Victim | None:
        """``choose_victim`` for ``actionable[0]``; ``spec_seq`` gives a pod's spec version
        (the seq of the event that set it), as records name pods."""
        victim = choose_victim(
            actionable[0], actionable, observations, pods, usage,
            dedicated_image_fs=dedicated_image_fs, max_pod_grace_period=max_pod_grace_period,
        )
        if recorder is not None:
            t, candidates = trio.current_time(), _spec_seqs(pods, spec_seq)
            recorder.add(lambda: EvictionRecord(
                t=t,
                actionable=[(th.signal, th.hard) for th in actionable],
                observations=_observation_rows(observations),
                dedicated_image_fs=dedicated_image_fs,
                candidates=candidates,
                usage={uid: dataclasses.asdict(u) for uid, u in usage.items() if uid in candidates},
                uid=victim.pod.metadata.uid if victim else None,
                message=victim.message if victim else None,
                grace=victim.grace if victim else None,
            ))
        return victim

    @classmethod
    def replay(cls, replay: Replay, record: EvictionRecord) -> None:
        """Re-choose the evicted pod from the recorded figures and the pods' spec versions."""
        replay.count("evictions")
        recorded = {"uid": record.uid, "message": record.message, "grace": record.grace}
        pods = _candidates(replay, record.candidates, recorded)
        if pods is None:
            return
        named = _named(replay)
        try:
            actionable = [named[(signal, hard)] for signal, hard in record.actionable]
            usage = {uid: PodUsage(**fields) for uid, fields in record.usage.items()}
        except (KeyError, TypeError) as err:
            raise BadRecord(
                f"a threshold or pod usage the configuration does not explain: {err}") from None
        if not actionable:
            raise BadRecord("actionable: no threshold")
        observations = {
            signal: Observation(*figures) for signal, figures in record.observations.items()
        }
        victim = choose_victim(
            actionable[0], actionable, observations, pods, usage,
            dedicated_image_fs=record.dedicated_image_fs,
            max_pod_grace_period=int(replay.config().get("evictionMaxPodGracePeriod") or 0),
            refused=record.refused,
        )
        replayed = {
            "uid": victim.pod.metadata.uid if victim else None,
            "message": victim.message if victim else None,
            "grace": victim.grace if victim else None,
        }
        pod = victim.pod.full_name if victim else "(none)"
        diverged = cls.compare(replay, pod, "the replayed eviction differs from the recorded one",
                               recorded, replayed)
        summary = f"evict ({actionable[0].signal}): {victim.message}" if victim else "evict none"
        uid = victim.pod.metadata.uid if victim else ""
        replay.trace(pod, uid, summary, diverged=diverged)


class StorageEviction(DecisionKind[StorageEvictionRecord]):
    """The pods past their own local storage limits (``core.eviction.storage_overruns``)."""

    record = StorageEvictionRecord

    @staticmethod
    def decide(
        recorder: Recorder | None, pods: Sequence[Pod], usage: Mapping[str, StorageUsage], *,
        spec_seq: Callable[[str], int], dedicated_image_fs: bool,
    ) -> list[StorageOverrun]:
        """``storage_overruns``; recorded when it finds any."""
        overruns = storage_overruns(pods, usage, dedicated_image_fs=dedicated_image_fs)
        if overruns and recorder is not None:
            t, candidates = trio.current_time(), _spec_seqs(pods, spec_seq)
            recorder.add(lambda: StorageEvictionRecord(
                t=t,
                dedicated_image_fs=dedicated_image_fs,
                candidates=candidates,
                usage={uid: dataclasses.asdict(u) for uid, u in usage.items()
                       if uid in candidates},
                overruns=[(o.pod.metadata.uid, o.limit, o.message) for o in overruns],
            ))
        return overruns

    @classmethod
    def replay(cls, replay: Replay, record: StorageEvictionRecord) -> None:
        """Re-check the pods' local storage limits from the recorded figures and specs."""
        replay.count("evictions", len(record.overruns) - len(record.refused))
        recorded = {"overruns": [list(row) for row in record.overruns]}
        pods = _candidates(replay, record.candidates, recorded)
        if pods is None:
            return
        try:
            usage = {uid: StorageUsage(**fields) for uid, fields in record.usage.items()}
        except TypeError as err:
            raise BadRecord(f"storage_eviction: usage: {err}") from None
        overruns = storage_overruns(pods, usage, dedicated_image_fs=record.dedicated_image_fs)
        replayed = {"overruns": [[o.pod.metadata.uid, o.limit, o.message] for o in overruns]}
        diverged = cls.compare(replay, overruns[0].pod.full_name if overruns else "(none)",
                               "the replayed local storage check differs from the recorded one",
                               recorded, replayed)
        for overrun in overruns:
            pod = overrun.pod
            replay.trace(pod.full_name, pod.metadata.uid,
                         f"evict ({overrun.limit}): {overrun.message}", diverged=diverged)


class ContainerGCPass(DecisionKind[ContainerGCRecord]):
    """What a container GC pass removes (``core.container_gc.plan_container_gc``)."""

    record = ContainerGCRecord

    @staticmethod
    def decide(
        recorder: Recorder | None, containers: Sequence[GCContainer],
        sandboxes: Sequence[GCSandbox], *, policy: GCPolicy, now: float,
        existing_pods: Collection[str], sources_ready: bool, log_dirs: Sequence[str],
    ) -> GCPlan:
        """``plan_container_gc``; a plan that removes something is recorded."""
        plan = plan_container_gc(
            containers, sandboxes, policy=policy, now=now, existing_pods=existing_pods,
            sources_ready=sources_ready, log_dirs=log_dirs,
        )
        if recorder is None or not (plan.containers or plan.sandboxes or plan.log_dirs):
            return plan
        t = trio.current_time()
        mentioned = ({c.pod_uid for c in containers} | {s.pod_uid for s in sandboxes}
                     | {log_dir_pod_uid(name) for name in log_dirs})
        existing = sorted(uid for uid in mentioned if uid in existing_pods)  # it changes later
        recorder.add(lambda: ContainerGCRecord(
            t=t,
            now=now,
            policy=(policy.min_age, policy.max_per_pod_container, policy.max_containers),
            sources_ready=sources_ready,
            containers=[
                (c.id, c.pod_uid, c.name, c.state.value, c.created_at, c.attempt,
                 c.sandbox_id, c.log_path)
                for c in containers
            ],
            sandboxes=[(s.id, s.pod_uid, s.state.value, s.created_at, s.attempt)
                       for s in sandboxes],
            log_dirs=list(log_dirs),
            existing_pods=existing,
            removed_containers=[c.id for c in plan.containers],
            removed_sandboxes=[s.id for s in plan.sandboxes],
            removed_log_dirs=list(plan.log_dirs),
        ))
        return plan

    @classmethod
    def replay(cls, replay: Replay, record: ContainerGCRecord) -> None:
        """Re-plan a container GC pass from the runtime's containers and sandboxes it saw."""
        if not replay.shows(None):
            return
        replay.count("gc_passes")
        try:
            containers = [
                GCContainer(cid, uid, name, ContainerState(state), created, attempt, sandbox, log)
                for cid, uid, name, state, created, attempt, sandbox, log in record.containers
            ]
            sandboxes = [
                GCSandbox(sid, uid, SandboxState(state), created, attempt)
                for sid, uid, state, created, attempt in record.sandboxes
            ]
        except ValueError as err:
            raise BadRecord(f"container_gc: {err}") from None
        min_age, per_container, total = record.policy
        plan = plan_container_gc(
            containers,
            sandboxes,
            policy=GCPolicy(min_age, per_container, total),
            now=record.now,
            existing_pods=frozenset(record.existing_pods),
            sources_ready=record.sources_ready,
            log_dirs=record.log_dirs,
        )
        recorded = {
            "containers": record.removed_containers,
            "sandboxes": record.removed_sandboxes,
            "log_dirs": record.removed_log_dirs,
        }
        replayed = {
            "containers": [c.id for c in plan.containers],
            "sandboxes": [s.id for s in plan.sandboxes],
            "log_dirs": list(plan.log_dirs),
        }
        summary = (
            f"container GC: remove {len(plan.containers)} containers, "
            f"{len(plan.sandboxes)} sandboxes, {len(plan.log_dirs)} pod log directories"
        )
        diverged = cls.compare(replay, NODE,
                               "the replayed container GC plan differs from the recorded one",
                               recorded, replayed)
        replay.trace(NODE, "", summary, diverged=diverged)


class ImageGCPass(DecisionKind[ImageGCRecord]):
    """What an image GC pass removes, for age and for space (``core.image_gc``).

    A pass decides in steps with removals between them, so the image collector calls
    `recorded` with the pass's choices once it has made them.
    """

    record = ImageGCRecord

    @staticmethod
    def recorded(
        recorder: Recorder | None, *, now: float, started_at: float,
        detected: Sequence[ImageRecord], in_use: Collection[str], image_fs: ImageFs | None,
        expired: Sequence[ImageRecord], removed_by_age: Sequence[ImageRecord],
        removals: Sequence[ImageRecord],
    ) -> None:
        """Record a pass's choices with their inputs: ``detected`` are the per-image records
        as the pass detected them; ``image_fs`` None for the eviction manager's reclaim."""
        if recorder is None:
            return
        record = ImageGCRecord(
            t=trio.current_time(),
            now=now,
            started_at=started_at,
            images=[(r.id, r.size, r.pinned, _time_or_none(r.first_detected),
                     _time_or_none(r.last_used)) for r in detected],
            in_use=sorted(in_use),
            image_fs=(image_fs.capacity_bytes, image_fs.available_bytes) if image_fs else None,
            expired=[r.id for r in expired],
            removed_by_age=[r.id for r in removed_by_age],
            removals=[r.id for r in removals],
        )
        recorder.add(lambda: record)  # built now: the records change as removals finish

    @classmethod
    def replay(cls, replay: Replay, record: ImageGCRecord) -> None:
        """Re-choose an image GC pass's removals, by age and for space, from its records."""
        if not replay.shows(None):
            return
        replay.count("gc_passes")
        policy = replay.image_gc_policy()
        in_use = frozenset(record.in_use)
        images = [
            ImageRecord(image_id, size, pinned, NEVER if first is None else first,
                        NEVER if last is None else last)
            for image_id, size, pinned, first, last in record.images
        ]
        order = eviction_order(images, in_use)
        expired: list[ImageRecord] = []
        if record.image_fs is None:  # the eviction manager's reclaim: all it can, no ages
            removals = choose_for_space(order, math.inf, record.now, policy).removals
        else:
            expired = expired_images(order, record.now, policy, record.started_at)
            gone = set(record.removed_by_age)
            needed = bytes_to_free(ImageFs(*record.image_fs), policy)
            rest = [r for r in order if r.id not in gone]
            removals = choose_for_space(rest, needed, record.now, policy).removals if needed else ()
        recorded = {"expired": record.expired, "removals": record.removals}
        replayed = {"expired": [r.id for r in expired], "removals": [r.id for r in removals]}
        summary = f"image GC: remove {len(expired)} for age, {len(removals)} for space"
        diverged = cls.compare(replay, NODE,
                               "the replayed image GC choice differs from the recorded one",
                               recorded, replayed)
        replay.trace(NODE, "", summary, diverged=diverged)


class LogRotation(DecisionKind[LogRotationRecord]):
    """What rotating one container log removes, compresses and renames
    (``core.log_rotation.plan_rotation``); only logs at the rotation size are recorded."""

    record = LogRotationRecord

    @staticmethod
    def decide(
        recorder: Recorder | None, log: str, size: int, siblings: Collection[str],
        policy: RotationPolicy, stamp: str,
    ) -> RotationPlan | None:
        """``plan_rotation`` of the log at ``log`` (relative to the pod logs directory); the
        shell asks only for a log at the rotation size, so every answer is recorded."""
        name = log.rsplit("/", 1)[-1]
        plan = plan_rotation(name, size, siblings, policy, stamp)
        if recorder is None:
            return plan
        t = trio.current_time()
        recorder.add(lambda: LogRotationRecord(
            t=t, log=log, size=size, siblings=sorted(siblings),
            policy=(policy.max_size, policy.max_files), stamp=stamp,
            removed=list(plan.remove) if plan else [],
            compressed=list(plan.compress) if plan else [],
            rotate_to=plan.rotate_to if plan else None,
        ))
        return plan

    @classmethod
    def replay(cls, replay: Replay, record: LogRotationRecord) -> None:
        """Re-plan a rotation from the log's size and the names beside it."""
        if not replay.shows(None):
            return
        replay.count("log_rotations")
        name = record.log.rsplit("/", 1)[-1]
        plan = plan_rotation(name, record.size, record.siblings,
                             RotationPolicy(*record.policy), record.stamp)
        removed = list(plan.remove) if plan else []
        compressed = list(plan.compress) if plan else []
        rotate_to = plan.rotate_to if plan else None
        recorded = {"removed": record.removed, "compressed": record.compressed,
                    "rotate_to": record.rotate_to}
        replayed = {"removed": removed, "compressed": compressed, "rotate_to": rotate_to}
        summary = (
            f"log rotation {record.log}: remove {len(removed)}, compress {len(compressed)}, "
            f"rename to {rotate_to}"
            if rotate_to else f"log rotation {record.log}: waits (a file of the new name exists)"
        )
        diverged = cls.compare(replay, NODE,
                               "the replayed log rotation differs from the recorded one",
                               recorded, replayed)
        replay.trace(NODE, "", summary, diverged=diverged)


def _observation_rows(
    observations: Mapping[str, Observation],
) -> dict[str, tuple[int, int, float]]:
    """Observations as records hold them: signal -> [available, capacity, time]."""
    return {signal: (o.available, o.capacity, o.time) for signal, o in observations.items()}


def _time_or_none(moment: float) -> float | None:
    """A record time for JSON: None for ``NEVER`` (minus infinity)."""
    return None if moment == NEVER else moment


def _spec_seqs(pods: Sequence[Pod], spec_seq: Callable[[str], int]) -> dict[str, int]:
    """Each pod's UID -> the seq of the event that set its spec (how records name pods)."""
    return {p.metadata.uid: spec_seq(p.metadata.uid) for p in pods}


def _named(replay: Replay) -> dict[tuple[str, bool], Threshold]:
    """The configuration's thresholds by the [signal, hard] that records name them with."""
    return {(th.signal, th.hard): th for th in replay.thresholds()}


def _candidates(
    replay: Replay, candidates: Mapping[str, int], recorded: Mapping[str, Any]
) -> list[Pod] | None:
    """An eviction round's pods, by the spec versions recorded; None (a divergence) when one
    of them is not in the recording."""
    specs = {uid: replay.spec(uid, seq) for uid, seq in candidates.items()}
    missing = [uid for uid, spec in specs.items() if spec is None]
    if missing:
        replay.diverge(missing[0], f"the spec of pod {missing[0]} is not in the recording",
                       recorded, {})
        return None
    return [spec for spec in specs.values() if spec is not None]
